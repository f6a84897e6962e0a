#!/usr/bin/env python3
"""The GBDT peers of scripts/bench-vs-gbdt.sh, and its scoring.

  gbdt_bench.py fit SESSIONS.jsonl TEST.letor OUT_DIR [--threads N]
      Trains XGBoost's Unbiased LambdaMART (rank:ndcg, lambdarank_unbiased), LightGBM's lambdarank
      with its `position` column and, with GBDT_NAIVE=1, XGBoost's LambdaMART on the raw clicks, on
      the simulated sessions
      (a list per session, label = click, rows in displayed order), each early-stopped on the clicks
      of a tenth of the sessions (chosen by a hash of the session id, as ultr splits), then scores
      every document of TEST. Writes OUT_DIR/run-<ranker>.tsv (query, doc, score) and
      OUT_DIR/gbdt.json (fit seconds, rounds).

  gbdt_bench.py score TEST.letor CELL_DIR
      nDCG@10 on TEST's editorial labels of every run-*.tsv in CELL_DIR (gain 2^label − 1, log2
      discount, ties broken by the file's document order; queries without a relevant document
      skipped), the paired bootstrap of each ranker minus XGBoost unbiased over queries (2,000
      resamples, percentile 95 % interval), and per ultr variant (CELL_DIR/train-<variant>.json and
      .time) θ's bias against the simulator's truth (θ_k − θ_1 = −ln k), its training time and the
      gate's held-out clicks. Prints one JSON object.

  gbdt_bench.py compare TEST.letor RUN_A.tsv RUN_B.tsv
      nDCG@10 of run B minus run A on TEST's labels, paired over queries (the same bootstrap as
      `score`): e.g. one seed's model at 200,000 sessions against its model at 50,000. Prints
      "estimate low high".
"""
import gzip
import hashlib
import json
import math
import os
import sys
import time

import numpy as np


def open_text(path):
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path += ".gz"
    return gzip.open(path, "rt") if path.endswith(".gz") else open(path)


def read_letor(path):
    """Rows of a LETOR file: (qid, docid, label, features[46])."""
    rows = []
    with open_text(path) as f:
        for line in f:
            body, _, comment = line.partition("#")
            parts = body.split()
            if not parts:
                continue
            label = int(float(parts[0]))
            qid = parts[1].split(":", 1)[1]
            feats = {}
            for p in parts[2:]:
                i, v = p.split(":")
                feats[int(i)] = float(v)
            docid = comment.split("=", 1)[1].split()[0] if "docid" in comment else str(len(rows))
            rows.append((qid, docid, label, feats))
    width = max(max(r[3]) for r in rows)
    x = np.zeros((len(rows), width), dtype=np.float32)
    for i, r in enumerate(rows):
        for j, v in r[3].items():
            x[i, j - 1] = v
    return rows, x


def validation_session(session_id):
    # A tenth of the sessions, by a hash of the id: the GBDTs' early-stopping clicks.
    return hashlib.blake2b(session_id.encode(), digest_size=8).digest()[0] < 26


def read_sessions(path):
    """Per split: features, clicks, positions and group sizes, rows in displayed order."""
    out = {True: ([], [], [], []), False: ([], [], [], [])}
    with open(path) as f:
        for line in f:
            s = json.loads(line)
            items = sorted(s["items"], key=lambda it: it["position"])
            x, y, pos, groups = out[validation_session(s["session_id"])]
            for it in items:
                x.append(it["features"])
                y.append(1 if it["clicked"] else 0)
                pos.append(it["position"])
            groups.append(len(items))
    return {
        split: (np.asarray(x, dtype=np.float32), np.asarray(y, dtype=np.float32), np.asarray(pos, dtype=np.int32), np.asarray(g))
        for split, (x, y, pos, g) in out.items()
    }


ROUNDS, PATIENCE = 500, 30


