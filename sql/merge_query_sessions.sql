-- Merges partial sessions-per-query counts (sessions are disjoint across partials of one window).
SELECT
    query_id,
    policy_id,
    CAST(SUM(sessions) AS BIGINT) AS sessions
FROM query_sessions
GROUP BY query_id, policy_id
ORDER BY query_id, policy_id
