-- Merges partial propensity counts (of micro-batches, or of a window's earlier merges) into one.
SELECT
    query_id,
    doc_id,
    position,
    context,
    CAST(SUM(impressions) AS BIGINT) AS impressions,
    CAST(SUM(clicks) AS BIGINT) AS clicks
FROM propensity_counts
GROUP BY query_id, doc_id, position, context
ORDER BY query_id, doc_id, position, context
