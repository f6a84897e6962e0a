#!/usr/bin/env python3
"""Where a ranking wins or loses against the editors' labels, by what the log says about the two
documents: for every pair of judged documents of one query with different grades, does the ranker
put the better one first? Pairs are split by their clicks (both clicked, one, none) and, for pairs
without clicks, by which of the two the logging policy showed higher. Reads the imported sessions
(the session contract's JSONL), the qrels and one TREC run file per ranker.

usage: clara2_pairs.py SESSIONS QRELS NAME=RUN [NAME=RUN ...]
"""
import collections
import json
import sys


def read_log(path):
    """Per (query, doc): impressions, clicks and the sum of shown positions."""
    stats = collections.defaultdict(lambda: [0, 0, 0])
    with open(path) as f:
        for line in f:
            s = json.loads(line)
            for item in s["items"]:
                st = stats[(s["query_id"], item["doc_id"])]
                st[0] += 1
                st[1] += 1 if item.get("clicked") else 0
                st[2] += item["position"]
    return stats


def read_qrels(path):
    grades = collections.defaultdict(dict)
    with open(path) as f:
        for line in f:
            q, _, d, g = line.split()
            grades[q][d] = int(g)
    return grades


def read_run(path):
    """Per query, the documents' ranks (1 = first)."""
    ranks = collections.defaultdict(dict)
    with open(path) as f:
        for line in f:
            q, _, d, rank, _score, _tag = line.split()
            ranks[q][d] = int(rank)
    return ranks


def main():
    stats = read_log(sys.argv[1])
    grades = read_qrels(sys.argv[2])
    runs = {name: read_run(path) for name, path in (a.split("=", 1) for a in sys.argv[3:])}
    # Pair classes: both clicked / one clicked / none clicked, the last split by whether the better
    # document was shown higher (lower mean position) by the logging policy.
    counts = collections.Counter()
    right = collections.defaultdict(collections.Counter)
    docs = clicked_docs = 0
    for q, judged in grades.items():
        shown = [d for d in judged if (q, d) in stats]
        if not all(q in r for r in runs.values()):
            continue
        docs += len(shown)
        clicked_docs += sum(1 for d in shown if stats[(q, d)][1] > 0)
        for i, a in enumerate(shown):
            for b in shown[i + 1:]:
                if judged[a] == judged[b]:
                    continue
                better, worse = (a, b) if judged[a] > judged[b] else (b, a)
                sb, sw = stats[(q, better)], stats[(q, worse)]
                n_clicked = (sb[1] > 0) + (sw[1] > 0)
                if n_clicked == 2:
                    cls = "both clicked"
                elif n_clicked == 1:
                    cls = "only the better clicked" if sb[1] > 0 else "only the worse clicked"
                else:
                    higher = sb[2] / sb[0] < sw[2] / sw[0]
                    cls = "neither clicked, better shown higher" if higher else "neither clicked, worse shown higher"
                counts[cls] += 1
                for name, run in runs.items():
                    rb, rw = run[q].get(better), run[q].get(worse)
                    if rb is not None and rw is not None and rb < rw:
                        right[name][cls] += 1
    print(f"{docs} judged (query, document) pairs shown; {clicked_docs} ({100 * clicked_docs / max(docs, 1):.1f}%) ever clicked")
    names = list(runs)
    print("| document pairs (different grades) | pairs | " + " | ".join(f"{n}: better first" for n in names) + " |")
    print("|---|---|" + "---|" * len(names))
    order = ["both clicked", "only the better clicked", "only the worse clicked", "neither clicked, better shown higher", "neither clicked, worse shown higher"]
    total = sum(counts.values())
    for cls in order + ["all"]:
        n = total if cls == "all" else counts[cls]
        cells = []
        for name in names:
            k = sum(right[name].values()) if cls == "all" else right[name][cls]
            cells.append(f"{100 * k / max(n, 1):.1f}%")
        print(f"| {cls} | {n} ({100 * n / max(total, 1):.1f}%) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
