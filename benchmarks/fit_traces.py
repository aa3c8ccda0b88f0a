"""Fit the bundled workloads' parametric distributions to the PolyTrace traces.

Reproduces the figures in docs/workload.md ("Fitted distributions"):

    python3 benchmarks/fit_traces.py                 # traces from $JIGSAW_TRACE_DIR
    python3 benchmarks/fit_traces.py --traces DIR    # or ../shared/traces/polytrace

For every fit it prints the trace files it came from, the method, the fitted parameters
(as a YAML distribution) and how well it fits: p50 / p90 / p99 / max of the trace against the
fit (the fit's "max" is the largest of as many seeded draws as the trace has values; its
p99.9 is shown too), the means, and the Kolmogorov-Smirnov distance between the trace and
200,000 seeded draws of the fit.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jigsaw_plugin.workload import build_distribution, load_trace  # noqa: E402
from jigsaw_plugin.workload.traces import read_trace_file, trace_files  # noqa: E402

QUANTILE_KNOTS = [0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0]
DRAWS = 200_000


def default_trace_dir() -> Path:
    env = os.environ.get("JIGSAW_TRACE_DIR")
    return Path(env) if env else ROOT.parent / "shared" / "traces" / "polytrace"


def _round(x: float, digits: int) -> float | int:
    return int(round(x)) if digits == 0 else round(float(x), digits)


def lognormal_mle(v: np.ndarray, digits: int = 3) -> dict:
    """MLE of a lognormal: mean and (population) std of the log values."""
    lv = np.log(v[v > 0])
    return {"dist": "lognormal", "median": round(float(np.exp(lv.mean())), digits), "sigma": round(float(lv.std()), 3)}


def quantile_fit(v: np.ndarray, digits: int = 0) -> dict:
    """Piecewise-linear inverse CDF through the empirical quantiles at QUANTILE_KNOTS."""
    vals = [_round(x, digits) for x in np.quantile(v, QUANTILE_KNOTS)]
    for i in range(1, len(vals)):  # rounding must keep it non-decreasing
        vals[i] = max(vals[i], vals[i - 1])
    return {"dist": "quantiles", "q": QUANTILE_KNOTS, "values": vals}


def categorical_fit(v: np.ndarray) -> dict:
    """Observed frequencies of the distinct values."""
    vals, counts = np.unique(v, return_counts=True)
    return {"dist": "categorical", "values": [_round(x, 0) for x in vals],
            "weights": [round(c / counts.sum(), 4) for c in counts]}


def normal_fit(v: np.ndarray) -> dict:
    """Mean and std, clipped to the observed range."""
    return {"dist": "normal", "mean": round(float(v.mean()), 1), "std": round(float(v.std()), 2),
            "min": _round(v.min(), 0), "max": _round(v.max(), 0)}


def ks_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic sup |F_a - F_b|."""
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    fa = np.searchsorted(a, grid, side="right") / len(a)
    fb = np.searchsorted(b, grid, side="right") / len(b)
    return float(np.max(np.abs(fa - fb)))


def quality(trace: np.ndarray, spec: dict, role: str) -> dict:
    dist = build_distribution(spec, "fit", role=role)
    draws = dist.sample(np.random.default_rng(0), DRAWS)
    same_n = dist.sample(np.random.default_rng(1), len(trace))
    if not role.endswith("_s"):  # token counts and turns are rounded as sample_step does
        draws, same_n = np.maximum(np.rint(draws), 1), np.maximum(np.rint(same_n), 1)
    tq = np.quantile(trace, [0.5, 0.9, 0.99])
    fq = np.quantile(draws, [0.5, 0.9, 0.99, 0.999])
    return {
        "trace": {"n": len(trace), "mean": trace.mean(), "p50": tq[0], "p90": tq[1], "p99": tq[2],
                  "max": trace.max()},
        "fit": {"mean": dist.mean(), "p50": fq[0], "p90": fq[1], "p99": fq[2], "p99.9": fq[3],
                "max": same_n.max()},
        "ks": ks_distance(trace, draws),
    }


