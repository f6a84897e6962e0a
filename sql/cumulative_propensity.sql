-- Cumulative π(d,k|q) over the lookback horizon: Σ impressions(q,d,k) / Σ sessions(q).
-- Inputs: propensity_counts and query_sessions of every window inside the horizon.
WITH counts AS (
    SELECT query_id, doc_id, position, context, SUM(impressions) AS impressions, SUM(clicks) AS clicks
    FROM propensity_counts
    GROUP BY query_id, doc_id, position, context
),
sessions AS (
    SELECT query_id, SUM(sessions) AS sessions
    FROM query_sessions
    GROUP BY query_id
)
SELECT
    c.query_id,
    c.doc_id,
    c.position,
    c.context,
    c.impressions,
    c.clicks,
    s.sessions,
    CAST(c.impressions AS DOUBLE) / CAST(s.sessions AS DOUBLE) AS propensity
FROM counts c
JOIN sessions s ON c.query_id = s.query_id
ORDER BY c.query_id, c.doc_id, c.position, c.context
