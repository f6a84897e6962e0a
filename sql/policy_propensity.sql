-- Each logging policy's π over the lookback horizon, counted and as the policy logged it, per
-- (query, document, position) (bias contexts summed):
--   empirical_propensity = impressions / policy_sessions (the policy's own sessions of the query);
--   logged_propensity    = logged_impressions / Σ 1/propensity, only when every impression of the
--     cell carried one. This harmonic mean is the policy's mean propensity over all its sessions of
--     the query, not only those that showed d at k: E[Σ_shown 1/p] = sessions, E[shown] = Σ_s p_s. It is
--     also the π whose 1/π gives the cell's impressions their exact total logged IPS weight.
-- Inputs: propensity_counts and query_sessions of every window inside the horizon.
WITH counts AS (
    SELECT query_id, doc_id, position, policy_id,
           SUM(impressions) AS impressions,
           SUM(logged_impressions) AS logged_impressions,
           SUM(logged_inverse_sum) AS logged_inverse_sum
    FROM propensity_counts
    GROUP BY query_id, doc_id, position, policy_id
),
policy_sessions AS (
    SELECT query_id, policy_id, SUM(sessions) AS sessions
    FROM query_sessions
    GROUP BY query_id, policy_id
),
sessions AS (
    SELECT query_id, SUM(sessions) AS sessions
    FROM query_sessions
    GROUP BY query_id
)
SELECT
    c.query_id,
    c.doc_id,
    c.position,
    c.policy_id,
    CAST(c.impressions AS BIGINT) AS impressions,
    CAST(c.logged_impressions AS BIGINT) AS logged_impressions,
    CAST(c.logged_inverse_sum AS DOUBLE) AS logged_inverse_sum,
    CAST(p.sessions AS BIGINT) AS policy_sessions,
    CAST(s.sessions AS BIGINT) AS sessions,
    CAST(c.impressions AS DOUBLE) / CAST(p.sessions AS DOUBLE) AS empirical_propensity,
    CASE
        WHEN c.logged_impressions = c.impressions AND c.logged_inverse_sum > 0
        THEN CAST(c.logged_impressions AS DOUBLE) / c.logged_inverse_sum
    END AS logged_propensity
FROM counts c
JOIN policy_sessions p ON c.query_id = p.query_id AND c.policy_id = p.policy_id
JOIN sessions s ON c.query_id = s.query_id
ORDER BY c.query_id, c.doc_id, c.position, c.policy_id