FITS = [
    # (name, trace folder, role, methods, the method a bundled file uses, where it is used)
    ("verl DAPO response_len", "verl", "response_len", ["lognormal", "quantiles"], "quantiles",
     "demo.yaml dapo-math-7b response_len"),
    ("verl DAPO prompt_len", "verl", "prompt_len", ["lognormal", "quantiles"], "quantiles",
     "demo.yaml dapo-math-7b prompt_len"),
    ("search_r1 turns", "search_r1", "turns", ["categorical"], "categorical", "demo.yaml search-agent-7b turns"),
    ("search_r1 response_len (per turn)", "search_r1", "response_len", ["lognormal", "quantiles"], "quantiles",
     "demo.yaml search-agent-7b response_len"),
    ("search_r1 tool_latency_s", "search_r1", "tool_latency_s", ["lognormal", "quantiles"], "quantiles",
     "demo.yaml search-agent-7b tool_latency_s"),
    ("search_r1 observation_len", "search_r1", "observation_len", ["lognormal", "quantiles"], "quantiles",
     "demo.yaml search-agent-7b observation_len"),
    ("search_r1 prompt_len", "search_r1", "prompt_len", ["normal", "quantiles"], "quantiles",
     "demo.yaml search-agent-7b prompt_len"),
    ("rllm DeepCoder response_len", "rllm", "response_len", ["quantiles"], None, ""),
    ("rllm DeepCoder reward_latency_s", "rllm", "reward_latency_s", ["lognormal"], "lognormal",
     "spec.py default_reward_latency('sandbox')"),
]


def fit_one(trace_dir: Path, folder: str, role: str, method: str) -> tuple[dict, dict, list[str]]:
    path = (trace_dir / folder).resolve()
    v = np.asarray(load_trace(path, role), dtype=np.float64)
    files = [f.name for f in trace_files(path) if len(read_trace_file(f)[role])]
    seconds = role.endswith("_s")
    if method == "lognormal":
        spec = lognormal_mle(v, digits=3 if seconds else 1)
        spec["min"] = 0 if seconds else 1
    elif method == "quantiles":
        spec = quantile_fit(v, digits=3 if seconds else 0)
    elif method == "categorical":
        spec = categorical_fit(v)
    elif method == "normal":
        spec = normal_fit(v)
    else:
        raise ValueError(method)
    return spec, quality(v, spec, role), files


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}" if abs(x) < 1 else f"{x:.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", type=Path, default=default_trace_dir(), help="the polytrace folder")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    args = ap.parse_args(argv)
    if not args.traces.is_dir():
        print(f"no trace folder at {args.traces}; set JIGSAW_TRACE_DIR or pass --traces", file=sys.stderr)
        return 2
    out = []
    for name, folder, role, methods, used_method, used in FITS:
        for method in methods:
            spec, q, files = fit_one(args.traces, folder, role, method)
            out.append({"name": name, "folder": folder, "role": role, "method": method,
                        "used_by": used if method == used_method else None,
                        "files": files, "spec": spec, "quality": q})
    if args.json:
        print(json.dumps(out, indent=1, default=float))
        return 0
    for r in out:
        q = r["quality"]
        t, f = q["trace"], q["fit"]
        files = r["files"]
        shown = files if len(files) <= 3 else files[:2] + [f"... ({len(files)} files)"]
        used = f"   [used by {r['used_by']}]" if r["used_by"] else ""
        print(f"## {r['name']} -- {r['method']}{used}")
        print(f"   from {r['folder']}/: {', '.join(shown)}  (n={t['n']})")
        print(f"   fit: {json.dumps(r['spec'])}")
        print(f"   trace: mean {_fmt(t['mean'])}  p50 {_fmt(t['p50'])}  p90 {_fmt(t['p90'])}  "
              f"p99 {_fmt(t['p99'])}  max {_fmt(t['max'])}")
        print(f"   fit:   mean {_fmt(f['mean'])}  p50 {_fmt(f['p50'])}  p90 {_fmt(f['p90'])}  "
              f"p99 {_fmt(f['p99'])}  max(n) {_fmt(f['max'])}  p99.9 {_fmt(f['p99.9'])}  KS {q['ks']:.3f}")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
