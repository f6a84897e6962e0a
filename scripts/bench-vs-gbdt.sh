#!/usr/bin/env bash
# ultr against the GBDT rankers teams run (issue 87): XGBoost's Unbiased LambdaMART
# (`rank:ndcg`, `lambdarank_unbiased`) and LightGBM's lambdarank with its `position` column (and,
# with GBDT_NAIVE=1, XGBoost's LambdaMART on raw clicks), all on the same simulated click log,
# every ranking scored on queries never simulated.
#
# A cell is (α, sessions, seed): `ultr simulate` on MQ2008 S1–S3 (their editors' labels as the
# relevance, the additive PBM's clicks σ(−ln k + rel − 2), 10 results a page, the MLP logging policy
# blended with per-pair noise by α, ε-greedy τ = 0.2), then
#   ultr: `ultr ingest` and `ultr train` with every [train] key at its default, `ultr score` on S5;
#   GBDT: scripts/gbdt_bench.py fit (each early-stopped on a tenth of the sessions' clicks), on S5;
# and scripts/gbdt_bench.py score: nDCG@10 on S5's labels (156 queries, 105 with a relevant
# document), paired bootstrap intervals against XGBoost unbiased, θ's bias RMSE (k = 1..10) against
# the simulator's −ln k, and each learner's fit seconds. A benchmark, not a test: CI runs one small
# cell (scripts/test.sh) to keep the script working.
#
# usage: scripts/bench-vs-gbdt.sh OUT_DIR [CELL ...]   CELL = ALPHA:SESSIONS:SEED
#        (default: α ∈ {1, 0.5, 0.2, −0.5} × {50000, 200000} × seeds 1–3)
#        ULTR: the binary (default $CARGO_TARGET_DIR/release/ultr); VARIANTS_DIR: a folder of
#        NAME.toml files, each more [train] keys for one more ultr run per cell (diagnoses);
#        GBDT_REUSE=1 keeps a cell's GBDT runs when OUT_DIR has them; GBDT_VENV: the venv
#        (default ~/.cache/ultr/gbdt-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:?usage: scripts/bench-vs-gbdt.sh OUT_DIR [ALPHA:SESSIONS:SEED ...]}"
shift
CELLS=("$@")
if [ ${#CELLS[@]} -eq 0 ]; then
  for sessions in 50000 200000; do
    for alpha in 1 0.5 0.2 -0.5; do
      for seed in 1 2 3; do CELLS+=("$alpha:$sessions:$seed"); done
    done
  done
fi
ULTR="${ULTR:-${CARGO_TARGET_DIR:-target}/release/ultr}"
[ -x "$ULTR" ] || { echo "no release ultr at $ULTR: cargo build --release --bin ultr" >&2; exit 1; }
DATA="${ULTR_DATA_DIR:-data}/mq2008"
GBDT_VENV="${GBDT_VENV:-$HOME/.cache/ultr/gbdt-venv}"
if ! "$GBDT_VENV/bin/python" -c "import xgboost, lightgbm, numpy" 2>/dev/null; then
  python3 -m venv "$GBDT_VENV"
  "$GBDT_VENV/bin/pip" install -q --disable-pip-version-check "xgboost-cpu>=2.1,<4" "lightgbm>=4.1,<5" "numpy>=1.24"
fi
PY="$GBDT_VENV/bin/python"
mkdir -p "$OUT"
"$PY" -c "import xgboost, lightgbm; print(f'xgboost {xgboost.__version__}, lightgbm {lightgbm.__version__}')" > "$OUT/versions.txt"
test_file="$(mktemp)"
trap 'rm -f "$test_file"' EXIT
zcat -f "$DATA/S5.txt"* > "$test_file"

# The ultr configurations each cell trains: `default` (every [train] key at its default) and, with
# VARIANTS_DIR, one more per NAME.toml there (extra [train] keys, for the diagnosis).
VARIANTS=(default)
if [ -n "${VARIANTS_DIR:-}" ]; then
  for f in "$VARIANTS_DIR"/*.toml; do VARIANTS+=("$(basename "$f" .toml)"); done
fi
# pipeline WORK KEYS: writes WORK/pipeline.toml (file source, hour windows kept for ten years,
# θ for positions 1..10, KEYS under [train]) and prints its path.
pipeline() {
  printf '[source.file]\npaths = ["%s"]\n[window]\nsize = "1h"\n[state]\nretention = "3650d"\nlookback = "3650d"\n[train]\nmax_positions = 10\n%s\n' \
    "$1/sessions.jsonl" "$2" > "$1/pipeline.toml"
  echo "$1/pipeline.toml"
}

for cell in "${CELLS[@]}"; do
  IFS=: read -r alpha sessions seed <<<"$cell"
  dir="$OUT/a${alpha}-n${sessions}-s${seed}"
  work="$dir/work"
  mkdir -p "$work"
  echo "== cell α $alpha, $sessions sessions, seed $seed"
  "$ULTR" simulate --data "$DATA/S1.txt" --data "$DATA/S2.txt" --data "$DATA/S3.txt" --relevance labels \
    --ranker mlp --top-n 10 --alpha "$alpha" --tau 0.2 --sessions "$sessions" --seed "$seed" \
    --out "$work/sessions.jsonl" > /dev/null
  "$ULTR" ingest --config "$(pipeline "$work" "")" --state "$work/state" --json > "$work/ingest.json"
  for variant in "${VARIANTS[@]}"; do
    keys=""
    [ "$variant" = default ] || keys="$(cat "$VARIANTS_DIR/$variant.toml")"
    config="$(pipeline "$work" "$keys")"
    rm -rf "$work/state/models"
    /usr/bin/time -f '%e' -o "$dir/train-$variant.time" "$ULTR" train --config "$config" --state "$work/state" --json > "$dir/train-$variant.json"
    # The candidate the run trained, promoted or not: the bench compares learners; the gate's
    # decision is in train-*.json.
    checkpoint="$(python3 -c "import json,sys; t = json.load(open(sys.argv[1])); print(t['models_dir'] + '/' + t['id'])" "$dir/train-$variant.json")"
    "$ULTR" score --model "$checkpoint" --input "$test_file" --out "$dir/run-ultr-$variant.tsv"
  done
  if [ -z "${GBDT_REUSE:-}" ] || [ ! -s "$dir/gbdt.json" ]; then
    "$PY" scripts/gbdt_bench.py fit "$work/sessions.jsonl" "$test_file" "$dir"
  fi
  "$PY" scripts/gbdt_bench.py score "$test_file" "$dir" > "$dir/score.json"
  python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print(json.dumps({k: d[k] for k in ('ndcg10', 'minus_xgboost_unbiased', 'ultr')}))" "$dir/score.json"
  rm -rf "$work"
done

# One table over every cell under OUT.
python3 - "$OUT" > "$OUT/table.md" <<'PY'
import glob, json, os, sys
print("| cell (α, sessions, seed) | ultr variant | nDCG@10 ultr | XGB unbiased | XGB naive | LGBM position | ultr − XGB unbiased [95 %] | θ bias RMSE | θ from | ultr train s (wall) | GBDT fit s (XGB-u / XGB-n / LGBM) | ultr ÷ fastest GBDT | held-out click LL: ultr / per-pair CTR | promoted |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for path in sorted(glob.glob(f"{sys.argv[1]}/*/score.json")):
    d = json.load(open(path))
    cell = os.path.basename(os.path.dirname(path))
    n, g = d["ndcg10"], d["gbdt"]
    fastest = min(v["fit_seconds"] for v in g.values())
    for variant, u in d["ultr"].items():
        m, h = u["minus_xgboost_unbiased"], u["held_out_clicks"]
        print(
            f"| {cell} | {variant} | {u['ndcg10']:.3f} | {n['xgboost_unbiased']:.3f} | {n.get('xgboost_naive', float('nan')):.3f} | {n['lightgbm_position']:.3f} "
            f"| {m['estimate']:+.3f} [{m['low']:+.3f}, {m['high']:+.3f}] | {u['theta_bias_rmse']:.3f} | {u['theta_method']} | {u['train_wall_seconds']:.1f} "
            f"| {g['xgboost_unbiased']['fit_seconds']:.1f} / {g.get('xgboost_naive', {}).get('fit_seconds', float('nan')):.1f} / {g['lightgbm_position']['fit_seconds']:.1f} "
            f"| {u['train_wall_seconds'] / fastest:.2f} | {h['candidate']:.4f} / {h['pair_ctr']:.4f}{' (below)' if h['below_pair_ctr'] else ''} | {'yes' if u['promoted'] else 'no'} |"
        )
PY
cat "$OUT/table.md"
