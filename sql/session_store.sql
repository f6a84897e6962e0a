-- The session store for session-level click models (mixture EM, cross-positional attention): whole
-- sessions, identical ones (same query, context, and (position, document, click) list; pattern_key
-- is a hash of that content) aggregated with a count, bounded to the {session_store_patterns} patterns with the smallest
-- pattern_key. A bottom-k sample by a content hash merges exactly (merge_session_store.sql): a
-- pattern kept in the union is kept in every partial that has it, so its count is complete. The
-- sample is uniform over patterns; each kept pattern carries its exact session count. One row per
-- (pattern, position), taken from one session of the pattern. Features are the training rows'.
-- Input: impressions (one micro-batch; a session's rows are never split across micro-batches).
WITH patterns AS (
    SELECT pattern_key, MIN(session_key) AS representative, COUNT(DISTINCT session_key) AS sessions
    FROM impressions
    GROUP BY pattern_key
    ORDER BY pattern_key
    LIMIT {session_store_patterns}
)
SELECT i.pattern_key, i.query_id, i.context, i.position, i.doc_id, i.clicked, p.sessions
FROM patterns p
JOIN impressions i ON i.pattern_key = p.pattern_key AND i.session_key = p.representative
ORDER BY i.pattern_key, i.position
