"""Fit the bundled workloads' parametric distributions to the PolyTrace traces.

Reproduces the figures in docs/workload.md ("Fitted distributions", "Bundled workloads (e) and
(f)"):

    python3 benchmarks/fit_traces.py                 # traces from $JIGSAW_TRACE_DIR
    python3 benchmarks/fit_traces.py --traces DIR    # or ../shared/traces/polytrace
    python3 benchmarks/fit_traces.py e               # the fits behind e_dapo_longtail_32gpu.yaml
    python3 benchmarks/fit_traces.py f               # the fits behind f_agentic_32gpu.yaml

``e`` and ``f`` print every fitted figure of that bundled file beside the value the file holds
and say whether they agree (exit code 1 if one does not), plus the summary statistics the
docs quote (scaled quantiles and ratios, the tool-latency mixture's quantiles).

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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

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

# ---------------------------------------------------------------------------------------------
# Bundled workloads (e) and (f): every fitted figure of the file, recomputed and compared.

WORKLOAD_FILES = {"e": "e_dapo_longtail_32gpu.yaml", "f": "f_agentic_32gpu.yaml"}
LONGTAIL_CAP = 32768  # (e): the trace's longest response is mapped onto this cap


@dataclass(frozen=True)
class FitCheck:
    """One fitted figure of a bundled file: what the traces give and what the file holds."""

    pipeline: str
    field: str  # dotted path below the pipeline, e.g. "tool_latency_s.components[1]"
    method: str
    source: str
    fitted: dict
    in_file: dict | None

    @property
    def agrees(self) -> bool:
        return self.in_file is not None and _same(self.fitted, self.in_file)

    def as_dict(self) -> dict:
        return {"pipeline": self.pipeline, "field": self.field, "method": self.method, "source": self.source,
                "fitted": self.fitted, "in_file": self.in_file, "agrees": self.agrees}


def _same(fitted: dict, in_file: dict) -> bool:
    """The file agrees when every fitted key holds the same number(s) (it may add min/max)."""
    for k, v in fitted.items():
        w = in_file.get(k)
        if isinstance(v, list):
            if not isinstance(w, list) or len(w) != len(v) or not np.allclose(w, v, rtol=0, atol=1e-9):
                return False
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            if not isinstance(w, (int, float)) or abs(w - v) > 1e-9:
                return False
        elif w != v:
            return False
    return True


def _field(pipeline: dict, path: str):
    node = pipeline
    for part in path.replace("]", "").replace("[", ".").split("."):
        node = node[int(part)] if part.isdigit() else node.get(part)
        if node is None:
            return None
    return node


def _values(trace_dir: Path, folder: str, role: str) -> np.ndarray:
    return np.asarray(load_trace((trace_dir / folder).resolve(), role), dtype=np.float64)


def scaled_quantile_fit(v: np.ndarray, cap: int) -> tuple[dict, float]:
    """The trace's quantiles at QUANTILE_KNOTS times cap / max: its shape, its maximum on the cap."""
    scale = cap / float(v.max())
    vals = [int(round(x * scale)) for x in np.quantile(v, QUANTILE_KNOTS)]
    return {"dist": "quantiles", "q": QUANTILE_KNOTS, "values": vals}, scale


def batch_reward_times(trace_dir: Path) -> np.ndarray:
    """rllm/ ``reward_time_s``: seconds one rank spent verifying its whole batch in the sandbox."""
    out = []
    for f in trace_files((trace_dir / "rllm").resolve()):
        with gzip.open(f, "rt", encoding="utf-8") as fh:
            out += [float(r["reward_time_s"]) for r in map(json.loads, fh)
                    if "reward_time_s" in r and r.get("validate") is not True]
    return np.asarray(out)


def _group_icc(trace_dir: Path, folder: str, interval: bool = True) -> dict:
    """group_correlation of a folder's responses; the bootstrap interval only when asked (slow)."""
    groups, _ = trace_groups((trace_dir / folder).resolve(), "response")
    if not interval:
        of = np.repeat(np.arange(len(groups)), [len(g) for g in groups])
        return {"group_correlation": round(icc_anova(normal_scores(np.concatenate(groups)), of), 3)}
    icc = fit_group_correlation(groups)
    return {"group_correlation": icc["group_correlation"], "ci95": icc["ci95"]}


