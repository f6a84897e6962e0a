-- Merges partial training-feature tables: one vector pair per (query, document, feature_key).
SELECT query_id, doc_id, feature_key, features, bias_features
FROM (
    SELECT query_id, doc_id, feature_key, features, bias_features,
           ROW_NUMBER() OVER (PARTITION BY query_id, doc_id, feature_key) AS nth
    FROM training_features
) numbered
WHERE nth = 1
ORDER BY query_id, doc_id, feature_key
