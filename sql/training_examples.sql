-- Training examples over the horizon: the windows' aggregated training rows, merged by key, each
-- with the π(d,k|q) of its IPS weight (ips_propensity.sql: counted as the share of the query's
-- sessions that showed d at k, Hager Eq. 22, or from the policies' logged propensities, as
-- configured). A row whose (q,d,k) has no π gets a NULL propensity; the trainer refuses or falls
-- back as configured.
-- Inputs: training_rows and training_features (closed windows in the horizon), ips_propensity.
WITH counts AS (
    SELECT query_id, doc_id, position, split, feature_key, SUM(impressions) AS impressions, SUM(clicks) AS clicks
    FROM training_rows
    GROUP BY query_id, doc_id, position, split, feature_key
),
vectors AS (
    SELECT query_id, doc_id, feature_key, features, bias_features
    FROM (
        SELECT query_id, doc_id, feature_key, features, bias_features,
               ROW_NUMBER() OVER (PARTITION BY query_id, doc_id, feature_key) AS nth
        FROM training_features
    ) numbered
    WHERE nth = 1
)
SELECT
    c.query_id,
    c.doc_id,
    c.position,
    c.split,
    v.features,
    v.bias_features,
    CAST(c.impressions AS BIGINT) AS impressions,
    CAST(c.clicks AS BIGINT) AS clicks,
    pi.propensity AS propensity
FROM counts c
JOIN vectors v ON c.query_id = v.query_id AND c.doc_id = v.doc_id AND c.feature_key = v.feature_key
LEFT JOIN ips_propensity pi ON c.query_id = pi.query_id AND c.doc_id = pi.doc_id AND c.position = pi.position
ORDER BY c.split, c.query_id, c.doc_id, c.position, c.feature_key
