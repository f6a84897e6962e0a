#!/usr/bin/env bash
# End-to-end `ultr ingest` with 1 and 2 workers (46 features, file source, 10-minute windows, every sql/
# statistic, checkpoints, Parquet state) against DuckDB computing the per-window counts and training
# rows as one batch query over the same JSONL (benches/duckdb/window_statistics.sql), 1 and 2 threads;
# and `ultr ingest` of the same sessions as Protobuf (bare, length-delimited: `ultr simulate --format-of`).
# Needs a release `ultr` (cargo build --release) and DuckDB's Python package (pip install duckdb).
#   scripts/bench-vs-duckdb.sh [SESSIONS]   (default 200000)
set -euo pipefail
cd "$(dirname "$0")/.."
sessions="${1:-200000}"
source scripts/bench-common.sh
impressions=$(python3 -c "import json,sys; print(sum(len(json.loads(l)['items']) for l in open(sys.argv[1])))" "$work/sessions.jsonl")
echo "JSONL: $sessions sessions, $impressions impressions, $(du -m "$work/sessions.jsonl" | cut -f1) MB"
printf '[source.file]\npaths = []\n[decode]\nformat = "protobuf"\n' >"$work/protobuf.toml"
"$ultr" simulate "${bench_args[@]}" --tau 0.3 --sessions "$sessions" --seed 3 --format-of "$work/protobuf.toml" --out "$work/sessions.protobuf" >/dev/null
echo "Protobuf: $(du -m "$work/sessions.protobuf" | cut -f1) MB"
for workers in 1 2; do run_ingest "$workers"; run_ingest "$workers" protobuf; done
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
