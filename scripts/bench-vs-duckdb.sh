#!/usr/bin/env bash
# End-to-end `ultr ingest` with 1 and 2 workers (46 features, file source, 10-minute windows, every sql/
# statistic, checkpoints, Parquet state) against DuckDB computing the per-window counts and training
# rows as one batch query over the same JSONL (benches/duckdb/window_statistics.sql), 1 and 2 threads.
# Needs a release `ultr` (cargo build --release) and DuckDB's Python package (pip install duckdb).
#   scripts/bench-vs-duckdb.sh [SESSIONS]   (default 200000)
set -euo pipefail
cd "$(dirname "$0")/.."
sessions="${1:-200000}"
ultr="${CARGO_TARGET_DIR:-target}/release/ultr"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
data_dir="${ULTR_DATA_DIR:-data}/mq2008"
args=()
for i in 1 2 3 4 5; do args+=(--data "$data_dir/S$i.txt"); done
"$ultr" simulate "${args[@]}" --tau 0.3 --sessions "$sessions" --seed 3 --out "$work/sessions.jsonl" >/dev/null
impressions=$(python3 -c "import json,sys; print(sum(len(json.loads(l)['items']) for l in open(sys.argv[1])))" "$work/sessions.jsonl")
echo "JSONL: $sessions sessions, $impressions impressions, $(du -m "$work/sessions.jsonl" | cut -f1) MB"
for workers in 1 2; do
  printf 'batch_records = 4096\n[runtime]\nworkers = %s\n[source.file]\npaths = ["%s"]\n[window]\nsize = "10m"\nallowed_lateness = "1m"\n[state]\nretention = "3650d"\nlookback = "3650d"\n' \
    "$workers" "$work/sessions.jsonl" >"$work/ingest-$workers.toml"
  /usr/bin/time -f '%e %U %S %M' -o "$work/time" "$ultr" ingest --config "$work/ingest-$workers.toml" --state "$work/state-$workers" >/dev/null
  read -r secs user sys kib <"$work/time"
  python3 -c "print(f'ultr ingest, $workers worker(s): {float(\"$secs\"):.2f} s ({float(\"$user\")+float(\"$sys\"):.2f} s CPU), {$impressions/float(\"$secs\"):,.0f} impressions/s, peak RSS {$kib/1024:.0f} MB')"
done
for threads in 1 2; do
  python3 - "$work/sessions.jsonl" "$threads" <<'PY'
import sys, time, resource, duckdb
data, threads = sys.argv[1], int(sys.argv[2])
sql = open("benches/duckdb/window_statistics.sql").read().replace("${DATA}", data)
con = duckdb.connect()
con.execute(f"SET threads = {threads}")
t = time.perf_counter()
body = "\n".join(l for l in sql.splitlines() if not l.strip().startswith("--"))
for statement in [s for s in body.split(";") if s.strip()]:
    last = con.execute(statement).fetchall()
secs = time.perf_counter() - t
imps = last[0][0]
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"duckdb {duckdb.__version__}, {threads} thread(s): {secs:.2f} s, {imps/secs:,.0f} impressions/s, peak RSS {rss:.0f} MB, rows {last[0]}")
PY
done
