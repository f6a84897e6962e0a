-- The feature and bias-feature vectors of the training rows, once per (query, document,
-- feature_key), taken from one impression that has them.
-- Input: impressions (one micro-batch); partials merge by merge_training_features.sql.
SELECT query_id, doc_id, feature_key, features, bias_features
FROM impressions
WHERE sample_key IN (SELECT MIN(sample_key) FROM impressions GROUP BY query_id, doc_id, feature_key)
ORDER BY query_id, doc_id, feature_key
