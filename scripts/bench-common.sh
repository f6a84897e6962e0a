# Sourced by scripts/bench-vs-duckdb.sh and scripts/bench-vs-flink.sh: the same simulated JSONL and the
# same `ultr ingest` runs for both comparisons. Needs `sessions` set; sets `ultr`, `work` (a temporary
# folder removed on exit) and `ingest_config WORKERS JSONL OUT`.
ultr="${CARGO_TARGET_DIR:-target}/release/ultr"
[ -x "$ultr" ] || { echo "no release ultr at $ultr: cargo build --release --bin ultr" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# MQ2008's five folds, ε-greedy τ = 0.3, seed 3: $work/sessions.jsonl.
bench_args=()
for i in 1 2 3 4 5; do bench_args+=(--data "${ULTR_DATA_DIR:-data}/mq2008/S$i.txt"); done
"$ultr" simulate "${bench_args[@]}" --tau 0.3 --sessions "$sessions" --seed 3 --out "$work/sessions.jsonl" >/dev/null
# The ingest config of both benches: file source, 10-minute windows, every window kept; FORMAT
# (default json) is `[decode] format`.
ingest_config() {
  printf 'batch_records = 4096\n[runtime]\nworkers = %s\n[source.file]\npaths = ["%s"]\n[decode]\nformat = "%s"\n[window]\nsize = "10m"\nallowed_lateness = "1m"\n[state]\nretention = "3650d"\nlookback = "3650d"\n' \
    "$1" "$2" "${4:-json}" >"$3"
}
# `ultr ingest WORKERS [FORMAT]`: $work/sessions.jsonl (or, with FORMAT, $work/sessions.FORMAT) with
# WORKERS workers into $work/state-WORKERS[-FORMAT] under GNU time: prints its wall and CPU seconds
# and peak RSS (and impressions/s when `impressions` is set), and keeps the wall seconds of the JSON
# runs in ingest_secs[WORKERS].
ingest_secs=()
run_ingest() {
  local secs user sys kib format="${2:-}" input="$work/sessions.jsonl" label=""
  [ -n "$format" ] && { input="$work/sessions.$format"; label=" ($format)"; }
  ingest_config "$1" "$input" "$work/ingest-$1$format.toml" "${format:-json}"
  /usr/bin/time -f '%e %U %S %M' -o "$work/time" "$ultr" ingest --config "$work/ingest-$1$format.toml" --state "$work/state-$1$format" >/dev/null
  read -r secs user sys kib <"$work/time"
  [ -z "$format" ] && ingest_secs[$1]=$secs
  python3 -c "import sys; s, cpu, kib, n = float(sys.argv[2]), float(sys.argv[3]) + float(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
print(f'ultr ingest{sys.argv[7]}, {sys.argv[1]} worker(s): {s:.2f} s ({cpu:.2f} s CPU), ' + (f'{int(n) / s:,.0f} impressions/s, ' if n else '') + f'peak RSS {kib / 1024:.0f} MB')" \
    "$1" "$secs" "$user" "$sys" "$kib" "${impressions:-}" "$label"
}
