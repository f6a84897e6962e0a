-- DuckDB baseline for `scripts/bench-vs-duckdb.sh` (issue 11): the statistics `ultr ingest` keeps
-- per 10-minute window, computed as one batch query over the same JSONL. It does less than ultr
-- (no overlap sample, session store, swap edges, duplicate filter, checkpoints or Parquet), so the
-- comparison favours DuckDB. `${DATA}` is replaced by the script.
CREATE TEMP TABLE impressions AS
SELECT
    time_bucket(INTERVAL 10 MINUTE, epoch_ms(s.event_time)) AS window_start,
    CAST(s.session_id AS VARCHAR) AS session_id,
    CAST(s.query_id AS VARCHAR) AS query_id,
    CAST(i.item.doc_id AS VARCHAR) AS doc_id,
    i.item.position AS position,
    i.item.clicked AS clicked,
    i.item.features AS features,
    hash(s.session_id) % 10 = 0 AS held_out
FROM read_json('${DATA}', format = 'newline_delimited') s, UNNEST(s.items) AS i(item);

CREATE TEMP TABLE propensity_counts AS
SELECT window_start, query_id, doc_id, position, COUNT(*) AS impressions, SUM(clicked::INT) AS clicks
FROM impressions GROUP BY ALL;

CREATE TEMP TABLE query_sessions AS
SELECT window_start, query_id, COUNT(DISTINCT session_id) AS sessions
FROM impressions GROUP BY ALL;

CREATE TEMP TABLE training_rows AS
SELECT window_start, query_id, doc_id, position, held_out, hash(features) AS feature_key,
       COUNT(*) AS impressions, SUM(clicked::INT) AS clicks
FROM impressions GROUP BY ALL;

CREATE TEMP TABLE training_features AS
SELECT window_start, query_id, doc_id, hash(features) AS feature_key, ANY_VALUE(features) AS features
FROM impressions GROUP BY window_start, query_id, doc_id, feature_key;

SELECT (SELECT COUNT(*) FROM impressions) AS impressions,
       (SELECT COUNT(*) FROM propensity_counts) AS propensity_keys,
       (SELECT COUNT(*) FROM training_rows) AS training_rows,
       (SELECT COUNT(*) FROM training_features) AS feature_rows;
