"""Preemption tolerance and cost-aware heterogeneous workers, simulated.

1. Throughput under preemption rates of 0, 1 and 5 per device-hour (the rollout devices
   preemptible, replaced after 120 s; trainers on demand), jigsaw's recovery
   (``migrate``: a preempted replica's requests resume on the others with their tokens,
   re-prefill priced) against the baseline that restarts the step (``restart``: the
   preempted worker's requests and every request of the same step still in flight are
   generated again from their first token).
2. Cost efficiency: an all-on-demand H100 pool against H100 trainers with A100 spot
   rollout workers (preemptible at 1 per device-hour), as many as the pool's or as many as
   ``jigsaw plan`` provisions. Prices are assumed list prices (H100 on demand 4.00, A100
   spot 1.20 per device-hour).

    python benchmarks/preemption.py            # run, print, write the <!-- preemption --> block
    python benchmarks/preemption.py --quick    # one seed, print only
"""

from __future__ import annotations

import copy
import os
import statistics
import sys
import time

from common import EXAMPLES, ROOT, load, md_table, measure_and_write  # noqa: F401

from jigsaw_plugin.plan import plan_pipeline
from jigsaw_plugin.scheduler import get_policy
from jigsaw_plugin.sim import Simulation
from jigsaw_plugin.workload import load_workload

RESULTS = ROOT / "benchmarks" / "results" / "preemption.json"
START, END = "<!-- preemption:start -->", "<!-- preemption:end -->"
H100_PRICE, A100_SPOT_PRICE = 4.0, 1.2
REPLACE_S = 120.0
RATES = (0.0, 1.0, 5.0)
POLICIES = ("one-step-off", "areal")
ROLLOUT, TRAINER = 8, 4


def _pipeline() -> dict:
    """dapo-math-async of workload (c) (lengths fitted to PolyTrace verl/), 128 x 16 samples
    per step, 8 steps, staleness 1."""
    p = copy.deepcopy(load_workload(EXAMPLES / "c_async2_16gpu.yaml").to_dict()["pipelines"][0])
    p.update(prompts_per_step=128, steps=8)
    p.pop("gpus", None)
    return p


def _spot_pool(rate: float) -> dict:
    pre = {"rate_per_hour": rate, "replace_s": REPLACE_S}
    return {"version": 1, "pipelines": [_pipeline()], "cluster": {"classes": [
        {"name": "rollout", "gpu": "h100", "count": ROLLOUT, "price_per_hour": H100_PRICE, "preemptible": pre},
        {"name": "trainer", "gpu": "h100", "count": TRAINER, "price_per_hour": H100_PRICE}]}}


def _on_demand() -> dict:
    return {"version": 1, "pipelines": [_pipeline()],
            "cluster": {"gpus": ROLLOUT + TRAINER, "gpu": "h100", "gpus_per_node": 8, "price_per_hour": H100_PRICE}}


def _hetero(n: int, rate: float = 1.0) -> dict:
    return {"version": 1, "pipelines": [_pipeline()], "cluster": {"classes": [
        {"name": "a100-spot", "gpu": "a100", "count": n, "gpus_per_node": 8, "price_per_hour": A100_SPOT_PRICE,
         "preemptible": {"rate_per_hour": rate, "replace_s": REPLACE_S}},
        {"name": "h100", "gpu": "h100", "count": TRAINER, "price_per_hour": H100_PRICE}]}}


def _run(job) -> dict:
    workload, policy, options, seed, recovery = job
    t0 = time.perf_counter()
    r = Simulation(load(workload), get_policy(policy, **options), seed, preemption_recovery=recovery).run()
    r["wall_s"] = time.perf_counter() - t0
    return r


def _many(jobs: list) -> list:
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=2, max_tasks_per_child=1) as ex:
        return list(ex.map(_run, jobs))


def measure(seeds) -> dict:
    t0 = time.time()
    jobs, keys = [], []
    for policy in POLICIES:
        opts = {"rollout_gpus": ROLLOUT}
        for rate in RATES:
            for recovery in (("migrate",) if rate == 0 else ("migrate", "restart")):
                for seed in seeds:
                    jobs.append((_spot_pool(rate), policy, opts, seed, recovery))
                    keys.append(("rates", policy, rate, recovery, seed))
    # cost efficiency: the plan's A100 spot pool, and as many A100 spot as the on-demand pool has
    prov = plan_pipeline(load(_hetero(16)), trainer_gpus=TRAINER, trainer_class="h100")
    n_plan = prov.rollout_devices
    pools = {"all on demand: 12 x H100": (_on_demand(), ROLLOUT),
             f"4 x H100 + {ROLLOUT} x A100 spot": (_hetero(ROLLOUT), ROLLOUT),
             f"4 x H100 + {n_plan} x A100 spot (jigsaw plan)": (_hetero(n_plan), n_plan)}
    for name, (w, n) in pools.items():
        for seed in seeds:
            jobs.append((w, "one-step-off", {"rollout_gpus": n}, seed, "migrate"))
            keys.append(("cost", name, seed))
    results = _many(jobs)
    rates, cost = [], []
    for k, r in zip(keys, results):
        row = {"samples_per_s": r["samples_per_s"], "makespan_s": r["makespan_s"], "cost": r["cost"]["total"],
               "samples_per_cost": r["cost"]["samples_per_cost"], "preemptions": r["preemptions"]["preemptions"],
               "resumed_requests": r["preemptions"]["resumed_requests"],
               "restarted_stages": r["preemptions"]["restarted_stages"], "wall_s": r["wall_s"],
               "max_staleness": max(p["max_staleness"] for p in r["pipelines"].values())}
        if k[0] == "rates":
            rates.append(dict(row, policy=k[1], rate=k[2], recovery=k[3], seed=k[4]))
        else:
            cost.append(dict(row, pool=k[1], seed=k[2]))
    return {"rates": rates, "cost": cost, "plan": prov.as_dict(), "seeds": list(seeds),
            "wall_s": time.time() - t0, "load": os.getloadavg()}


