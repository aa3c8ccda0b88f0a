"""Fit the bundled workloads' parametric distributions to the PolyTrace traces.

Reproduces the figures in docs/workload.md ("Fitted distributions"):

    python3 benchmarks/fit_traces.py                 # traces from $JIGSAW_TRACE_DIR
    python3 benchmarks/fit_traces.py --traces DIR    # or ../shared/traces/polytrace

For every fit it prints the trace files it came from, the method, the fitted parameters
(as a YAML distribution) and how well it fits: p50 / p90 / p99 / max of the trace against the
fit (the fit's "max" is the largest of as many seeded draws as the trace has values; its
p99.9 is shown too), the means, and the Kolmogorov-Smirnov distance between the trace and
200,000 seeded draws of the fit.

It also fits ``group_correlation`` (the spec field; docs/workload.md, "Group correlation"):
the intra-class correlation, among the samples of one prompt, of the normal scores of
response length (ranks over the whole trace turned into standard-normal quantiles, ties
averaged), by the one-way ANOVA estimator ICC(1), with a 95% bootstrap interval over
prompts (1,000 seeded resamples). Normal scores make it the parameter of the Gaussian
copula that ``sample_step`` draws from, whatever the marginal.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jigsaw_plugin.predict.normal import ppf  # noqa: E402
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


# (name, trace folder, unit, where the fitted figure is used)
GROUP_FITS = [
    ("verl DAPO response_len", "verl", "response", "group_correlation of the verl/-fitted pipelines"),
    ("verl-video GRPO response_len", "verl-video", "response", ""),
    ("rllm DeepCoder response_len", "rllm", "response", ""),
    ("search_r1 completion tokens per turn", "search_r1", "turn", ""),
    ("search_r1 first-turn completion tokens", "search_r1", "first_turn", ""),
    ("search_r1 completion tokens per trajectory", "search_r1", "trajectory", ""),
]
BOOTSTRAP = 1000


def trace_groups(folder: Path, unit: str) -> tuple[list[np.ndarray], list[str]]:
    """Each prompt's lengths: a verl-style record's ``output`` list (``unit`` response), or
    search_r1 trajectories grouped by (step, prompt_group_id): every turn's completion
    tokens (turn), the first turn's (first_turn) or their sum (trajectory)."""
    groups: dict[tuple, list[float]] = {}
    files = []
    for f in trace_files(folder):
        if "packed_lengths" not in f.name and "multiturn" not in f.name:
            continue
        files.append(f.name)
        with gzip.open(f, "rt", encoding="utf-8") as fh:
            for i, line in enumerate(fh):
                rec = json.loads(line)
                if rec.get("validate") is True:
                    continue
                if unit == "response":
                    groups[(f.name, i)] = [float(x) for x in rec["output"]]
                    continue
                toks = [float(t["completion_tokens"]) for t in rec["turns"]]
                key = (rec["step"], rec["prompt_group_id"])
                if unit == "turn":
                    groups.setdefault(key, []).extend(toks)
                elif unit == "first_turn":
                    groups.setdefault(key, []).append(toks[0])
                else:
                    groups.setdefault(key, []).append(sum(toks))
    return [np.asarray(g) for g in groups.values() if len(g) >= 2], files


def normal_scores(values: np.ndarray) -> np.ndarray:
    """Standard-normal quantiles of the values' ranks ((rank - 0.5) / n; ties averaged)."""
    order = np.argsort(values, kind="stable")
    sv = values[order]
    first = np.concatenate(([True], sv[1:] != sv[:-1]))
    starts = np.flatnonzero(first)
    ends = np.concatenate((starts[1:], [len(sv)]))
    ranks = np.empty(len(sv))
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return ppf((ranks - 0.5) / len(sv))


def icc_anova(x: np.ndarray, group_of: np.ndarray) -> float:
    """One-way ANOVA ICC(1) of x among groups (unequal sizes allowed)."""
    sizes = np.bincount(group_of).astype(float)
    keep = sizes > 0
    sums = np.bincount(group_of, x)[keep]
    sizes = sizes[keep]
    g, n = len(sizes), sizes.sum()
    ss_within = (x * x).sum() - (sums**2 / sizes).sum()
    ss_between = (sums**2 / sizes).sum() - sums.sum() ** 2 / n
    msb, msw = ss_between / (g - 1), ss_within / (n - g)
    k0 = (n - (sizes**2).sum() / n) / (g - 1)
    return float((msb - msw) / (msb + (k0 - 1) * msw))


def fit_group_correlation(groups: list[np.ndarray], seed: int = 0) -> dict:
    """ICC(1) of normal scores, with a bootstrap interval over groups."""
    sizes = np.array([len(g) for g in groups])
    group_of = np.repeat(np.arange(len(groups)), sizes)
    scores = normal_scores(np.concatenate(groups))
    icc = icc_anova(scores, group_of)
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    rng = np.random.default_rng(seed)
    boot = []
    for _ in range(BOOTSTRAP):
        pick = rng.integers(0, len(groups), len(groups))
        idx = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in pick])
        boot.append(icc_anova(scores[idx], np.repeat(np.arange(len(pick)), sizes[pick])))
    lo, hi = np.quantile(boot, [0.025, 0.975])
    log_icc = icc_anova(np.log(np.maximum(np.concatenate(groups), 1.0)), group_of)
    return {"group_correlation": round(icc, 3), "ci95": [round(float(lo), 3), round(float(hi), 3)],
            "log_length_icc": round(log_icc, 3), "groups": len(groups), "values": int(sizes.sum()),
            "group_size_median": float(np.median(sizes))}


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
    group_out = []
    for name, folder, unit, used in GROUP_FITS:
        groups, files = trace_groups((args.traces / folder).resolve(), unit)
        group_out.append({"name": name, "folder": folder, "unit": unit, "used_by": used or None, "files": files,
                          **fit_group_correlation(groups)})
    if args.json:
        print(json.dumps({"distributions": out, "group_correlation": group_out}, indent=1, default=float))
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
    for r in group_out:
        used = f"   [used by {r['used_by']}]" if r["used_by"] else ""
        print(f"## {r['name']} -- group_correlation (ICC(1) of normal scores){used}")
        print(f"   from {r['folder']}/: {len(r['files'])} files, {r['groups']} prompts, {r['values']} values "
              f"(median {r['group_size_median']:g} per prompt)")
        print(f"   group_correlation {r['group_correlation']}  (95% bootstrap {r['ci95'][0]} .. {r['ci95'][1]}); "
              f"ICC of log length {r['log_length_icc']}")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
