"""One RL job on its own nodes: jigsaw against verl-sync, where most users start.

    python benchmarks/single_job.py                 # measure, save, write the block
    python benchmarks/single_job.py --render        # re-render the saved results
    python benchmarks/single_job.py --quick         # (d)'s pipelines only; print, write nothing
    python benchmarks/single_job.py --seed 23000 --mixes 20   # the held-out part's draw

A user who turns jigsaw on for the one job they run has nothing to multiplex: what jigsaw
can do there is its mechanisms on that job's own steps (tail moves and re-shards, early
passes, admission limits, gangs sized by the look-ahead). This measures whether that ever
costs the job time.

Two parts, each run alone on its own pool (seed 0, the default predictor, each run its own
process, two at a time):

- every pipeline of the bundled workloads (a)-(f) on its static share (the ``gpus`` it is
  given there, else an equal split), under verl-sync at its rollout tensor-parallel width
  and at 2 and 4 (the "best tp" of docs/benchmarks.md's main table), and under jigsaw;
- held out: every pipeline of ``--mixes`` synthetic mixes (``random_mixes.synthetic_mixes``,
  drawn from ``--seed``: models of 0.5B-72B, 1-32K budgets, multi-turn agents, sandboxed
  rewards, a third asynchronous) alone on the share it was drawn with, under verl-sync
  and jigsaw; an asynchronous one also under one-step-off, streamrl and areal, the
  baselines that run its mode. None of them was looked at while the policy was built.

Writes the block ``single-job`` of docs/benchmarks.md and benchmarks/results/single_job.json.
"""

from __future__ import annotations

import copy
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor

import yaml
from common import BUNDLED, EXAMPLES, ROOT, md_table, measure_and_write, run_one
from policies import with_tp
from random_mixes import synthetic_mixes

from jigsaw_plugin.bench.ab import gap_share

RESULTS = ROOT / "benchmarks" / "results" / "single_job.json"
BLOCK = "single-job"
HELD_OUT_SEED, HELD_OUT_MIXES = 23000, 20
ASYNC_BASELINES = ("one-step-off", "streamrl", "areal")


def alone_on_share(spec: dict, name: str, share: int) -> dict:
    """``spec`` with only pipeline ``name``, on a pool of ``share`` devices (nodes no larger
    than the pool)."""
    one = copy.deepcopy(spec)
    one["pipelines"] = [{k: v for k, v in p.items() if k != "gpus"} for p in one["pipelines"] if p["name"] == name]
    if len(one["pipelines"]) != 1:
        raise SystemExit(f"alone_on_share: pipeline {name!r} not in the workload; allowed: "
                         f"{', '.join(p['name'] for p in spec['pipelines'])}")
    cluster = dict(one["cluster"], gpus=share)
    cluster["gpus_per_node"] = min(cluster.get("gpus_per_node", share), share)
    one["cluster"] = cluster
    return one


def _shares(spec: dict) -> dict:
    """Each pipeline's static share: its ``gpus``, else an equal split of the pool."""
    pipes = spec["pipelines"]
    even = spec["cluster"]["gpus"] // len(pipes)
    return {p["name"]: int(p.get("gpus", even)) for p in pipes}


def _jobs(keys, seed: int, mixes: int) -> list:
    """(part, label, policy, workload dict, options): every run of the block."""
    jobs = []
    for k in keys:
        spec = yaml.safe_load((EXAMPLES / BUNDLED[k]).read_text())
        tps = {tp: with_tp(BUNDLED[k], tp) for tp in (2, 4)}
        for name, share in _shares(spec).items():
            label = f"({k}) {name} on {share}"
            base = alone_on_share(spec, name, share)
            jobs.append(("bundled", label, "verl-sync", base))
            seen = [base]
            for tp, tuned in tps.items():
                one = alone_on_share(tuned, name, share)
                if one not in seen:  # a 32B's replicas are tp4 at the least: tp2 is tp4
                    seen.append(one)
                    jobs.append(("bundled", label, f"verl-sync tp{tp}", one))
            jobs.append(("bundled", label, "jigsaw", base))
    for mix, spec in synthetic_mixes(seed, mixes) if mixes else ():
        for name, share in _shares(spec).items():
            one = alone_on_share(spec, name, share)
            label = f"{mix} {name} on {share} {spec['cluster']['gpu'].upper()}"
            policies = ["verl-sync", "jigsaw"]
            if one["pipelines"][0].get("mode") == "async":
                policies += list(ASYNC_BASELINES)
            jobs += [("held-out", label, pol, one) for pol in policies]
    return jobs


def _run(job: tuple) -> dict:
    """One run in this process: its makespan and bound, or why it could not run."""
    from jigsaw_plugin.errors import SpecError

    part, label, policy, spec = job
    try:
        r = run_one((spec, policy.split(" ")[0], None, 0))
    except SpecError as e:
        return {"part": part, "label": label, "policy": policy, "error": str(e)}
    return {"part": part, "label": label, "policy": policy, "makespan_s": r["makespan_s"],
            "bound_s": r["bounds"]["makespan_lower_bound_s"]}


