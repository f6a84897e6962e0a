#!/usr/bin/env bash
# Mutation testing of the areas docs/testing.md ("Mutation testing") names, with cargo-mutants: a
# measurement, rerun by hand, not a CI step.
#
#   bash scripts/mutants.sh AREA [SHARD [cargo-mutants options]]    e.g.  scripts/mutants.sh state 0/20
#   (`--iterate` as an option re-tests only what the last run of that area left uncaught)
#
# AREA is one of: operator (window/operator.rs), identify (identify/), decode (session/decode),
# state (state/: checkpoint and restore), refit (crates/train/src/refit.rs), or all. SHARD (k/n,
# default 0/1: every mutant) takes every n-th mutant, round-robin. Results go to mutants.out/
# (outcomes.json; a caught mutant's log in log/ ends in failing tests).
#
# The baseline is required: the area's tests run first on the unmutated tree with exactly the
# packages, profile flags and filters the mutants get, and the script stops if any fails. Without
# it a tree whose tests fail for an environmental reason (no broker, no python) counts every mutant
# as caught. (cargo-mutants' own baseline is skipped: it builds the package alone, whose features
# unify differently from the workspace's, and would rebuild datafusion.)
set -euo pipefail
cd "$(dirname "$0")/.."

area="${1:?usage: scripts/mutants.sh operator|identify|decode|state|refit|all [k/n [options]]}"
shard="${2:-0/1}"
shift $(( $# < 2 ? $# : 2 ))
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/ultr-ci-target}"
export CARGO_INCREMENTAL=1 CARGO_PROFILE_BENCH_OPT_LEVEL=1
# Without clippy's denied lints: a mutant that only draws a lint (an unused value) is a mutant to
# test, not an unviable one.
unset RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS
export ULTR_PYTHON="${ULTR_PYTHON:-$HOME/.cache/ultr/venv/bin/python}"

# The package mutated (the root package is `ultr`, which cargo-mutants would mutate by default).
mutate=ultr-core
# Per area: the files mutated (given here, they replace the config's examine_globs), the packages
# whose tests run (likewise replacing its test_package), the test targets and the test-name
# filters (unit tests of the area, and the laboratory tests that exercise it). The libraries' unit
# tests run in the laboratory too (`units::ultr_core::…`, `units::ultr_train::…`: the libraries have
# no unit-test build, docs/testing.md), so `ultr` is the one package tested; the `tests` modules
# they live in carry `mutants::skip`.
case "$area" in
  operator) files=(crates/core/src/window/operator.rs); packages=(ultr)
            filters=(windows:: window:: cumulative:: ingest) ;;
  identify) files=("crates/core/src/identify/**/*.rs"); packages=(ultr)
            filters=(identif) ;;
  decode)   files=(crates/core/src/session/decode.rs "crates/core/src/session/decode/**/*.rs"); packages=(ultr)
            filters=(session::decode malformed_records:: fuzz:: click_log:: logged_propensity:: ingest) ;;
  state)    files=("crates/core/src/state/**/*.rs"); packages=(ultr)
            filters=(state:: cumulative:: ingest_workers:: production_ingest:: windows:: duplicate_filter) ;;
  refit)    files=(crates/train/src/refit.rs); packages=(ultr); mutate=ultr-train
            filters=(refit:: position_bias:: theta_intervals::sparse aggregated_training:: chunked_training::) ;;
  all)      for a in operator identify decode state refit; do bash "$0" "$a" "$shard" "$@"; done; exit 0 ;;
  *) echo "unknown area $area" >&2; exit 2 ;;
esac
# The misspecification scenarios' names contain `identif` and `windows`; they take minutes each and
# exercise none of these areas beyond what the filters above already run.
skip=(--skip misspecification)

if ! cargo mutants --version 2>/dev/null | grep -q "cargo-mutants 27"; then
  cargo install cargo-mutants --version '^27' --locked
fi

# The flags the mutants are built with (.cargo/mutants.toml's additional_cargo_args): the
# workspace's crates at opt-level 0, incrementally; the dependencies keep the release profile.
mapfile -t build_flags < <(python3 -c '
import tomllib
print("\n".join(tomllib.load(open(".cargo/mutants.toml", "rb"))["additional_cargo_args"]))')
package_flags=(); for p in "${packages[@]}"; do package_flags+=(-p "$p"); done
targets=(--test laboratory)

echo "==> baseline: ${packages[*]} ${targets[*]} -- ${filters[*]} ${skip[*]}"
if ! cargo test "${build_flags[@]}" "${package_flags[@]}" "${targets[@]}" -- "${filters[@]}" "${skip[@]}"; then
  echo "the baseline fails on the unmutated tree: every mutant would count as caught; fix that first" >&2
  exit 1
fi

examine=(); for f in "${files[@]}"; do examine+=(--file "$f"); done
test_packages=(); for p in "${packages[@]}"; do test_packages+=(--test-package "$p"); done
mkdir -p "mutants.out/$area"
echo "==> mutants of ${files[*]} (shard $shard)"
cargo mutants --package "$mutate" "${examine[@]}" "${test_packages[@]}" --shard "$shard" --sharding round-robin --baseline skip \
  --timeout 600 --build-timeout 900 --output "mutants.out/$area" "$@" \
  -- "${targets[@]}" -- "${filters[@]}" "${skip[@]}"
