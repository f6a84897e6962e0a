-- Merges partial session stores: a pattern's rows are identical in every partial, so summing the
-- counts per (pattern, position) row adds the pattern's sessions; then the bottom {session_store_patterns} patterns
-- ([window] session_store_patterns).
SELECT pattern_key, query_id, context, position, doc_id, clicked, sessions
FROM (
    SELECT
        pattern_key, query_id, context, position, doc_id, clicked,
        CAST(SUM(sessions) AS BIGINT) AS sessions,
        DENSE_RANK() OVER (ORDER BY pattern_key) AS pattern_rank
    FROM session_store
    GROUP BY pattern_key, query_id, context, position, doc_id, clicked
) ranked
WHERE pattern_rank <= {session_store_patterns}
ORDER BY pattern_key, position
