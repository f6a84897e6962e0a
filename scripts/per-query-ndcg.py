#!/usr/bin/env python3
"""Per-query nDCG@10 of two TREC runs against qrels, worst difference first: which queries an
aggregate difference (`ultr eval --qrels`) comes from.

usage: scripts/per-query-ndcg.py QRELS RUN_A RUN_B [N]   (runs from `ultr eval --run-out --run-ranker`)

Gains are 2^grade − 1 at rank i discounted by log2(i + 1); a query's ideal is its judged grades among
the documents RUN_A ranks (the documents the state saw), an unjudged document gains 0. Prints the
mean of A − B, the N worst queries with both runs' grades in rank order, and the mean without the
worst one.
"""
import collections
import math
import sys


def read_run(path):
    ranked = collections.defaultdict(list)
    for line in open(path):
        query, _, doc, rank, *_ = line.split()
        ranked[query].append((int(rank), doc))
    return {q: [d for _, d in sorted(v)] for q, v in ranked.items()}


def ndcg(docs, grades, k=10):
    dcg = sum((2 ** grades.get(d, 0) - 1) / math.log2(i + 2) for i, d in enumerate(docs[:k]))
    ideal = sorted(grades.values(), reverse=True)[:k]
    idcg = sum((2 ** g - 1) / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg > 0 else None


def main():
    qrels_path, run_a, run_b = sys.argv[1:4]
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    qrels = collections.defaultdict(dict)
    for line in open(qrels_path):
        query, _, doc, grade = line.split()[:4]
        qrels[query][doc] = int(grade)
    a, b = read_run(run_a), read_run(run_b)
    diffs = []
    for query, docs in a.items():
        grades = {d: qrels[query].get(d, 0) for d in docs}
        na, nb = ndcg(docs, grades), ndcg(b.get(query, []), grades)
        if na is not None:
            diffs.append((na - nb, query, [grades[d] for d in docs[:10]], [grades.get(d, 0) for d in b.get(query, [])[:10]]))
    diffs.sort()
    total = sum(d[0] for d in diffs)
    print(f"{len(diffs)} queries with a relevant document; mean A - B {total / len(diffs):+.4f}; "
          f"A ahead on {sum(d[0] > 0 for d in diffs)}, behind on {sum(d[0] < 0 for d in diffs)}; "
          f"mean without the worst query {(total - diffs[0][0]) / len(diffs):+.4f}")
    for diff, query, ga, gb in diffs[:n]:
        print(f"  {query}  {diff:+.3f}  A {ga}  B {gb}")


if __name__ == "__main__":
    main()