def workload_fits(workload: str, trace_dir: Path) -> list[tuple[str, str, str, str, object]]:
    """(pipeline, field, method, source, fitted value) for every fitted figure of the file."""
    t = trace_dir
    if workload == "e":
        verl_resp, _ = scaled_quantile_fit(_values(t, "verl", "response_len"), LONGTAIL_CAP)
        verl_prompt = quantile_fit(_values(t, "verl", "prompt_len"))
        rllm_prompt = quantile_fit(_values(t, "rllm", "prompt_len"))
        rllm_resp = quantile_fit(_values(t, "rllm", "response_len"))
        rllm_reward = lognormal_mle(_values(t, "rllm", "reward_latency_s"), digits=3)
        verl_icc = _group_icc(t, "verl", interval=False)["group_correlation"]
        rllm_icc = _group_icc(t, "rllm", interval=False)["group_correlation"]
        fits = []
        for p in ("dapo-longtail-7b", "dapo-longtail-32b"):
            fits += [(p, "prompt_len", "quantiles", "verl/ input", verl_prompt),
                     (p, "response_len", f"quantiles x {LONGTAIL_CAP}/max", "verl/ output", verl_resp),
                     (p, "group_correlation", "ICC(1) of normal scores", "verl/ output by prompt", verl_icc)]
        return fits + [
            ("deepcoder-14b", "prompt_len", "quantiles", "rllm/ input", rllm_prompt),
            ("deepcoder-14b", "response_len", "quantiles", "rllm/ output", rllm_resp),
            ("deepcoder-14b", "reward.latency_s", "lognormal MLE", "rllm/ reward_time_s / batch_size", rllm_reward),
            ("deepcoder-14b", "group_correlation", "ICC(1) of normal scores", "rllm/ output by prompt", rllm_icc)]
    if workload == "f":
        sr = {role: _values(t, "search_r1", role) for role in
              ("prompt_len", "response_len", "turns", "tool_latency_s", "observation_len")}
        search = [("prompt_len", "quantiles", "search_r1/ prompt_len", quantile_fit(sr["prompt_len"])),
                  ("response_len", "quantiles", "search_r1/ turns[].completion_tokens", quantile_fit(sr["response_len"])),
                  ("turns", "categorical", "search_r1/ turn_count", categorical_fit(sr["turns"])),
                  ("tool_latency_s", "quantiles", "search_r1/ tool_calls[].latency_s",
                   quantile_fit(sr["tool_latency_s"], digits=3)),
                  ("observation_len", "quantiles", "search_r1/ tool_calls[].response_token_len",
                   quantile_fit(sr["observation_len"]))]
        fits = [(p, f, m, src, v) for p in ("search-agent-7b", "search-agent-14b") for f, m, src, v in search]
        per_sample = lognormal_mle(_values(t, "rllm", "reward_latency_s"), digits=3)
        per_batch = lognormal_mle(batch_reward_times(t), digits=3)
        return fits + [
            ("swe-agent-32b", "response_len", "quantiles", "search_r1/ turns[].completion_tokens", search[1][3]),
            ("swe-agent-32b", "observation_len", "quantiles", "search_r1/ tool_calls[].response_token_len", search[4][3]),
            ("swe-agent-32b", "tool_latency_s.components[0]", "quantiles", "search_r1/ tool_calls[].latency_s",
             search[3][3]),
            ("swe-agent-32b", "tool_latency_s.components[1]", "lognormal MLE", "rllm/ reward_time_s / batch_size",
             per_sample),
            ("swe-agent-32b", "tool_latency_s.components[2]", "lognormal MLE", "rllm/ reward_time_s (per batch)",
             per_batch),
            ("swe-agent-32b", "reward.latency_s", "lognormal MLE", "rllm/ reward_time_s (per batch)", per_batch)]
    raise ValueError(f"workload: got {workload!r}; allowed: e, f")


def check_workload(workload: str, trace_dir: Path) -> list[FitCheck]:
    doc = yaml.safe_load((ROOT / "examples" / "workloads" / WORKLOAD_FILES[workload]).read_text())
    pipes = {p["name"]: p for p in doc["pipelines"]}
    out = []
    for pipe, field, method, source, fitted in workload_fits(workload, trace_dir):
        in_file = _field(pipes[pipe], field) if pipe in pipes else None
        if not isinstance(fitted, dict):  # a bare number (group_correlation)
            fitted, in_file = {"value": fitted}, None if in_file is None else {"value": in_file}
        else:  # drop the keys a fit does not set (min, weight)
            fitted = {k: v for k, v in fitted.items() if k != "min"}
        out.append(FitCheck(pipe, field, method, source, fitted, in_file))
    return out