def measure(args) -> dict:
    keys, seed, mixes = args
    jobs = _jobs(keys, seed, mixes)
    with ProcessPoolExecutor(max_workers=2, max_tasks_per_child=1) as ex:
        runs = list(ex.map(_run, jobs))
    return {"seed": seed, "mixes": mixes, "runs": runs}


def _by_label(runs: list, part: str) -> dict:
    out: dict = {}
    for r in runs:
        if r["part"] == part and "makespan_s" in r:
            out.setdefault(r["label"], {})[r["policy"]] = r
    return out


def _gap(base: float, ours: float, bound: float) -> str:
    g = gap_share(base, ours, bound)
    return "-" if g is None else f"{g:.0%}"


def render(data: dict) -> str:
    runs = data["runs"]
    rows = []
    ratios = []
    for label, by in _by_label(runs, "bundled").items():
        j, v = by["jigsaw"], by["verl-sync"]
        tuned = min((r for p, r in by.items() if p.startswith("verl-sync")), key=lambda r: r["makespan_s"])
        ratios.append(tuned["makespan_s"] / j["makespan_s"])
        rows.append([label, f"{v['makespan_s']:.1f}", f"{tuned['makespan_s']:.1f} ({tuned['policy']})",
                     f"{j['makespan_s']:.1f}", f"{v['makespan_s'] / j['makespan_s']:.2f}x",
                     f"{tuned['makespan_s'] / j['makespan_s']:.2f}x", f"{j['bound_s']:.1f}",
                     _gap(v["makespan_s"], j["makespan_s"], j["bound_s"])])
    held, losses, refused = [], [], 0
    for label, by in _by_label(runs, "held-out").items():
        j = by.get("jigsaw")
        others = [r for p, r in by.items() if p != "jigsaw"]
        if j is None or not others:
            refused += 1
            continue
        best = min(others, key=lambda r: r["makespan_s"])
        ratio = best["makespan_s"] / j["makespan_s"]
        held.append(ratio)
        if ratio < 1.0:
            losses.append((ratio, label, best, j))
    refused += len({r["label"] for r in runs if r["part"] == "held-out"} - set(_by_label(runs, "held-out")))
    losses.sort(key=lambda x: x[0])
    nan = float("nan")
    spread = (f"median {statistics.median(held) if held else nan:.2f}x, lowest {min(held, default=nan):.3f}x, "
              f"highest {max(held, default=nan):.2f}x")
    loss_rows = [[label, f"{best['makespan_s']:.1f} ({best['policy']})", f"{j['makespan_s']:.1f}",
                  f"{ratio:.3f}x", f"{j['bound_s']:.1f}"] for ratio, label, best, j in losses]
    text = f"""## A single job on its own nodes (`benchmarks/single_job.py`)

One RL job alone on its pool, where most users start: nothing to multiplex, so what jigsaw
adds is its mechanisms on the job's own steps. Simulated, seed 0, the default predictor,
each run its own process. Each pipeline of the bundled workloads on its static share:
verl-sync at its rollout width and at tensor-parallel 2 and 4 ("best verl-sync": the
fastest of the three), and jigsaw; its gap recovered against the run's own makespan lower
bound (target of issue 12: 70%).

{md_table(["pipeline on its share (GPUs)", "verl-sync s", "best verl-sync s", "jigsaw s", "jigsaw / verl-sync",
           "jigsaw / best verl-sync", "lower bound s", "gap recovered"], rows)}

Against the best verl-sync: median {statistics.median(ratios):.2f}x, lowest {min(ratios):.2f}x, highest
{max(ratios):.2f}x over {len(ratios)} pipelines.

Held out: each pipeline of {data['mixes']} synthetic mixes drawn from seed {data['seed']}
(`random_mixes.synthetic_mixes`, never run while the policy was built) alone on the share it was
drawn with, jigsaw against the best of the baselines that run its mode (verl-sync; an
asynchronous one also one-step-off, streamrl and areal). {len(held)} ran, {refused} refused by
jigsaw or by every baseline (a share too small for its trainer: a `SpecError` naming the field).
jigsaw against the best: {spread}; a baseline finished first on {len(losses)}{':' if losses else '.'}

{md_table(["pipeline on its share", "best baseline s", "jigsaw s", "jigsaw / best", "lower bound s"], loss_rows) if losses else ""}

`python benchmarks/single_job.py`
"""
    return text


def main() -> int:
    seed, mixes = HELD_OUT_SEED, HELD_OUT_MIXES
    argv = sys.argv[1:]
    if "--seed" in argv:
        seed = int(argv[argv.index("--seed") + 1])
    if "--mixes" in argv:
        mixes = int(argv[argv.index("--mixes") + 1])
    measure_and_write(BLOCK, RESULTS, measure, render, (tuple(BUNDLED), seed, mixes), (("d",), seed, 0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
