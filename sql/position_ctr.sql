-- Per-position impressions, clicks and click-through rate.
-- Input: propensity_counts (a closed window's merged counts).
SELECT
    position,
    CAST(SUM(impressions) AS BIGINT) AS impressions,
    CAST(SUM(clicks) AS BIGINT) AS clicks,
    CAST(SUM(clicks) AS DOUBLE) / CAST(SUM(impressions) AS DOUBLE) AS ctr
FROM propensity_counts
GROUP BY position
ORDER BY position