def _stats(draws: np.ndarray) -> dict:
    q = np.quantile(draws, [0.5, 0.9, 0.99])
    return {"mean": float(draws.mean()), "p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2]),
            "max": float(draws.max())}


def workload_report(workload: str, trace_dir: Path) -> dict:
    """The summary statistics docs/workload.md quotes for the bundled file."""
    from jigsaw_plugin.workload import load_workload

    w = load_workload(ROOT / "examples" / "workloads" / WORKLOAD_FILES[workload])
    rng = np.random.default_rng(0)
    out: dict[str, dict] = {}
    if workload == "e":
        v = _values(trace_dir, "verl", "response_len")
        spec, scale = scaled_quantile_fit(v, LONGTAIL_CAP)
        q = np.quantile(v, [0.5, 0.99])
        out["verl/ output, the trace"] = {"n": len(v), **_stats(v), "p99/p50": q[1] / q[0], "max/p50": v.max() / q[0]}
        out["scale"] = {"cap": LONGTAIL_CAP, "trace max": float(v.max()), "scale": scale}
        d = build_distribution(spec, "fit", role="response_len").sample(rng, DRAWS)
        out["dapo response_len in the file (200,000 draws)"] = {
            **_stats(d), "share >= 16K": float((d >= 16384).mean()), "share >= 20K": float((d >= 20480).mean())}
        r = _values(trace_dir, "rllm", "response_len")
        out["rllm/ output"] = {"n": len(r), **_stats(r), "share at the 16,000 cap": float((r >= 16000).mean())}
        icc = {f: _group_icc(trace_dir, f) for f in ("verl", "rllm")}
        out["group_correlation"] = {f"{f} {k}": v for f, d in icc.items() for k, v in d.items()}
    else:
        b = batch_reward_times(trace_dir)
        out["rllm/ reward_time_s per 64-sample batch"] = {"n": len(b), **_stats(b)}
        swe = next(p for p in w.pipelines if p.name == "swe-agent-32b")
        tl = swe.tool_latency_s.sample(rng, DRAWS)
        out["swe-agent-32b tool_latency_s (200,000 draws)"] = {
            **_stats(tl), "share > 10 s": float((tl > 10).mean()), "share > 60 s": float((tl > 60).mean())}
        rw = swe.reward.latency_s.sample(rng, DRAWS)
        out["swe-agent-32b reward latency (200,000 draws)"] = _stats(rw)
        turns = np.maximum(np.rint(swe.turns.sample(rng, DRAWS)), 1)
        out["swe-agent-32b turns (ASSUMED; 200,000 draws)"] = _stats(turns)
        out["swe-agent-32b tool seconds per trajectory (turns - 1 calls)"] = {
            "mean": float((turns - 1).mean() * tl.mean())}
    return out


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}" if abs(x) < 1 else f"{x:.2f}"


def format_checks(workload: str, checks: list, summary: dict) -> str:
    lines = [f"# bundled workload ({workload}): fitted figures against the file"]
    for c in checks:
        lines.append(f"## {c.pipeline}.{c.field} -- {c.method}   [{'agrees' if c.agrees else 'DIFFERS'}]")
        lines.append(f"   from {c.source}")
        lines.append(f"   fit:  {json.dumps(c.fitted)}")
        if not c.agrees:
            lines.append(f"   file: {json.dumps(c.in_file)}")
    lines.append("")
    lines.append("# summary statistics quoted in docs/workload.md")
    for name, stats in summary.items():
        lines.append(f"## {name}")
        lines.append("   " + "  ".join(f"{k} {_fmt(v) if isinstance(v, float) else v}" for k, v in stats.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("workload", nargs="?", choices=("all", "e", "f"), default="all",
                    help="all: the demo fits and group correlations (default); e / f: the fits behind "
                         "the bundled workload (e) or (f), checked against the file")
    ap.add_argument("--traces", type=Path, default=default_trace_dir(), help="the polytrace folder")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    args = ap.parse_args(argv)
    if not args.traces.is_dir():
        print(f"no trace folder at {args.traces}; set JIGSAW_TRACE_DIR or pass --traces", file=sys.stderr)
        return 2
    if args.workload != "all":
        checks = check_workload(args.workload, args.traces)
        if args.json:
            print(json.dumps({"workload": args.workload, "checks": [c.as_dict() for c in checks],
                              "summary": workload_report(args.workload, args.traces)}, indent=1, default=float))
        else:
            print(format_checks(args.workload, checks, workload_report(args.workload, args.traces)))
        return 0 if all(c.agrees for c in checks) else 1
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
