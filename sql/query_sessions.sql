-- Sessions per query and logging policy: the denominator of π(d,k|q) = impressions(q,d,k) /
-- sessions(q) (all policies), and of each policy's own π.
-- Input: impressions (one micro-batch). The window's duplicate-session filter admits a session id
-- once per window, so micro-batches hold disjoint sessions and their counts add up exactly
-- (merge_query_sessions.sql).
SELECT
    query_id,
    policy_id,
    COUNT(DISTINCT session_id) AS sessions
FROM impressions
GROUP BY query_id, policy_id
ORDER BY query_id, policy_id
