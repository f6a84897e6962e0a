-- Training examples over the horizon: the windows' aggregated training rows, merged by key, each
-- with π(d,k|q), the share of the query's sessions that showed d at k (Hager Eq. 22), summed over
-- bias contexts. A row whose (q,d,k) has no cumulative count gets a NULL propensity; the trainer
-- refuses or falls back as configured.
-- Inputs: training_rows (closed windows in the horizon), propensity (cumulative_propensity).
WITH pi AS (
    SELECT query_id, doc_id, position, SUM(impressions) AS impressions, MAX(sessions) AS sessions
    FROM propensity
    GROUP BY query_id, doc_id, position
),
merged AS (
    SELECT
        query_id,
        doc_id,
        position,
        held_out,
        features,
        bias_features,
        CAST(SUM(impressions) AS BIGINT) AS impressions,
        CAST(SUM(clicks) AS BIGINT) AS clicks
    FROM training_rows
    GROUP BY query_id, doc_id, position, held_out, features, bias_features
)
SELECT
    t.query_id,
    t.doc_id,
    t.position,
    t.held_out,
    t.features,
    t.bias_features,
    t.impressions,
    t.clicks,
    CAST(pi.impressions AS DOUBLE) / CAST(pi.sessions AS DOUBLE) AS propensity
FROM merged t
LEFT JOIN pi
    ON t.query_id = pi.query_id AND t.doc_id = pi.doc_id AND t.position = pi.position
ORDER BY t.held_out, t.query_id, t.doc_id, t.position, t.features, t.bias_features
