-- π inputs: how often each document was shown, and clicked, at each position for each query,
-- per bias context (device, layout, ...; NULL when the stream has none) and logging policy, with
-- the policy's own logged propensities where the items carry one: how many impressions did, and
-- Σ 1/propensity over them (`logged_propensity` = their count / that sum, in policy_propensity.sql).
-- Input: impressions (one micro-batch of an open window). Sums, so partials merge exactly by
-- merge_propensity_counts.sql (at checkpoints, at window close, and over the horizon).
SELECT
    query_id,
    doc_id,
    position,
    context,
    policy_id,
    COUNT(*) AS impressions,
    SUM(CASE WHEN clicked THEN 1 ELSE 0 END) AS clicks,
    COUNT(propensity) AS logged_impressions,
    COALESCE(SUM(1.0 / propensity), 0.0) AS logged_inverse_sum
FROM impressions
GROUP BY query_id, doc_id, position, context, policy_id
ORDER BY query_id, doc_id, position, context, policy_id
