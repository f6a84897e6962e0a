-- Merges partial training rows (micro-batches of one window) by key.
SELECT
    query_id,
    doc_id,
    position,
    split,
    feature_key,
    CAST(SUM(impressions) AS BIGINT) AS impressions,
    CAST(SUM(clicks) AS BIGINT) AS clicks
FROM training_rows
GROUP BY query_id, doc_id, position, split, feature_key
ORDER BY query_id, doc_id, position, split, feature_key
