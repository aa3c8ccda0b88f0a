"""How well the remaining-length predictor does: trace replay and sampled workloads.

    python3 benchmarks/predictor_accuracy.py            # traces from $JIGSAW_TRACE_DIR or ../shared/traces/polytrace
    python3 benchmarks/predictor_accuracy.py --timing   # also the cost of one call for 10,000 requests

Replay. Every response of a step starts together and decodes one token per tick (the
synchronous rollout of verl), so at checkpoint ``c`` tokens the responses with
``L <= c`` have finished, in the order of their lengths, and were recorded in the
pipeline's ``LengthHistory`` (with every earlier step, each closed when it ended, as an
executor closes it); each response with ``L > c`` is in
flight with ``generated = c``. For each in-flight response the predictor's remaining tokens
are compared with the truth, ``min(L, cap) - c``: mean absolute error (MAE) and Spearman's
rank correlation over the in-flight responses of all steps. Step 0 starts from the prior.

Predictors: ``full`` (HistoryPredictor: conditioned on generated, GRPO siblings with
censoring), ``no-siblings`` (conditioned on generated only), ``marginal`` (the
unconditioned marginal mean minus generated). Sampled workloads: the DAPO pipeline of
examples/workloads/demo.yaml (verl/ quantiles) at ``group_correlation`` 0.084 (the fit) and
0.4, drawn with ``sample_step`` and replayed the same way.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jigsaw_plugin.ids import RequestId  # noqa: E402
from jigsaw_plugin.predict import (  # noqa: E402
    HistoryPredictor,
    LengthHistory,
    PredictorFeatures,
    RequestBatch,
    fit_model,
    spearman,
)
from jigsaw_plugin.scheduler.state import RequestView  # noqa: E402
from jigsaw_plugin.workload import load_workload, sample_step  # noqa: E402
from jigsaw_plugin.workload.traces import trace_files  # noqa: E402

CHECKPOINTS = (0, 256, 512, 1024, 2048, 4096)
PREDICTORS = {
    "full": PredictorFeatures(),
    "no-siblings": PredictorFeatures(siblings=False, earlier_epochs=False),
    "marginal": PredictorFeatures(condition_on_generated=False, siblings=False, earlier_epochs=False),
}


def default_trace_dir() -> Path:
    env = os.environ.get("JIGSAW_TRACE_DIR")
    return Path(env) if env else ROOT.parent / "shared" / "traces" / "polytrace"


def trace_steps(folder: Path) -> list[np.ndarray]:
    """verl-style trace: one int array [prompts, samples] per step file (packed_lengths_step_N)."""
    steps = []
    files = [f for f in trace_files(folder) if "packed_lengths" in f.name]
    files.sort(key=lambda f: int(f.name.split("_step_")[1].split(".")[0]))
    for f in files:
        with gzip.open(f, "rt", encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh]
        rows = [r["output"] for r in rows if not r.get("validate")]
        width = min(len(r) for r in rows)
        steps.append(np.array([r[:width] for r in rows], dtype=np.int64))
    return steps


def sampled_steps(rho: float, steps: int = 6, prompts: int = 256, seed: int = 0) -> tuple[list[np.ndarray], int]:
    w = load_workload(ROOT / "examples" / "workloads" / "demo.yaml")
    p = w.pipeline("dapo-math-7b")
    import dataclasses

    p = dataclasses.replace(p, prompts_per_step=prompts, group_correlation=rho)
    out = [sample_step(p, s, seed).gen_tokens.reshape(prompts, p.samples_per_prompt) for s in range(steps)]
    return out, p.max_response_len


def replay(steps: list[np.ndarray], cap: int) -> dict:
    """MAE and rank correlation per checkpoint and predictor (see the module docstring)."""
    predictors = {name: HistoryPredictor(features=f) for name, f in PREDICTORS.items()}
    acc = {c: {name: ([], [], []) for name in predictors} for c in CHECKPOINTS}
    history = LengthHistory(cap)
    for s, lengths in enumerate(steps):
        lengths = np.minimum(lengths, cap)
        groups, spp = lengths.shape
        flat = lengths.ravel()
        group_of = np.repeat(np.arange(groups), spp)
        order = np.argsort(flat, kind="stable")
        recorded = 0
        for c in CHECKPOINTS:
            while recorded < len(order) and flat[order[recorded]] <= c:  # finished by now, in order
                i = order[recorded]
                history.record_finished(s, int(group_of[i]), 0, int(flat[i]))
                recorded += 1
            running = np.flatnonzero(flat > c)
            if len(running) == 0:
                continue
            batch = RequestBatch(np.full(len(running), s), group_of[running], np.zeros(len(running), dtype=np.int64),
                                 np.full(len(running), float(c)), np.full(len(running), float(cap)))
            truth = (flat[running] - c).astype(float)
            for name, p in predictors.items():
                pred = p.predict(batch, history)
                acc[c][name][0].append(pred)
                acc[c][name][1].append(truth)
                acc[c][name][2].append((spearman(pred, truth), len(truth)))
        while recorded < len(order):  # the rest of the step finishes
            i = order[recorded]
            history.record_finished(s, int(group_of[i]), 0, int(flat[i]))
            recorded += 1
        history.close_step(s)  # its generation ended: its lengths are the recent ones (as an executor says)
    out = {}
    for c in CHECKPOINTS:
        row = {}
        for name, (preds, truths, ranks) in acc[c].items():
            if not preds:
                continue
            pred, truth = np.concatenate(preds), np.concatenate(truths)
            # rank correlation within each step (all requests at one checkpoint have the same
            # generated, so only what tells them apart counts), weighted by requests; a
            # predictor that gives them all one value has none (0)
            rc = sum((r or 0.0) * n for r, n in ranks) / sum(n for _, n in ranks)
            row[name] = {"mae": float(np.abs(pred - truth).mean()), "bias": float((pred - truth).mean()),
                         "rank_corr": rc, "n": len(truth)}
        if row:
            out[c] = row
    return out


def timing(repeats: int = 200) -> dict:
    """One call for 10,000 in-flight requests (1,250 groups of 8, two steps in flight)."""
    rng = np.random.default_rng(0)
    history = LengthHistory(20480)
    for s in range(4):
        for g in range(1250):
            for _ in range(8):
                history.record_finished(s, g, 0, int(min(20480, np.exp(rng.normal(6.0, 0.9)))))
    for g in rng.integers(0, 1250, 3000):
        history.record_finished(4, int(g), 0, int(np.exp(rng.normal(5.0, 0.5))))
    n = 10_000
    views = tuple(RequestView(RequestId("p", 4 + (i >= 9000), i, 0), (i // 8) % 1250, None, 150,
                              int(rng.integers(0, 3000)), 20480, 1.0, 0, False, 0.0) for i in range(n))
    batch = RequestBatch.of(views)
    p = HistoryPredictor()

    def clock(f):
        f()
        ts = []
        for _ in range(repeats):
            t = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t)
        return {"min_ms": 1e3 * min(ts), "median_ms": 1e3 * float(np.median(ts))}

    return {"requests": n, "arrays": clock(lambda: p.predict(batch, history)),
            "views": clock(lambda: p.predict(views, history)),
            "build_batch": clock(lambda: RequestBatch.of(views)),
            "refit": clock(lambda: fit_model(history, p.prior))}


def _table(title: str, res: dict) -> str:
    names = list(PREDICTORS)
    lines = [f"**{title}**", "",
             "| generated | in flight | " + " | ".join(f"MAE {n}" for n in names) + " | "
             + " | ".join(f"bias {n}" for n in names) + " | " + " | ".join(f"rank corr {n}" for n in names) + " |",
             "| --- | --- | " + " | ".join("---" for _ in names * 3) + " |"]
    for c, row in res.items():
        n = row[names[0]]["n"]
        maes = " | ".join(f"{row[k]['mae']:,.0f}" for k in names)
        bias = " | ".join(f"{row[k]['bias']:+,.0f}" for k in names)
        rcs = " | ".join(f"{row[k]['rank_corr']:.2f}" for k in names)
        lines.append(f"| {c:,} | {n:,} | {maes} | {bias} | {rcs} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", type=Path, default=default_trace_dir())
    ap.add_argument("--timing", action="store_true", help="also time one call for 10,000 requests")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    results = {}
    if args.traces.is_dir():
        results["trace verl/ (DAPO Qwen2.5-32B, 6 steps x 96 prompts x 8, cap 20,480)"] = \
            replay(trace_steps(args.traces / "verl"), 20480)
        results["trace rllm/ (DeepCoder-14B, 5 steps x 16 prompts x 8, cap 16,000)"] = \
            replay(trace_steps(args.traces / "rllm"), 16000)
    else:
        print(f"no trace folder at {args.traces}: trace replay skipped", file=sys.stderr)
    for rho in (0.084, 0.4):
        steps, cap = sampled_steps(rho)
        results[f"sampled demo.yaml dapo-math-7b, group_correlation {rho} (6 steps x 256 prompts x 8)"] = \
            replay(steps, cap)
    if args.timing:
        results["timing"] = timing()
    if args.json:
        print(json.dumps(results, indent=1, default=str))
        return 0
    for title, res in results.items():
        if title == "timing":
            print("**timing** (one call, 10,000 requests):", json.dumps(res))
        else:
            print(_table(title, res))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
