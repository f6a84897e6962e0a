-- Per-position impressions, clicks and click-through rate over a set of impressions.
-- Input table: impressions (the decoded impressions schema, docs/session-contract.md).
SELECT
    position,
    COUNT(*) AS impressions,
    SUM(CASE WHEN clicked THEN 1 ELSE 0 END) AS clicks,
    AVG(CASE WHEN clicked THEN 1.0 ELSE 0.0 END) AS ctr
FROM impressions
GROUP BY position
ORDER BY position
