"""CLARA 2's labels as TREC qrels in the log's query ids.

The labels file (`query url relevance`, a header line) numbers queries differently from the search
log: log query 2031's URLs are judged under 2038, 272's under 273, 0's under 0. Each log query is
mapped to the labelled query that judges most of the URLs it was shown with; the mapping and how
much of each query's URLs it covers go to standard error, so the join can be checked.

usage: clara2_qrels.py SEARCH_LOG LABELS > judged.qrels
"""
import collections
import sys

log_path, labels_path = sys.argv[1], sys.argv[2]
judged = collections.defaultdict(dict)
with open(labels_path) as f:
    next(f)
    for line in f:
        q, url, grade = line.split()
        judged[q][url] = int(grade)
by_url = collections.defaultdict(set)
for q, docs in judged.items():
    for url in docs:
        by_url[url].add(q)
shown = collections.defaultdict(set)
with open(log_path) as f:
    for line in f:
        fields = line.rstrip("\n").split("\t")
        if len(fields) > 5 and fields[2] == "Q":
            shown[fields[3]].update(u for u in fields[5:] if u)
mapped, covered, total, ties = 0, 0, 0, 0
used = collections.Counter()
for q, urls in sorted(shown.items()):
    votes = collections.Counter(j for u in urls for j in by_url.get(u, ()))
    total += len(urls)
    if not votes:
        continue
    (best, n), *rest = votes.most_common(2) + [(None, 0)]
    if rest and rest[0][1] == n:
        ties += 1
        continue
    mapped += 1
    covered += n
    used[best] += 1
    for url, grade in judged[best].items():
        print(f"{q} 0 {url} {grade}")
print(
    f"clara2_qrels: {mapped} of {len(shown)} log queries mapped ({ties} ties left out); "
    f"{covered} of {total} shown (query, URL) pairs judged under the mapped query; "
    f"{sum(1 for n in used.values() if n > 1)} labelled queries claimed by more than one log query",
    file=sys.stderr,
)