def fit_xgboost(data, threads, unbiased):
    import xgboost as xgb

    def dmatrix(split):
        x, y, _, g = data[split]
        qid = np.repeat(np.arange(len(g)), g)
        return xgb.DMatrix(x, label=y, qid=qid)

    train, valid = dmatrix(False), dmatrix(True)
    params = {
        "objective": "rank:ndcg",
        "lambdarank_unbiased": unbiased,
        "lambdarank_pair_method": "topk",
        "eval_metric": "ndcg@10",
        "tree_method": "hist",
        "eta": 0.1,
        "max_depth": 6,
        "nthread": threads,
        "seed": 1,
    }
    t0 = time.perf_counter()
    booster = xgb.train(params, train, ROUNDS, evals=[(valid, "valid")], early_stopping_rounds=PATIENCE, verbose_eval=False)
    seconds = time.perf_counter() - t0
    return (lambda x: booster.predict(xgb.DMatrix(x), iteration_range=(0, booster.best_iteration + 1))), seconds, booster.best_iteration + 1


def fit_lightgbm(data, threads):
    import lightgbm as lgb

    def dataset(split, reference=None):
        x, y, pos, g = data[split]
        # LightGBM ≥ 4.1: the displayed position of each row, a bias factor learnt beside the trees.
        return lgb.Dataset(x, label=y, group=g, position=pos - 1, reference=reference, free_raw_data=False)

    train = dataset(False)
    valid = dataset(True, train)
    params = {
        "objective": "lambdarank",
        "metric": "ndcg",
        "eval_at": [10],
        "learning_rate": 0.1,
        "num_leaves": 31,
        "num_threads": threads,
        "seed": 1,
        "verbosity": -1,
    }
    t0 = time.perf_counter()
    booster = lgb.train(params, train, ROUNDS, valid_sets=[valid], callbacks=[lgb.early_stopping(PATIENCE, verbose=False)])
    seconds = time.perf_counter() - t0
    return (lambda x: booster.predict(x, num_iteration=booster.best_iteration)), seconds, booster.best_iteration


def fit(args):
    sessions, test, out = args[0], args[1], args[2]
    threads = int(args[args.index("--threads") + 1]) if "--threads" in args else os.cpu_count()
    rows, x_test = read_letor(test)
    data = read_sessions(sessions)
    width = data[False][0].shape[1]
    x_test = x_test[:, :width]
    report = {}
    fitters = [("xgboost_unbiased", lambda: fit_xgboost(data, threads, True)), ("lightgbm_position", lambda: fit_lightgbm(data, threads))]
    if os.environ.get("GBDT_NAIVE"):
        fitters.append(("xgboost_naive", lambda: fit_xgboost(data, threads, False)))
    for name, fitter in fitters:
        predict, seconds, rounds = fitter()
        scores = predict(x_test)
        with open(os.path.join(out, f"run-{name}.tsv"), "w") as f:
            for (qid, docid, _, _), s in zip(rows, scores):
                f.write(f"{qid}\t{docid}\t{float(s)!r}\n")
        report[name] = {"fit_seconds": round(seconds, 2), "rounds": rounds}
    with open(os.path.join(out, "gbdt.json"), "w") as f:
        json.dump(report, f, indent=1)


def ndcg_at(labels_in_order, ideal, k=10):
    dcg = sum((2**l - 1) / math.log2(i + 2) for i, l in enumerate(labels_in_order[:k]))
    idcg = sum((2**l - 1) / math.log2(i + 2) for i, l in enumerate(sorted(ideal, reverse=True)[:k]))
    return dcg / idcg


def judgements(test):
    """TEST's labels per query, each document's file order, and the queries with a relevant document."""
    rows, _ = read_letor(test)
    labels, order = {}, {}
    for i, (qid, docid, label, _) in enumerate(rows):
        labels.setdefault(qid, {})[docid] = label
        order[(qid, docid)] = i
    return labels, order, sorted(q for q, d in labels.items() if max(d.values()) > 0)


