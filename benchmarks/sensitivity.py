"""How far a run moves under a change to the cost model too small to matter physically:
the noise floor that a policy change's measured effect on one run must clear.

    python3 benchmarks/sensitivity.py            # (a)-(f), seed 0, save, write the block
    python3 benchmarks/sensitivity.py --render   # re-render the saved results
    python3 benchmarks/sensitivity.py --quick    # (c) only; print, write nothing

Each bundled workload runs at seed 0 under jigsaw (its defaults, the default predictor) and
verl-sync at the fitted cost model and with the engines' per-step host time
(``EfficiencyFactors.decode_step_overhead_s``, 1.6 ms on an H100) scaled by 1 +- 1e-4 and
1 +- 2e-4: every decode step moves by at most 0.3 us, so the makespan itself should move
by at most about 2e-4 of the decode's share of it. What moves it more is the schedule: a
stage that becomes ready a few microseconds sooner or later can take other devices, and the
run goes on differently from there. Writes the block ``sensitivity`` of
docs/benchmarks.md and benchmarks/results/sensitivity.json.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys

from common import EXAMPLES, ROOT, md_table, measure_and_write, run_many

sys.path.insert(0, str(ROOT))
from jigsaw_plugin.bench.ab import gap_share  # noqa: E402
from jigsaw_plugin.bench.bundled import benchmark_workload  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "sensitivity.json"
BLOCK = "sensitivity"
KEYS = ("a", "b", "c", "d", "e", "f")
SCALES = (1.0, 1 + 1e-4, 1 - 1e-4, 1 + 2e-4, 1 - 2e-4)  # the first: the fitted model
POLICIES = ("jigsaw", "verl-sync")


def run(job: tuple) -> dict:
    """(workload file, policy, scale) -> the makespan and its lower bound with the host time
    per decode step scaled by ``scale`` on every device class."""
    from jigsaw_plugin.costmodel.predictor import default_factors
    from jigsaw_plugin.costmodel.profiles import hardware_profile
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.sim import Simulation
    from jigsaw_plugin.workload import load_workload

    path, policy, scale = job
    wl = load_workload(path)
    gpu = wl.cluster.device_classes()[0].gpu
    base = default_factors(hardware_profile(gpu, "cluster.gpu"))
    factors = dataclasses.replace(base, decode_step_overhead_s=base.decode_step_overhead_s * scale)
    result = Simulation(wl, get_policy(policy), 0, factors=factors).run()
    return {"makespan_s": result["makespan_s"], "bound_s": result["bounds"]["makespan_lower_bound_s"]}


def measure(keys) -> dict:
    where = [(k, policy, scale) for k in keys for policy in POLICIES for scale in SCALES]
    got = run_many([(str(EXAMPLES / benchmark_workload(k).file), policy, scale) for k, policy, scale in where],
                   fn=run)
    data: dict = {}
    for (k, policy, scale), one in zip(where, got):
        data.setdefault(k, {}).setdefault(policy, []).append({"scale": scale, **one})
    return data


def moves(runs: list) -> list:
    """Each perturbed run's makespan change against the fitted model's, as a fraction."""
    base = runs[0]["makespan_s"]
    return [r["makespan_s"] / base - 1 for r in runs[1:]]


def _gaps(by_policy: dict) -> list:
    """jigsaw's gap recovered against verl-sync at each scale (``bench.ab.gap_share``),
    each run against its own scale's verl-sync run and bound; none where verl-sync's run is
    not above its bound."""
    got = [gap_share(v["makespan_s"], j["makespan_s"], v["bound_s"])
           for j, v in zip(by_policy["jigsaw"], by_policy["verl-sync"])]
    return [g for g in got if g is not None]


def render(data: dict) -> str:
    rows = []
    largest = {}
    for k, by_policy in data.items():
        gaps = _gaps(by_policy) if {"jigsaw", "verl-sync"} <= set(by_policy) else []
        for policy, runs in by_policy.items():
            moved = moves(runs)
            big = max(abs(m) for m in moved)
            largest.setdefault(policy, []).append(big)
            gap = (f"{gaps[0]:.0%} ({min(gaps[1:]):.0%} - {max(gaps[1:]):.0%})"
                   if policy == "jigsaw" and len(gaps) == len(runs) > 1 else "")
            rows.append([f"({k})", policy, f"{runs[0]['makespan_s']:.1f}",
                         ", ".join(f"{r['makespan_s']:.1f}" for r in runs[1:]),
                         f"{big:.2%}", f"{statistics.median(abs(m) for m in moved):.2%}",
                         sum(1 for m in moved if abs(m) > 1e-4), f"{runs[0]['bound_s']:.1f}", gap])
    head = ["workload", "policy", "makespan s (fitted model)",
            "makespan s (host time per step x 1+1e-4, 1-1e-4, 1+2e-4, 1-2e-4)", "largest change",
            "median change", "runs moved over 0.01%", "makespan lower bound s (fitted model)",
            "gap recovered vs verl-sync: fitted model (perturbed runs)"]
    j = largest.get("jigsaw", [0.0])
    v = largest.get("verl-sync", [0.0])
    # where the fitted model's run sits among its neighbours: a figure tuned to (or lucky
    # at) that one point is faster than most of them
    sides = "; ".join(f"({k}) {sum(m > 1e-4 for m in moves(p['jigsaw']))} slower, "
                      f"{sum(m < -1e-4 for m in moves(p['jigsaw']))} faster"
                      for k, p in data.items() if "jigsaw" in p)
    reading = (
        f"Reading: a change to the cost model of at most 2e-4 of one term moves jigsaw's runs by up to "
        f"{max(j):.2%} (median over the workloads of each one's largest change {statistics.median(j):.2%}); "
        f"verl-sync's by up to {max(v):.2%}. verl-sync's schedule is fixed by its spec, so its makespan moves "
        "with the durations alone; jigsaw decides from the state at each instant, and a stage ready a few "
        "microseconds sooner or later can take other devices and the run goes on differently. So a policy "
        "change measured on one run is read against these figures: an effect on a run below that "
        "workload's largest change here says nothing by itself; what counts is its sign and size over many "
        "runs (the seeds, the synthetic and held-out mixes), as the notes in docs/simulator.md weigh them. "
        f"jigsaw's perturbed runs against its run at the fitted model: {sides}.")
    return "\n\n".join([
        "## How far a run moves under a change too small to matter (`benchmarks/sensitivity.py`)",
        "Seed 0. Each bundled workload at the fitted cost model and with the engines' host time per "
        "decode step (`decode_step_overhead_s`) scaled by 1 +- 1e-4 and 1 +- 2e-4: each decode step "
        "moves by at most 0.3 us, so a makespan should move by at most about 0.02% of its decode's "
        "share. \"Largest\" and \"median change\": of the four perturbed runs against the fitted "
        "model's, absolute. The lower bound is the run's own (`bounds.makespan_lower_bound_s`; the "
        "perturbed runs' bounds move by under 0.01%); jigsaw's gap recovered is against verl-sync at "
        "the same scale: how far issue 12's figure moves with the run.",
        md_table(head, rows), reading, "`python benchmarks/sensitivity.py`"])


def main() -> None:
    measure_and_write(BLOCK, RESULTS, measure, render, KEYS, ("c",))


if __name__ == "__main__":
    main()
