"""How well a replica's drain is predicted: its longest remaining request, in tokens.

    python3 benchmarks/drain_accuracy.py            # (a)-(f), save, write the block
    python3 benchmarks/drain_accuracy.py --render   # re-render the saved results
    python3 benchmarks/drain_accuracy.py --quick    # (e) only; print, write nothing

The policy prices tails by when each replica empties (``ReplicaView.predicted_drain_s``):
the longer of its predicted longest request (``predicted_tokens_left``: the largest of its
requests' predicted remaining tokens, each a mean) and its predicted work at the current
batch. ``benchmarks/predictor_accuracy.py`` scores the per-request means; this scores what
the policy builds from them. A probe (a ``jigsaw_schedule`` hook wrapper) reads every
``--every``-th round's replicas after the policy has decided and sets each beside the
truth the simulator holds: the longest true remaining of the requests the replica holds
(running and queued; this turn's, as the predictions are), and the sum. Beside the
policy's figure, an order statistic of the same means: ``E[max]`` of independent
exponential remainders with those means, which a largest mean (the largest of the
expected values, not the expected largest) never reaches when many requests remain.

The probe's reads are observations the policy did not make itself (a replica's request
views are read again, its unseen requests predicted), so the probed run's decisions, and
its makespan (in the table), may differ from an unprobed run's. jigsaw with its defaults,
the default predictor, seed 0. Writes the block ``drain-accuracy`` of docs/benchmarks.md
and benchmarks/results/drain_accuracy.json.
"""

from __future__ import annotations

import math
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from common import BUNDLED, ROOT, load, md_table, measure_and_write

sys.path.insert(0, str(ROOT))
from jigsaw_plugin.hookspecs import hookimpl  # noqa: E402

WORKLOADS = BUNDLED
BUCKETS = ((1, 1), (2, 4), (5, 16), (17, 64), (65, None))  # requests a replica holds
EVERY = 20  # probe every this many decide rounds
RESULTS = ROOT / "benchmarks" / "results" / "drain_accuracy.json"


def expected_max_exponential(means, points: int = 2000) -> float:
    """``E[max_i X_i]`` for independent exponential ``X_i`` with ``means`` (those <= 0 hold
    nothing): the integral of ``1 - prod_i P(X_i <= x)`` over ``x``, on a grid to where the
    largest mean's tail is below e^-12 for every one of them. n equal means m give m x H_n
    (the n-th harmonic number); one mean gives itself."""
    m = np.asarray(means, float)
    m = m[m > 0]
    if not len(m):
        return 0.0
    top = float(m.max()) * (math.log(len(m)) + 12.0)
    x = np.linspace(0.0, top, points)
    below = np.prod(-np.expm1(-x[:, None] / m[None, :]), axis=1)
    return float(np.trapezoid(1.0 - below, x))


def _bucket_label(lo: int, hi: int | None) -> str:
    return f"{lo}" if hi == lo else f"{lo}+" if hi is None else f"{lo}-{hi}"


def summarise(rows: list) -> list:
    """Per bucket of requests held (``BUCKETS``): the replicas probed, and the median and
    10th / 90th percentiles of predicted over true longest remaining (the policy's largest
    mean and ``E[max]``), their median |log| errors, and the median predicted over true work.
    ``rows``: (requests held, largest mean, E[max], true longest, predicted work, true work);
    rows whose true longest is 0 (every request at its last token) are left out."""
    a = np.asarray(rows, float).reshape(-1, 6)
    a = a[a[:, 3] > 0]
    out = []
    for lo, hi in BUCKETS:
        sel = (a[:, 0] >= lo) & (a[:, 0] <= (hi if hi is not None else np.inf))
        if not sel.any():
            continue
        n, mean_max, e_max, truth, work, true_work = a[sel].T
        ours, order = mean_max / truth, e_max / truth
        out.append({"requests": _bucket_label(lo, hi), "replicas": int(sel.sum()),
                    "largest_mean": [float(np.percentile(ours, q)) for q in (10, 50, 90)],
                    "e_max": [float(np.percentile(order, q)) for q in (10, 50, 90)],
                    "largest_mean_log_err": float(np.median(np.abs(np.log(np.maximum(ours, 1e-9))))),
                    "e_max_log_err": float(np.median(np.abs(np.log(np.maximum(order, 1e-9))))),
                    "work": float(np.median(work / np.maximum(true_work, 1.0)))})
    return out


