#!/usr/bin/env bash
# The logged-order prior ([train] logged_order_prior) on logs whose truth is known: MQ2008 with its
# expert labels as the relevance (`ultr simulate --relevance labels`), clicks from the additive PBM,
# and a logging policy that knows the relevance well (an MLP fitted to it, α = 1) or barely (α = 0.2),
# ε-greedy with τ = 0.3 so that θ is identified. Per policy and seed: the additive model with the
# embedding tower trained with the prior (the default) and without (`logged_order_prior = []`), each
# scored by `ultr eval --qrels` against MQ2008's labels beside the logged order and naive CTR.
# Writes OUT/table.md (nDCG@10 per policy and seed).
#
# usage: scripts/logged_order_prior.sh [OUT_DIR] [SESSIONS] [SEEDS]
#        (defaults: results/logged_order_prior, 20000, "1 2 3"); ULTR=path/to/ultr as in clara2.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-results/logged_order_prior}"
SESSIONS="${2:-20000}"
SEEDS="${3:-1 2 3}"
ULTR="${ULTR:-${CARGO_TARGET_DIR:-target}/release/ultr}"
DATA=data/mq2008/S1.txt.gz
mkdir -p "$OUT"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

bash scripts/mq2008_qrels.sh "$DATA" > "$work/labels.qrels"

for alpha in 1 0.2; do
  for seed in $SEEDS; do
    run="$work/a$alpha-s$seed"
    mkdir -p "$run"
    "$ULTR" simulate --data "$DATA" --relevance labels --ranker mlp --alpha "$alpha" --tau 0.3 \
      --sessions "$SESSIONS" --seed "$seed" --no-features --out "$run/sessions.jsonl" > /dev/null
    for prior in default off; do
      setting=""
      [ "$prior" = off ] && setting="logged_order_prior = []"
      cat > "$run/$prior.toml" <<TOML
[source.file]
paths = ["$run/sessions.jsonl"]
[window]
size = "1m"
[train]
tower = "embedding"
models_dir = "$run/models-$prior"
$setting
TOML
    done
    "$ULTR" ingest --config "$run/default.toml" --state "$run/state" > /dev/null
    for prior in default off; do
      "$ULTR" train --config "$run/$prior.toml" --state "$run/state" --json > "$run/train-$prior.json" || true
      "$ULTR" eval --config "$run/$prior.toml" --state "$run/state" --qrels "$work/labels.qrels" --json > "$work/eval-a$alpha-s$seed-$prior.json"
    done
    python3 - "$run/train-default.json" > "$work/prior-a$alpha-s$seed.json" <<'PY'
import json, sys
print(json.dumps(json.load(open(sys.argv[1]))["fit"].get("logged_order_prior")))
PY
  done
done

python3 - "$work" "$OUT" "$SEEDS" <<'PY'
import json, sys
work, out, seeds = sys.argv[1], sys.argv[2], sys.argv[3].split()
lines = ["| logging policy | seed | logged order | naive CTR | model, no prior | model with the prior (λ chosen) | with − without | with − naive CTR |", "|---|---|---|---|---|---|---|---|"]
def ndcg(path, ranker):
    j = json.load(open(path))["judged"]
    i = j["metrics"].index("nDCG@10")
    r = next(r for r in j["rankers"] if r["ranker"] == ranker)
    return r["mean"][i], r["minus_naive_ctr"][i], r
for alpha, label in [("1", "knows the relevance (α = 1)"), ("0.2", "barely (α = 0.2)")]:
    for seed in seeds:
        on = f"{work}/eval-a{alpha}-s{seed}-default.json"
        off = f"{work}/eval-a{alpha}-s{seed}-off.json"
        logged, _, _ = ndcg(on, "logged")
        naive, _, _ = ndcg(on, "naive_ctr")
        m_off, _, _ = ndcg(off, "model")
        m_on, d_naive, _ = ndcg(on, "model")
        prior = json.load(open(f"{work}/prior-a{alpha}-s{seed}.json"))
        lam = prior["strength"] if prior else "—"
        lines.append(f"| {label} | {seed} | {logged['estimate']:.3f} | {naive['estimate']:.3f} | {m_off['estimate']:.3f} | {m_on['estimate']:.3f} (λ = {lam}) | {m_on['estimate'] - m_off['estimate']:+.3f} | {d_naive['estimate']:+.3f} [{d_naive['low']:+.3f}, {d_naive['high']:+.3f}] |")
with open(f"{out}/table.md", "w") as f:
    f.write("\n".join(lines) + "\n")
print(open(f"{out}/table.md").read())
PY
