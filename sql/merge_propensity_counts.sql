-- Merges partial propensity counts (of micro-batches, or of a window's earlier merges) into one.
SELECT
    query_id,
    doc_id,
    position,
    context,
    policy_id,
    CAST(SUM(impressions) AS BIGINT) AS impressions,
    CAST(SUM(clicks) AS BIGINT) AS clicks,
    CAST(SUM(logged_impressions) AS BIGINT) AS logged_impressions,
    CAST(SUM(logged_inverse_sum) AS DOUBLE) AS logged_inverse_sum
FROM propensity_counts
GROUP BY query_id, doc_id, position, context, policy_id
ORDER BY query_id, doc_id, position, context, policy_id
