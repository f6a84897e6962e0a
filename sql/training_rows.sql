-- Training rows, aggregated exactly: impressions that share (query, document, position, feature row,
-- bias features) and the split have one binomial loss, that of their (impressions, clicks)
-- counts, and one IPS weight (π depends on (q, d, k) only). A pointwise model trained on these rows
-- with count-weighted BCE has the same loss and gradients as on the raw impressions.
-- split: the session's stable hash split, decided before aggregating: 0 training, 1 validation
-- (early stopping; train.validation_fraction), 2 evaluation (gate, `ultr eval`, monitor;
-- train.evaluation_fraction).
-- feature_key: a 64-bit hash of the feature and bias-feature bits; the vectors themselves are kept
-- once per (query, document, feature_key) in training_features, not once per position and split.
-- Input: impressions (one micro-batch); partials merge by merge_training_rows.sql (sorted runs).
SELECT
    query_id,
    doc_id,
    position,
    split,
    feature_key,
    COUNT(*) AS impressions,
    SUM(CASE WHEN clicked THEN 1 ELSE 0 END) AS clicks
FROM impressions
GROUP BY query_id, doc_id, position, split, feature_key
ORDER BY query_id, doc_id, position, split, feature_key
