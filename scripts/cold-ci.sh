#!/usr/bin/env bash
# A truly cold `.ci/run`, as CI's budget counts it (docs/testing.md, "How long the test command
# takes"): a fresh clone of this repository's HEAD, with CARGO_HOME, the target dir, the venv and
# pip's cache in empty folders under $1 (default /var/tmp/ultr-cold), CI=true and no standard input.
# The Debian packages are not removed: on a new machine they add about 25 s. Prints the exit code,
# the wall time and the test command's phase lines; the whole log is $1/ci.log, and $1/vmstat.log
# samples the CPU every 10 s (its `id` column shows where the two cores were not both busy).
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
R="${1:-/var/tmp/ultr-cold}"
# Only a folder this script made is emptied: it carries a marker, so a mistyped argument deletes nothing.
if [ -e "$R" ] && [ ! -e "$R/.ultr-cold-ci" ]; then
  echo "cold-ci.sh: $R exists and was not made by this script; give a new folder" >&2
  exit 2
fi
rm -rf "$R" && mkdir -p "$R" && touch "$R/.ultr-cold-ci"
git clone -q "$repo" "$R/repo"
cd "$R/repo" && git log --oneline -1
export CARGO_HOME="$R/cargo-home" ULTR_CI_TARGET_DIR="$R/target" ULTR_VENV="$R/venv" PIP_CACHE_DIR="$R/pip-cache" CI=true
vmstat -n 10 >"$R/vmstat.log" &
vmstat_pid=$!
start=$SECONDS
bash .ci/run >"$R/ci.log" 2>&1 </dev/null
rc=$?
kill "$vmstat_pid" 2>/dev/null
echo "rc=$rc wall=$((SECONDS - start)) s"
grep "==> phase done" "$R/ci.log"
exit "$rc"
