-- The π(d,k|q) behind the IPS weights (Hager Eq. 22): the share of all the query's sessions, under
-- every logging policy, expected to show d at k. Each policy contributes its expected displays of
-- the cell — its counted impressions, or its sessions × its logged propensity — as `ips_sources`
-- says for that policy (`train.ips.source` and `train.ips.policies`):
--   'empirical': counted;  'logged': logged, NULL (no propensity) when its impressions lack one;
--   'auto': logged where every impression of the cell carried one, else counted.
-- Cells whose π is counted for every policy are shrunk toward the position's mean π (a Beta prior
-- worth `prior_sessions` sessions, `train.ips.prior_sessions`; 0 = none), which tames π = 1 of tail
-- queries with one session; logged π is never shrunk.
-- Inputs: policy_propensity (policy_propensity.sql), ips_sources (policy_id, source; the row with a
-- NULL policy_id is the default), ips_smoothing (prior_sessions).
WITH chosen AS (
    SELECT
        pp.query_id, pp.doc_id, pp.position, pp.sessions, pp.impressions,
        CASE
            WHEN COALESCE(o.source, d.source) = 'empirical' THEN CAST(pp.impressions AS DOUBLE)
            WHEN pp.logged_propensity IS NOT NULL THEN CAST(pp.policy_sessions AS DOUBLE) * pp.logged_propensity
            WHEN COALESCE(o.source, d.source) = 'auto' THEN CAST(pp.impressions AS DOUBLE)
        END AS expected_displays,
        CASE
            WHEN COALESCE(o.source, d.source) <> 'empirical' AND pp.logged_propensity IS NOT NULL THEN 1 ELSE 0
        END AS logged
    FROM policy_propensity pp
    CROSS JOIN (SELECT source FROM ips_sources WHERE policy_id IS NULL) d
    LEFT JOIN ips_sources o ON o.policy_id = pp.policy_id
),
cells AS (
    SELECT
        query_id, doc_id, position,
        MAX(sessions) AS sessions,
        SUM(impressions) AS impressions,
        CASE WHEN COUNT(expected_displays) = COUNT(*) THEN SUM(expected_displays) END AS expected_displays,
        MAX(logged) AS logged
    FROM chosen
    GROUP BY query_id, doc_id, position
),
position_mean AS (
    SELECT position,
           SUM(CAST(impressions AS DOUBLE) * expected_displays / CAST(sessions AS DOUBLE)) / SUM(CAST(impressions AS DOUBLE)) AS mean_propensity
    FROM cells
    WHERE expected_displays IS NOT NULL
    GROUP BY position
)
SELECT
    c.query_id,
    c.doc_id,
    c.position,
    CAST(c.sessions AS BIGINT) AS sessions,
    CASE
        WHEN c.logged = 1 THEN c.expected_displays / CAST(c.sessions AS DOUBLE)
        ELSE (c.expected_displays + s.prior_sessions * m.mean_propensity) / (CAST(c.sessions AS DOUBLE) + s.prior_sessions)
    END AS propensity,
    c.logged = 1 AS logged
FROM cells c
CROSS JOIN ips_smoothing s
LEFT JOIN position_mean m ON c.position = m.position
ORDER BY c.query_id, c.doc_id, c.position
