#!/usr/bin/env bash
# `ultr ingest` with 1 and 2 workers against a streaming peer: Flink SQL in streaming mode
# (benches/flink/window_statistics.py: the per-window statistics as event-time 10-minute windows,
# checkpoints every 10 s, the hashmap state backend, `pipeline.object-reuse` on) at parallelism 1 and 2
# (the input split into two files, one reader each), and once more at parallelism 1 with Flink's
# default object reuse (off). Same simulated JSONL as scripts/bench-vs-duckdb.sh. Flink's row counts
# must equal an independent count made here in Python, and ultr's for the three statistics defined
# alike (propensity counts, query sessions, training features; ultr's training rows carry its own
# split), or the script fails. A benchmark, not a test: it needs a release `ultr` (cargo build
# --release) and Java 11+ (Debian: openjdk-17-jre-headless); PyFlink 2.3.0 is installed into a venv
# of its own on first use (FLINK_VENV, default ~/.cache/ultr/flink-venv).
#   scripts/bench-vs-flink.sh [SESSIONS]   (default 200000)
set -euo pipefail
cd "$(dirname "$0")/.."
sessions="${1:-200000}"
command -v java >/dev/null || { echo "Flink needs Java 11 or later: apt-get install openjdk-17-jre-headless" >&2; exit 1; }
FLINK_VENV="${FLINK_VENV:-$HOME/.cache/ultr/flink-venv}"
if ! "$FLINK_VENV/bin/python" -c "import pyflink" 2>/dev/null; then
  echo "installing PyFlink 2.3.0 into $FLINK_VENV"
  python3 -m venv "$FLINK_VENV"
  "$FLINK_VENV/bin/pip" install -q --disable-pip-version-check "apache-flink==2.3.0"
fi
py="$FLINK_VENV/bin/python"
source scripts/bench-common.sh
mkdir -p "$work/split"
awk -v out="$work/split" '{ print > (out "/part-" (NR % 2) ".jsonl") }' "$work/sessions.jsonl"
echo "JSONL: $sessions sessions, $(du -m "$work/sessions.jsonl" | cut -f1) MB; $(nproc) cores; $(java -version 2>&1 | head -1)"

# The independent reference: the four statistics' keys counted from the JSONL, windows by floor division.
"$py" - "$work/sessions.jsonl" >"$work/reference.json" <<'PY'
import hashlib, json, sys
prop, qs, rows, feats = set(), set(), set(), set()
impressions = 0
for line in open(sys.argv[1]):
    s = json.loads(line)
    w = s["event_time"] // 600_000
    h = hashlib.md5(s["session_id"].encode()).hexdigest()[:2]
    split = 1 if h < "1a" else 2 if h < "34" else 0
    qs.add((w, s["query_id"], s["policy_id"]))
    for i in s["items"]:
        f = tuple(i["features"])
        impressions += 1
        prop.add((w, s["query_id"], i["doc_id"], i["position"], s["policy_id"]))
        rows.add((w, s["query_id"], i["doc_id"], i["position"], split, f))
        feats.add((w, s["query_id"], i["doc_id"], f))
print(json.dumps({"impressions": impressions, "propensity_counts": len(prop), "query_sessions": len(qs), "training_rows": len(rows), "training_features": len(feats)}))
PY
echo "reference: $(cat "$work/reference.json")"

for workers in 1 2; do run_ingest "$workers"; done
# ultr's rows of the statistics defined alike, summed over the one-worker state's windows.
"$py" - "$work/state-1" "$work/reference.json" <<'PY'
import glob, json, sys
import pyarrow.parquet as pq
ref = json.load(open(sys.argv[2]))
for name in ["propensity_counts", "query_sessions", "training_features"]:
    n = sum(pq.ParquetFile(p).metadata.num_rows for p in glob.glob(f"{sys.argv[1]}/windows/*/{name}.parquet"))
    assert n == ref[name], f"ultr's {name}: {n} rows, the reference {ref[name]}"
print("ultr's propensity counts, query sessions and training features equal the reference")
PY

run_flink() { # parallelism input object_reuse label
  rm -rf "$work/flink"
  JVM_ARGS=-Xmx2g "$py" benches/flink/window_statistics.py "$2" "$work/flink" "$1" "$3" >"$work/flink.json" 2>"$work/flink.log" ||
    { echo "the Flink job failed:"; tail -30 "$work/flink.log"; exit 1; }
  "$py" - "$work/flink" "$work/reference.json" "$work/flink.json" "$4" "${ingest_secs[$1]}" "$1" <<'PY'
import json, os, sys
out, ref, run, label, ultr_secs, p = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3])), sys.argv[4], float(sys.argv[5]), sys.argv[6]
for name in ["propensity_counts", "query_sessions", "training_rows", "training_features"]:
    n = 0
    for root, _, files in os.walk(os.path.join(out, name)):
        for f in files:
            if not f.startswith("."):
                n += sum(1 for _ in open(os.path.join(root, f)))
    assert n == ref[name], f"Flink's {name}: {n} rows, the reference {ref[name]}"
job, proc = run["job_seconds"], run["process_seconds"]
rss = "unknown" if run["jvm_peak_rss_mb"] is None else f"{run['jvm_peak_rss_mb']:.0f} MB"
print(f"Flink SQL streaming, {label}: job {job:.2f} s (process {proc:.2f} s), JVM peak RSS {rss}; "
      f"rows equal the reference; ultr with {p} worker(s) is {job / ultr_secs:.2f}x its speed ({proc / ultr_secs:.2f}x by process time)")
PY
}
run_flink 1 "$work/sessions.jsonl" true "parallelism 1, object reuse on"
run_flink 2 "$work/split" true "parallelism 2 (two files), object reuse on"
run_flink 1 "$work/sessions.jsonl" false "parallelism 1, Flink's defaults (object reuse off)"
