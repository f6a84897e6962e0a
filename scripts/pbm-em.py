#!/usr/bin/env python3
"""A textbook position-based click model fitted by EM, as a reference ranker beside ultr's model on
a simulated or imported log: is a regime's ranking goal within reach of the simplest unbiased
method? (issue 55 names it as the method that came within noise of naive click-through on a held-out
log.)

usage: scripts/pbm-em.py SESSIONS_JSONL QRELS NAIVE_RUN   (NAIVE_RUN from `ultr eval --run-out
       RUN --run-ranker naive_ctr`; prints one JSON object)

The model: P(click | q, d, k) = θ_k · γ_{q,d}, fitted by EM on every page of the log (a repeated
document on a page counts at its first position only, as ultr's ingest keeps it) with a Beta(1, 10)
prior on each γ (its MAP update) and θ_k by maximum likelihood, 200 iterations from θ_k = 1/k,
γ = 0.1. It ranks each query's documents of NAIVE_RUN (the documents the state saw) by γ, ties by
their mean logged position. nDCG@10 as scripts/per-query-ndcg.py computes it, over the queries
with a relevant document among them; the mean difference PBM-EM − naive click-through and its
paired 95% percentile interval from 10,000 resamples of those queries (seeded, so a rerun prints
the same figures).
"""
import collections
import importlib.util
import json
import os
import random
import sys

PRIOR_A, PRIOR_B = 1.0, 10.0
ITERATIONS = 200


def per_query_ndcg_module():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "per-query-ndcg.py")
    spec = importlib.util.spec_from_file_location("per_query_ndcg", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def counts(sessions_path):
    """(query, doc, position) → [shown, clicked]; (query, doc) → positions it was shown at."""
    shown = collections.defaultdict(lambda: [0, 0])
    positions = collections.defaultdict(list)
    for line in open(sessions_path):
        s = json.loads(line)
        seen = set()
        for item in sorted(s["items"], key=lambda i: i["position"]):
            if item["doc_id"] in seen:
                continue
            seen.add(item["doc_id"])
            key = (s["query_id"], item["doc_id"], item["position"])
            shown[key][0] += 1
            shown[key][1] += int(bool(item["clicked"]))
            positions[(s["query_id"], item["doc_id"])].append(item["position"])
    return shown, positions


def fit(shown):
    theta = {k: 1.0 / k for (_, _, k) in shown}
    gamma = {(q, d): 0.1 for (q, d, _) in shown}
    for _ in range(ITERATIONS):
        theta_num, theta_den = collections.Counter(), collections.Counter()
        gamma_num, gamma_den = collections.Counter(), collections.Counter()
        for (q, d, k), (n, c) in shown.items():
            t, g = theta[k], gamma[(q, d)]
            miss = n - c
            # A click is examined and relevant; a skip is examined with P = θ(1 − γ)/(1 − θγ) and
            # relevant with P = γ(1 − θ)/(1 − θγ).
            theta_num[k] += c + miss * t * (1 - g) / (1 - t * g)
            theta_den[k] += n
            gamma_num[(q, d)] += c + miss * g * (1 - t) / (1 - t * g)
            gamma_den[(q, d)] += n
        theta = {k: theta_num[k] / theta_den[k] for k in theta}
        gamma = {p: (gamma_num[p] + PRIOR_A - 1) / (gamma_den[p] + PRIOR_A + PRIOR_B - 2) for p in gamma}
    return theta, gamma


def main():
    sessions_path, qrels_path, naive_path = sys.argv[1:4]
    m = per_query_ndcg_module()
    shown, positions = counts(sessions_path)
    theta, gamma = fit(shown)
    naive = m.read_run(naive_path)
    qrels = collections.defaultdict(dict)
    for line in open(qrels_path):
        query, _, doc, grade = line.split()[:4]
        qrels[query][doc] = int(grade)
    diffs = []
    for query, docs in naive.items():
        mean_position = {d: sum(positions[(query, d)]) / max(len(positions[(query, d)]), 1) for d in docs}
        ranked = sorted(docs, key=lambda d: (-gamma.get((query, d), 0.0), mean_position[d]))
        grades = {d: qrels[query].get(d, 0) for d in docs}
        a, b = m.ndcg(ranked, grades), m.ndcg(docs, grades)
        if a is not None:
            diffs.append(a - b)
    rng = random.Random(0)
    means = sorted(sum(rng.choice(diffs) for _ in diffs) / len(diffs) for _ in range(10_000))
    first = theta[min(theta)]
    print(json.dumps({
        "queries": len(diffs),
        "minus_naive_ctr": sum(diffs) / len(diffs),
        "low": means[249],
        "high": means[9_749],
        "theta_over_theta_1": {str(k): theta[k] / first for k in sorted(theta)},
    }))


if __name__ == "__main__":
    main()
