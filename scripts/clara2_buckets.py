#!/usr/bin/env python3
"""nDCG@10 of two TREC runs against qrels per bucket of clicks per query (the buckets of `ultr
train`'s "logged order × clicks" report): where ranking by the clicks gains or loses against the
logged order on editors' labels.

usage: scripts/clara2_buckets.py SESSIONS_JSONL QRELS RUN_A RUN_B   (runs from `ultr eval --run-out`)

A query's clicks are counted from the sessions (every session, as the shipped scores use them).
Gains are 2^grade − 1 discounted by log2(i + 1), the ideal from the judged grades among the
documents RUN_A ranks; queries with fewer than two distinct grades are left out, as `ultr eval`
does. Each bucket: queries, mean nDCG@10 of A and B, and A − B with a 95% interval from 1000 paired
bootstrap resamples of the bucket's queries.
"""
import collections
import importlib.util
import json
import pathlib
import math
import random
import sys

EDGES = [0, 1, 10, 100, 1000]


def read_run(path):
    """Per query, the run's documents in rank order (per-query-ndcg.py's reader)."""
    spec = importlib.util.spec_from_file_location("per_query_ndcg", pathlib.Path(__file__).with_name("per-query-ndcg.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.read_run(path)


def ndcg10(order, grades):
    dcg = sum((2 ** grades.get(d, 0) - 1) / math.log2(i + 2) for i, d in enumerate(order[:10]))
    ideal = sorted((grades.get(d, 0) for d in order), reverse=True)
    idcg = sum((2 ** g - 1) / math.log2(i + 2) for i, g in enumerate(ideal[:10]))
    return dcg / idcg if idcg > 0 else None


def main():
    sessions, qrels_path, run_a, run_b = sys.argv[1:5]
    clicks = collections.Counter()
    for line in open(sessions):
        s = json.loads(line)
        clicks[s["query_id"]] += sum(1 for i in s["items"] if i.get("clicked"))
    qrels = collections.defaultdict(dict)
    for line in open(qrels_path):
        q, _, d, g = line.split()
        qrels[q][d] = int(g)
    a, b = read_run(run_a), read_run(run_b)
    buckets = collections.defaultdict(list)
    for q, order in a.items():
        grades = qrels.get(q)
        if not grades or q not in b or len({grades.get(d, 0) for d in order}) < 2:
            continue
        x, y = ndcg10(order, grades), ndcg10(b[q], grades)
        if x is None or y is None:
            continue
        bucket = max(i for i, e in enumerate(EDGES) if clicks[q] >= e)
        buckets[bucket].append((x, y))
    rng = random.Random(0)
    print(f"| clicks per query | queries | nDCG@10 {sys.argv[3].split('/')[-1]} | nDCG@10 {sys.argv[4].split('/')[-1]} | difference [95%] |")
    print("|---|---|---|---|---|")
    for i in sorted(buckets):
        v = buckets[i]
        diffs = [x - y for x, y in v]
        reps = sorted(sum(rng.choice(diffs) for _ in diffs) / len(diffs) for _ in range(1000))
        label = f"{EDGES[i]}–{EDGES[i + 1] - 1}" if i + 1 < len(EDGES) else f"≥ {EDGES[i]}"
        print(
            f"| {label} | {len(v)} | {sum(x for x, _ in v) / len(v):.4f} | {sum(y for _, y in v) / len(v):.4f} "
            f"| {sum(diffs) / len(diffs):+.4f} [{reps[25]:+.4f}, {reps[974]:+.4f}] |"
        )


main()
