-- Merges partial session stores: counts of identical patterns add, then the bottom 4096 by pattern_key.
SELECT pattern_key, query_id, context, positions, ranking, clicks, CAST(SUM(sessions) AS BIGINT) AS sessions
FROM session_store
GROUP BY pattern_key, query_id, context, positions, ranking, clicks
ORDER BY pattern_key, query_id
LIMIT 4096
