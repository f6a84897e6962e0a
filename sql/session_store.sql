-- The session store for session-level click models (mixture EM, cross-positional attention): whole
-- sessions, identical ones (query, context, positions, ranking, clicks) aggregated with a count, and
-- bounded to the 4096 patterns with the smallest pattern_key (a hash of that content). A bottom-k
-- sample by a content hash merges exactly (merge_session_store.sql): a pattern kept in the union is
-- kept in every partial that has it, so its count is complete. Features are not repeated here; they
-- are the training rows' (per query-document pair).
-- Input: impressions (one micro-batch; a session's rows are never split across micro-batches).
WITH sessions AS (
    SELECT
        session_id,
        pattern_key,
        query_id,
        context,
        array_agg(position ORDER BY position) AS positions,
        array_agg(doc_id ORDER BY position) AS ranking,
        array_agg(clicked ORDER BY position) AS clicks
    FROM impressions
    GROUP BY session_id, pattern_key, query_id, context
)
SELECT pattern_key, query_id, context, positions, ranking, clicks, COUNT(*) AS sessions
FROM sessions
GROUP BY pattern_key, query_id, context, positions, ranking, clicks
ORDER BY pattern_key, query_id
LIMIT 4096
