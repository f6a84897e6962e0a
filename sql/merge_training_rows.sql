-- Merges partial training rows (micro-batches of one window, or windows of a horizon) by key.
SELECT
    query_id,
    doc_id,
    position,
    held_out,
    features,
    bias_features,
    CAST(SUM(impressions) AS BIGINT) AS impressions,
    CAST(SUM(clicks) AS BIGINT) AS clicks
FROM training_rows
GROUP BY query_id, doc_id, position, held_out, features, bias_features
ORDER BY query_id, doc_id, position, held_out, features, bias_features
