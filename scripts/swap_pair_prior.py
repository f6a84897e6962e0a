#!/usr/bin/env python3
"""Diagnosis for issue 87: how the swap-pair estimate of θ depends on the pair effects' prior,
and the pairwise conditional estimate that replaced it.

  swap_pair_prior.py SESSIONS.jsonl [PRECISION ...]

An independent re-implementation (numpy, not ultr's code) of the profiled estimate in
crates/train/src/refit.rs with the common centre: the pairs shown at two positions or more with
both clicks and skips, a random effect u_p ~ N(μ, 1/PRECISION) per (query, document), θ_1 pinned,
alternating Newton steps (without the random walk on θ: it changed nothing here), on every session of the file (ultr uses its training slice). Prints, per
precision, θ_k − θ_1 for k = 1..10 and its RMSE against the simulator's −ln k; then the same for
the pairwise conditional estimate (`pairwise`: a Bradley–Terry fit of the positions on every
clicked/skipped couple of impressions of one pair, each couple weighing 1/n of its pair, no prior;
re-implemented here from the formula in docs/models.md, not from ultr's code).
"""
import collections
import json
import math
import sys

import numpy as np


def aggregate(path):
    agg = collections.defaultdict(lambda: [0.0, 0.0])
    for line in open(path):
        s = json.loads(line)
        for it in s["items"]:
            a = agg[(s["query_id"], it["doc_id"], it["position"])]
            a[0] += 1
            a[1] += 1 if it["clicked"] else 0
    return agg


def estimate(agg, precision, positions=10, rounds=3000):
    pair_id = {}
    p_, k_, n_, c_ = [], [], [], []
    for (q, d, k), (n, c) in agg.items():
        if k > positions:
            continue
        p_.append(pair_id.setdefault((q, d), len(pair_id)))
        k_.append(k - 1)
        n_.append(n)
        c_.append(c)
    P, K, N, C = map(np.asarray, (p_, k_, n_, c_))
    pairs = len(pair_id)
    seen = collections.defaultdict(set)
    for p, k in zip(P, K):
        seen[p].add(k)
    clicks, shown = np.bincount(P, C, pairs), np.bincount(P, N, pairs)
    informative = np.array([len(seen[p]) >= 2 and 0 < clicks[p] < shown[p] for p in range(pairs)])
    keep = informative[P]
    P, K, N, C = P[keep], K[keep], N[keep], C[keep]
    sigmoid = lambda x: 1 / (1 + np.exp(-x))
    u, theta = np.zeros(pairs), np.zeros(positions)
    for _ in range(rounds):
        mu = u[informative].mean()
        for _ in range(2):
            p = sigmoid(theta[K] + u[P])
            g = np.bincount(P, C - N * p, pairs) - precision * (u - mu)
            h = np.bincount(P, N * p * (1 - p), pairs) + precision
            u = u + np.clip(g / h, -1, 1)
        before = theta.copy()
        for k in range(1, positions):
            m = K == k
            p = sigmoid(theta[k] + u[P[m]])
            theta[k] += np.clip((C[m] - N[m] * p).sum() / max((N[m] * p * (1 - p)).sum(), 1e-12), -1, 1)
        if np.abs(theta - before).max() < 1e-6:
            break
    return theta - theta[0]


def pairwise(agg, positions=10, iterations=100):
    at = collections.defaultdict(dict)
    for (q, d, k), (n, c) in agg.items():
        if k <= positions:
            at[(q, d)][k - 1] = (n, c)
    wins = np.zeros((positions, positions))
    for rows in at.values():
        n = sum(v[0] for v in rows.values())
        c = sum(v[1] for v in rows.values())
        if len(rows) < 2 or not 0 < c < n:
            continue
        for k, (n_k, c_k) in rows.items():
            for l, (n_l, c_l) in rows.items():
                if k != l:
                    wins[k, l] += c_k * (n_l - c_l) / n
    theta = np.zeros(positions)
    for _ in range(iterations):
        p = 1 / (1 + np.exp(-(theta[:, None] - theta[None, :])))  # P(k beats l)
        gradient = (wins * (1 - p)).sum(1) - (wins.T * (1 - p.T)).sum(1)
        w = (wins + wins.T) * p * (1 - p)
        hessian = w - np.diag(w.sum(1))
        step = np.linalg.solve(-hessian[1:, 1:], gradient[1:])
        theta[1:] += np.clip(step, -1, 1)
        if np.abs(step).max() < 1e-10:
            break
    return theta - theta[0]


if __name__ == "__main__":
    agg = aggregate(sys.argv[1])
    truth = -np.log(np.arange(1, 11))
    for precision in [float(x) for x in sys.argv[2:]] or [1.0, 0.1, 0.01]:
        d = estimate(agg, precision)
        rmse = math.sqrt(((d - truth) ** 2).mean())
        print(f"pair prior precision {precision:g}: θ RMSE {rmse:.3f}, θ_k − θ_1 {np.round(d, 2).tolist()}")
    d = pairwise(agg)
    rmse = math.sqrt(((d - truth) ** 2).mean())
    print(f"pairwise conditional: θ RMSE {rmse:.3f}, θ_k − θ_1 {np.round(d, 3).tolist()}")
