-- Sessions per query: the denominator of π(d,k|q) = impressions(q,d,k) / sessions(q).
SELECT
    query_id,
    COUNT(DISTINCT session_id) AS sessions
FROM impressions
GROUP BY query_id
ORDER BY query_id
