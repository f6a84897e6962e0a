"""Scores a TREC run with trec_eval's measures (pytrec_eval) as `ultr eval --qrels` defines them,
for tests/laboratory/click_log.rs: gain 2^g - 1 (trec_eval's ndcg_cut takes the gain from the
qrels, so the grades are mapped before they go in), the queries judged with at least two distinct
grades, unjudged documents at gain 0 (`zero`, trec_eval's own treatment) or removed from the run
first (`drop`, a condensed list).

usage: trec_parity.py QRELS RUN zero|drop  -> prints {"queries": n, "nDCG@1": mean, ...} as JSON
"""
import json
import sys

import pytrec_eval

qrels_path, run_path, unjudged = sys.argv[1], sys.argv[2], sys.argv[3]
grades = {}
with open(qrels_path) as f:
    for line in f:
        parts = line.split()
        if len(parts) == 4:
            grades.setdefault(parts[0], {})[parts[2]] = int(parts[3])
run = {}
with open(run_path) as f:
    for line in f:
        q, _, doc, _rank, score, _tag = line.split()
        if unjudged == "drop" and doc not in grades.get(q, {}):
            continue
        run.setdefault(q, {})[doc] = float(score)
gains = {q: {d: (2 ** g - 1 if g > 0 else 0) for d, g in docs.items()} for q, docs in grades.items()}
evaluator = pytrec_eval.RelevanceEvaluator(gains, {"ndcg_cut.1,3,5,10"})
per_query = evaluator.evaluate(run)
queries = sorted(q for q in per_query if len(set(grades[q].values())) >= 2)
out = {"queries": len(queries)}
for k in (1, 3, 5, 10):
    out[f"nDCG@{k}"] = sum(per_query[q][f"ndcg_cut_{k}"] for q in queries) / max(len(queries), 1)
print(json.dumps(out))