def _mean(rows, key):
    return statistics.mean(r[key] for r in rows)


def render(data: dict) -> str:
    seeds = len(data["seeds"])
    out = [START, "## Preemption tolerance and heterogeneous workers (simulated)", "",
           f"One asynchronous pipeline (dapo-math-async of workload (c): 128 x 16 samples per step, 8 steps, "
           f"staleness 1) on {ROLLOUT} rollout + {TRAINER} trainer H100; the rollout devices (spot workers) are "
           f"preemptible at the given rate per device-hour (Poisson, seeded), replaced after {REPLACE_S:.0f} s; "
           "the trainers are on demand (a preempted trainer's restart is tested in tests/test_preemption.py). "
           "`migrate` is jigsaw's "
           "recovery (sim/preemption.py): the preempted replica's in-flight requests resume on the other "
           "replicas through the migration path with the tokens they had (re-prefill priced), a replacement "
           "pulls the latest weights, a training stage restarts from the last checkpointed version. `restart` "
           "is the baseline that restarts the step: the preempted worker's in-flight requests, and every "
           "request of the same step still in flight elsewhere, are generated again from their first token. Mean of "
           f"{seeds} seed(s); same samples trained in every run (tests/test_preemption.py). "
           "Reproduce: `python benchmarks/preemption.py`.", ""]
    rows = []
    for policy in POLICIES:
        base = [r for r in data["rates"] if r["policy"] == policy and r["rate"] == 0]
        b = _mean(base, "samples_per_s")
        for rate in RATES:
            for recovery in (("migrate",) if rate == 0 else ("migrate", "restart")):
                sel = [r for r in data["rates"] if r["policy"] == policy and r["rate"] == rate
                       and r["recovery"] == recovery]
                rows.append([policy, f"{rate:g}", recovery, f"{_mean(sel, 'preemptions'):.1f}",
                             f"{_mean(sel, 'resumed_requests'):.0f}", f"{_mean(sel, 'restarted_stages'):.1f}",
                             f"{_mean(sel, 'samples_per_s'):.2f}", f"{_mean(sel, 'samples_per_s') / b:.1%}",
                             max(r["max_staleness"] for r in sel)])
    out += [md_table(["policy", "preemptions / device-hour", "recovery", "preemptions", "requests moved",
                      "stages restarted", "samples/s", "of no preemption", "max staleness"], rows), "",
            f"Load average at the end: {' / '.join(f'{x:.1f}' for x in data['load'])} (2 cores shared; "
            "simulated time, so load does not change these numbers).", ""]
    plan = data["plan"]
    out += ["Cost efficiency: the same pipeline on an all-on-demand pool against H100 trainers with A100 spot "
            f"rollout workers (preemptible at 1 per device-hour), prices assumed: H100 on demand {H100_PRICE:.2f}, "
            f"A100 spot {A100_SPOT_PRICE:.2f} per device-hour; cost = devices x makespan x price, downtime of "
            f"preempted devices not billed; one-step-off. `jigsaw plan` provisions {plan['rollout_devices']} A100 "
            f"spot for this pipeline (predicted learner utilisation {plan['learner_utilisation']:.0%}, bounded by "
            f"the {plan['limit']}).", ""]
    names = list(dict.fromkeys(r["pool"] for r in data["cost"]))
    ref = _mean([r for r in data["cost"] if r["pool"] == names[0]], "samples_per_cost")
    rows = []
    for name in names:
        sel = [r for r in data["cost"] if r["pool"] == name]
        rows.append([name, f"{_mean(sel, 'samples_per_s'):.2f}", f"{_mean(sel, 'makespan_s'):.0f}",
                     f"{_mean(sel, 'cost'):.2f}", f"{_mean(sel, 'samples_per_cost'):.0f}",
                     f"{_mean(sel, 'samples_per_cost') / ref:.2f}x", f"{_mean(sel, 'preemptions'):.1f}"])
    out += [md_table(["pool", "samples/s", "makespan s", "cost", "samples per cost", "vs on demand",
                      "preemptions"], rows), "",
            f"Wall time of the whole benchmark {data['wall_s']:.0f} s.", END]
    return "\n".join(out)


def main() -> int:
    measure_and_write("preemption", RESULTS, measure, render, (0, 1, 2), (0,))
    return 0


if __name__ == "__main__":
    sys.exit(main())
