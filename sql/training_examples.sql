-- Training examples over the horizon: the windows' aggregated training rows, merged by key, each
-- with π(d,k|q), the share of the query's sessions that showed d at k (Hager Eq. 22), summed over
-- bias contexts. A row whose (q,d,k) has no cumulative count gets a NULL propensity; the trainer
-- refuses or falls back as configured.
-- Inputs: training_rows and training_features (closed windows in the horizon), propensity
-- (cumulative_propensity).
WITH pi AS (
    SELECT query_id, doc_id, position, SUM(impressions) AS impressions, MAX(sessions) AS sessions
    FROM propensity
    GROUP BY query_id, doc_id, position
),
counts AS (
    SELECT query_id, doc_id, position, split, feature_key, SUM(impressions) AS impressions, SUM(clicks) AS clicks
    FROM training_rows
    GROUP BY query_id, doc_id, position, split, feature_key
),
vectors AS (
    SELECT query_id, doc_id, feature_key, features, bias_features
    FROM (
        SELECT query_id, doc_id, feature_key, features, bias_features,
               ROW_NUMBER() OVER (PARTITION BY query_id, doc_id, feature_key) AS nth
        FROM training_features
    ) numbered
    WHERE nth = 1
)
SELECT
    c.query_id,
    c.doc_id,
    c.position,
    c.split,
    v.features,
    v.bias_features,
    CAST(c.impressions AS BIGINT) AS impressions,
    CAST(c.clicks AS BIGINT) AS clicks,
    CAST(pi.impressions AS DOUBLE) / CAST(pi.sessions AS DOUBLE) AS propensity
FROM counts c
JOIN vectors v ON c.query_id = v.query_id AND c.doc_id = v.doc_id AND c.feature_key = v.feature_key
LEFT JOIN pi ON c.query_id = pi.query_id AND c.doc_id = pi.doc_id AND c.position = pi.position
ORDER BY c.split, c.query_id, c.doc_id, c.position, c.feature_key
