-- Feature-overlap input: per bias configuration (position, context), a bottom-k sample of feature
-- vectors: the 256 impressions with the smallest sample_key (a hash of session and position). A
-- bottom-k sample is mergeable exactly: the bottom-k of a union is the bottom-k of the parts' samples,
-- so this one query reduces a micro-batch, merges a window's partial samples, and merges window
-- samples into the cumulative one.
-- The ranking runs on the keys alone and only its winners fetch their feature vectors: ranking the
-- rows with their vectors attached would sort a copy of every vector of the input.
WITH winners AS (
    SELECT sample_key
    FROM (
        SELECT
            sample_key,
            ROW_NUMBER() OVER (PARTITION BY position, context ORDER BY sample_key) AS rank_in_node
        FROM impressions
        WHERE features IS NOT NULL
    ) ranked
    WHERE rank_in_node <= 256
)
SELECT position, context, sample_key, features
FROM (
    -- Ranked again, so a key shared by rows of two nodes (or twice in one) cannot add a row.
    SELECT
        position,
        context,
        sample_key,
        features,
        ROW_NUMBER() OVER (PARTITION BY position, context ORDER BY sample_key) AS rank_in_node
    FROM impressions
    WHERE features IS NOT NULL AND sample_key IN (SELECT sample_key FROM winners)
) ranked
WHERE rank_in_node <= 256
ORDER BY position, context, sample_key