def per_query_ndcg(path, labels, order, judged):
    """nDCG@10 per judged query of the run file `path` (query, doc, score; a header line skipped)."""
    scores = {}
    with open(path) as f:
        for line in f:
            q, d, s = line.rstrip("\n").split("\t")[:3]
            if s == "score":  # `ultr score`'s header
                continue
            scores.setdefault(q, {})[d] = float(s)
    per_query = []
    for q in judged:
        docs = sorted(labels[q], key=lambda d: (-scores.get(q, {}).get(d, -math.inf), order[(q, d)]))
        per_query.append(ndcg_at([labels[q][d] for d in docs], list(labels[q].values())))
    return np.asarray(per_query)


def resamples_of(n):
    return np.random.default_rng(7).integers(0, n, size=(2000, n))


def compare(args):
    labels, order, judged = judgements(args[0])
    d = per_query_ndcg(args[2], labels, order, judged) - per_query_ndcg(args[1], labels, order, judged)
    boot = d[resamples_of(len(judged))].mean(axis=1)
    print(f"{d.mean():+.4f} {np.percentile(boot, 2.5):+.4f} {np.percentile(boot, 97.5):+.4f}")


def score(args):
    test, cell = args[0], args[1]
    labels, order, judged = judgements(test)
    per_ranker = {}
    for name in sorted(os.listdir(cell)):
        if name.startswith("run-") and name.endswith(".tsv"):
            per_ranker[name[4:-4]] = per_query_ndcg(os.path.join(cell, name), labels, order, judged)
    resamples = resamples_of(len(judged))
    base = per_ranker.get("xgboost_unbiased")
    out = {"queries": len(judged), "ndcg10": {}, "minus_xgboost_unbiased": {}}
    for name, v in per_ranker.items():
        out["ndcg10"][name] = round(float(v.mean()), 4)
        if base is not None and name != "xgboost_unbiased":
            d = v - base
            boot = d[resamples].mean(axis=1)
            out["minus_xgboost_unbiased"][name] = {
                "estimate": round(float(d.mean()), 4),
                "low": round(float(np.percentile(boot, 2.5)), 4),
                "high": round(float(np.percentile(boot, 97.5)), 4),
            }
    out["gbdt"] = json.load(open(os.path.join(cell, "gbdt.json")))
    # Per ultr variant: θ against the simulator's truth (θ_k − θ_1 = −ln k), its training time, the gate.
    out["ultr"] = {}
    for name in sorted(os.listdir(cell)):
        if not (name.startswith("train-") and name.endswith(".json")):
            continue
        variant = name[len("train-") : -len(".json")]
        t = json.load(open(os.path.join(cell, name)))
        theta = t["theta"][:10]
        truth = [-math.log(k + 1) for k in range(len(theta))]
        d = out["minus_xgboost_unbiased"].get(f"ultr-{variant}", {})
        h = t["decision"].get("held_out_clicks") or {}
        refit = t["fit"].get("position_refit") or {}
        out["ultr"][variant] = {
            "ndcg10": out["ndcg10"].get(f"ultr-{variant}"),
            "minus_xgboost_unbiased": d,
            "theta": [round(x, 3) for x in theta],
            "theta_bias_rmse": round(math.sqrt(sum((a - b) ** 2 for a, b in zip(theta, truth)) / len(theta)), 4),
            "train_wall_seconds": float(open(os.path.join(cell, f"train-{variant}.time")).read().split()[-1]),
            "fit_seconds": round(t["fit"]["seconds"], 2),
            "epochs": len(t["fit"]["epochs"]),
            "theta_method": refit.get("method"),
            "promoted": t["decision"]["promoted"],
            "held_out_clicks": {k: h.get(k) for k in ("candidate", "position_only", "pair_ctr", "below_pair_ctr")},
        }
    print(json.dumps(out))


if __name__ == "__main__":
    {"fit": fit, "score": score, "compare": compare}[sys.argv[1]](sys.argv[2:])
