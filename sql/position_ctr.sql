-- Per-position impressions, clicks and click-through rate over a set of impressions.
-- Input: impressions (one window), or position_ctr of many windows re-summed by the caller.
SELECT
    position,
    COUNT(*) AS impressions,
    SUM(CASE WHEN clicked THEN 1 ELSE 0 END) AS clicks,
    AVG(CASE WHEN clicked THEN 1.0 ELSE 0.0 END) AS ctr
FROM impressions
GROUP BY position
ORDER BY position