class _Probe:
    """After every ``every``-th round's decisions: each replica holding requests, its
    predictions beside the truth of the simulation (``world``)."""

    def __init__(self, every: int):
        self.every, self.rounds, self.world, self.rows = every, 0, None, []

    @hookimpl(hookwrapper=True)
    def jigsaw_schedule(self, state):
        yield
        self.rounds += 1
        if self.rounds % self.every:
            return
        for p in state.order:
            for v in p.replicas:
                rep = self.world.replicas.get(v.id)
                if v.retiring or not v.load or rep is None:
                    continue
                truth = rep.true_remaining()
                means = [q.predicted_remaining for q in v.requests]
                self.rows.append((v.load, float(v.predicted_tokens_left), expected_max_exponential(means),
                                  float(max(truth, default=0)), float(v.predicted_work_tokens), float(sum(truth))))


def probed_run(fname: str, every: int, predictor: str = "history") -> tuple["_Probe", dict]:
    """jigsaw (defaults, seed 0) on workload ``fname`` with a ``_Probe`` every ``every``
    rounds: (the probe, the run's result)."""
    from jigsaw_plugin.manager import get_plugin_manager, register
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.sim import Simulation

    pm = get_plugin_manager()
    probe = _Probe(every)
    register(pm, probe, "drain-accuracy-probe")
    sim = Simulation(load(fname), get_policy("jigsaw"), 0, pm=pm, predictor=predictor)
    probe.world = sim.world
    return probe, sim.run()


def measure_one(job: tuple) -> dict:
    """(key, workload file, every) -> the probed run's figures, in this process."""
    key, fname, every = job
    probe, result = probed_run(fname, every)
    return {"workload": key, "makespan_s": result["makespan_s"], "rounds": probe.rounds,
            "probed": len(probe.rows), "buckets": summarise(probe.rows)}


def measure(keys: list) -> dict:
    with ProcessPoolExecutor(max_workers=2, max_tasks_per_child=1) as ex:
        runs = list(ex.map(measure_one, [(k, WORKLOADS[k], EVERY) for k in keys]))
    return {"every": EVERY, "runs": runs}


def _pct(x: list) -> str:
    return f"{x[1]:.2f} ({x[0]:.2f}-{x[2]:.2f})"


def render(data: dict) -> str:
    rows = []
    for run in data["runs"]:
        for b in run["buckets"]:
            rows.append([f"({run['workload']})", b["requests"], f"{b['replicas']:,}", _pct(b["largest_mean"]),
                         f"{b['largest_mean_log_err']:.2f}", _pct(b["e_max"]), f"{b['e_max_log_err']:.2f}",
                         f"{b['work']:.2f}"])
    runs = "; ".join(f"({r['workload']}) {r['makespan_s']:.1f} s, {r['probed']:,} replicas probed in "
                     f"{r['rounds']:,} rounds" for r in data["runs"])
    return (
        "## How well a replica's drain is predicted (`benchmarks/drain_accuracy.py`)\n\n"
        "The policy prices a tail by when each replica empties: its longest remaining request, "
        "read as the largest of its requests' predicted remaining tokens (`predicted_tokens_left`; "
        "each a mean). Every "
        f"{data['every']}th decide round of jigsaw (defaults, default predictor, seed 0), each replica "
        "holding requests is set beside the simulator's truth: the longest true remaining of its requests "
        "(this turn's), by how many it holds. Beside it, an order statistic of the same means: E[max] of "
        "independent exponential remainders with those means. Ratios are predicted / true (median, "
        "10th-90th percentile); log error: the median of the absolute log of the ratio; work: the sum of "
        "the means over the true sum (median).\n\n"
        + md_table(["workload", "requests held", "replicas", "largest mean / true longest",
                    "its log error", "E[max] / true longest", "its log error", "work / true work"], rows)
        + f"\n\nThe probed runs (their reads may move decisions): {runs}.\n\n"
        "`python benchmarks/drain_accuracy.py`\n")


def main() -> None:
    measure_and_write("drain-accuracy", RESULTS, measure, render, list(WORKLOADS), ["e"])


if __name__ == "__main__":
    main()
