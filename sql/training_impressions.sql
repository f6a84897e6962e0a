-- The rows a closed window keeps for retraining: every impression with its features, whole
-- sessions in position order (training batches are sets of complete sessions).
-- Input: impressions (one window).
SELECT
    session_id,
    query_id,
    event_time,
    context,
    doc_id,
    position,
    clicked,
    features,
    bias_features
FROM impressions
ORDER BY session_id, position
