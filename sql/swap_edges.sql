-- Swap graph edges (Chen et al. 2024; Hager §4.3): two bias configurations (position, context) are
-- linked by every distinct (query, document) pair shown at both. Runs on a window's impressions or on
-- the cumulative propensity counts (both have query_id, doc_id, position, context). `{empty_context}`
-- is the empty context in the keys' type: '' where they are strings, 0 where they are a window's ids.
WITH shown AS (
    SELECT DISTINCT query_id, doc_id, position, COALESCE(context, {empty_context}) AS context
    FROM impressions
)
SELECT
    a.position AS position_a,
    a.context AS context_a,
    b.position AS position_b,
    b.context AS context_b,
    COUNT(*) AS pairs
FROM shown a
JOIN shown b
  ON a.query_id = b.query_id
 AND a.doc_id = b.doc_id
 -- Ordered pairs, one per edge. On a window's ids the two contexts of a position are ordered by id;
 -- the window orients them by their strings when it writes the table (`window::keys`).
 AND CASE WHEN a.position = b.position THEN a.context < b.context ELSE a.position < b.position END
GROUP BY a.position, a.context, b.position, b.context
ORDER BY position_a, context_a, position_b, context_b
