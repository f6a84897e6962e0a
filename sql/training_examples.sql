-- Training examples over the horizon: each kept impression with π(d,k|q), the share of the query's
-- sessions that showed d at k (Hager Eq. 22), summed over bias contexts. A row whose (q,d,k) has no
-- cumulative count gets a NULL propensity; the trainer refuses or falls back as configured.
-- Inputs: training_impressions (closed windows in the horizon), propensity (cumulative_propensity).
WITH pi AS (
    SELECT query_id, doc_id, position, SUM(impressions) AS impressions, MAX(sessions) AS sessions
    FROM propensity
    GROUP BY query_id, doc_id, position
)
SELECT
    t.session_id,
    t.query_id,
    t.doc_id,
    t.position,
    t.clicked,
    t.features,
    t.bias_features,
    CAST(pi.impressions AS DOUBLE) / CAST(pi.sessions AS DOUBLE) AS propensity
FROM training_impressions t
LEFT JOIN pi
    ON t.query_id = pi.query_id AND t.doc_id = pi.doc_id AND t.position = pi.position
ORDER BY t.session_id, t.position
