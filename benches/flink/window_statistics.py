"""Flink SQL baseline for `scripts/bench-vs-flink.sh` (issue 58): the per-window statistics `ultr
ingest` keeps, as one streaming job over the same JSONL, in Flink's streaming mode with event-time
tumbling windows of 10 minutes, checkpoints every 10 s, the hashmap state backend and
`pipeline.object-reuse` on. Four statistics, one sink each (CSV files):
  propensity_counts   (window, query, document, position, policy): impressions, clicks
  query_sessions      (window, query, policy): distinct sessions
  training_rows       (window, query, document, position, split, feature vector): impressions, clicks
  training_features   (window, query, document, feature vector): one row each
`split` is the session's three-way split (0 training, 1 validation, 2 evaluation) from the first two
hex digits of MD5(session_id): below "1a" validation, below "34" evaluation (about 10% each), a rule
the script's independent reference computes the same way. Like DuckDB's baseline it does less than
ultr (no overlap sample, session store, swap edges, duplicate filters, dead letters or Parquet
state), so the comparison favours Flink.

usage: window_statistics.py INPUT OUT_DIR PARALLELISM [object_reuse=true|false]
INPUT is a JSONL file or a folder of them (one reader each, for parallelism > 1). Prints one JSON
line: the job's wall seconds (submit to finish), the process's, and the JVM's peak RSS.
"""

import json
import os
import sys
import time

from pyflink.common import Configuration
from pyflink.table import EnvironmentSettings, TableEnvironment


def jvm_peak_rss_mb():
    """Peak resident set of this process's Java child (the gateway JVM that runs the job), in MB."""
    me = os.getpid()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) != me:
                continue
            with open(f"/proc/{pid}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
            if "java" in status.get("Name", ""):
                return int(status["VmHWM"].split()[0]) / 1024
        except (OSError, ValueError, KeyError, IndexError):
            continue
    return None


def main():
    started = time.perf_counter()
    data, out, parallelism = sys.argv[1], sys.argv[2], int(sys.argv[3])
    object_reuse = (sys.argv[4] if len(sys.argv) > 4 else "true").lower()
    config = Configuration()
    config.set_string("parallelism.default", str(parallelism))
    config.set_string("execution.checkpointing.interval", "10 s")
    config.set_string("state.backend.type", "hashmap")
    config.set_string("execution.checkpointing.dir", "file://" + os.path.join(os.path.abspath(out), "checkpoints"))
    config.set_string("pipeline.object-reuse", object_reuse)
    env = TableEnvironment.create(EnvironmentSettings.new_instance().in_streaming_mode().with_configuration(config).build())
    t = env.execute_sql
    t(f"""
        CREATE TABLE sessions (
            session_id STRING,
            query_id STRING,
            event_time BIGINT,
            policy_id STRING,
            items ARRAY<ROW<doc_id STRING, `position` INT, clicked BOOLEAN, features ARRAY<DOUBLE>>>,
            ts AS TO_TIMESTAMP_LTZ(event_time, 3),
            WATERMARK FOR ts AS ts - INTERVAL '1' MINUTE
        ) WITH ('connector' = 'filesystem', 'path' = 'file://{os.path.abspath(data)}', 'format' = 'json')
    """)
    t("""
        CREATE TEMPORARY VIEW impressions AS
        SELECT s.session_id, s.query_id, s.policy_id, s.ts, i.doc_id, i.`position`, i.clicked, i.features,
               CASE WHEN SUBSTRING(MD5(s.session_id), 1, 2) < '1a' THEN 1
                    WHEN SUBSTRING(MD5(s.session_id), 1, 2) < '34' THEN 2 ELSE 0 END AS split
        FROM sessions AS s CROSS JOIN UNNEST(s.items) AS i (doc_id, `position`, clicked, features)
    """)
    sinks = {
        "propensity_counts": "window_start TIMESTAMP(3), query_id STRING, doc_id STRING, `position` INT, policy_id STRING, impressions BIGINT, clicks INT",
        "query_sessions": "window_start TIMESTAMP(3), query_id STRING, policy_id STRING, sessions BIGINT",
        "training_rows": "window_start TIMESTAMP(3), query_id STRING, doc_id STRING, `position` INT, split INT, impressions BIGINT, clicks INT",
        "training_features": "window_start TIMESTAMP(3), query_id STRING, doc_id STRING, features STRING",
    }
    for name, columns in sinks.items():
        path = "file://" + os.path.join(os.path.abspath(out), name)
        t(f"CREATE TABLE {name}_sink ({columns}) WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'csv')")
    windows = "TABLE(TUMBLE(TABLE impressions, DESCRIPTOR(ts), INTERVAL '10' MINUTES))"
    clicks = "SUM(CASE WHEN clicked THEN 1 ELSE 0 END)"
    statements = env.create_statement_set()
    statements.add_insert_sql(f"""
        INSERT INTO propensity_counts_sink
        SELECT window_start, query_id, doc_id, `position`, policy_id, COUNT(*), {clicks}
        FROM {windows} GROUP BY window_start, window_end, query_id, doc_id, `position`, policy_id""")
    statements.add_insert_sql(f"""
        INSERT INTO query_sessions_sink
        SELECT window_start, query_id, policy_id, COUNT(DISTINCT session_id)
        FROM {windows} GROUP BY window_start, window_end, query_id, policy_id""")
    # The feature vector itself is the key (ultr keys a 64-bit hash of its bits); it is written once
    # per (window, query, document, vector) by training_features, as ultr keeps it.
    statements.add_insert_sql(f"""
        INSERT INTO training_rows_sink
        SELECT window_start, query_id, doc_id, `position`, split, COUNT(*), {clicks}
        FROM {windows} GROUP BY window_start, window_end, query_id, doc_id, `position`, split, features""")
    statements.add_insert_sql(f"""
        INSERT INTO training_features_sink
        SELECT window_start, query_id, doc_id, CAST(features AS STRING)
        FROM {windows} GROUP BY window_start, window_end, query_id, doc_id, features""")
    submitted = time.perf_counter()
    statements.execute().wait()
    finished = time.perf_counter()
    print(json.dumps({"job_seconds": finished - submitted, "process_seconds": finished - started, "jvm_peak_rss_mb": jvm_peak_rss_mb()}))


if __name__ == "__main__":
    main()
