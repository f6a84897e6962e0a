-- π inputs: how often each document was shown, and clicked, at each position for each query,
-- per bias context (device, layout, ...; NULL when the stream has none).
-- Input: impressions (one micro-batch of an open window). Sums, so partials merge exactly by
-- merge_propensity_counts.sql (at checkpoints, at window close, and over the horizon).
SELECT
    query_id,
    doc_id,
    position,
    context,
    COUNT(*) AS impressions,
    SUM(CASE WHEN clicked THEN 1 ELSE 0 END) AS clicks
FROM impressions
GROUP BY query_id, doc_id, position, context
ORDER BY query_id, doc_id, position, context
