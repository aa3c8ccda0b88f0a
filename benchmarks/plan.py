"""ECHO-2's provisioning rule (``jigsaw plan``) against simulated sweeps of the rollout share.

For each case, one asynchronous pipeline with a fixed trainer gang; the rollout pool is
swept (one-step-off, or AReaL at staleness 2, with ``rollout_gpus = n`` on a cluster of
trainer + n devices: rollout
devices first, so a listed rollout class takes them), each point simulated, and the
throughput per cost (samples per price unit: every provisioned device x makespan x its
price per hour) compared with the rule's choice. The rule must come within 10% of the
sweep's best. Prices are illustrative list prices (assumed, not quoted): H100 on demand
4.00, A100 spot 1.20 per device-hour.

    python benchmarks/plan.py            # run, print, write the <!-- plan --> block
    python benchmarks/plan.py --quick    # fewer points, print only
    python benchmarks/plan.py --render   # the block again from benchmarks/results/plan.json
"""

from __future__ import annotations

import copy
import os
import sys
import time

from common import EXAMPLES, ROOT, load, md_table, measure_and_write, run_many  # noqa: F401

from jigsaw_plugin.plan import evaluate, plan_pipeline
from jigsaw_plugin.workload import load_workload

RESULTS = ROOT / "benchmarks" / "results" / "plan.json"
START, END = "<!-- plan:start -->", "<!-- plan:end -->"
H100_PRICE, A100_SPOT_PRICE = 4.0, 1.2
TRAINER = 4


def _pipeline(prompts: int = 128, steps: int = 6) -> dict:
    """dapo-math-async of workload (c) (lengths fitted to PolyTrace verl/), smaller steps."""
    p = copy.deepcopy(load_workload(EXAMPLES / "c_async2_16gpu.yaml").to_dict()["pipelines"][0])
    p.update(prompts_per_step=prompts, steps=steps)
    p.pop("gpus", None)
    return p


def _single(n: int) -> dict:
    return {"version": 1, "pipelines": [_pipeline()],
            "cluster": {"gpus": TRAINER + n, "gpu": "h100", "gpus_per_node": 8, "price_per_hour": H100_PRICE}}


def _hetero(n: int) -> dict:
    return {"version": 1, "pipelines": [_pipeline()],
            "cluster": {"classes": [
                {"name": "a100-spot", "gpu": "a100", "count": n, "gpus_per_node": 8, "price_per_hour": A100_SPOT_PRICE},
                {"name": "h100", "gpu": "h100", "count": TRAINER, "price_per_hour": H100_PRICE}]}}


def _single_s2(n: int) -> dict:
    d = _single(n)
    d["pipelines"][0]["staleness"] = 2
    return d


CASES = [
    # (name, builder, swept rollout devices, rollout class name in the rule's answer, policy)
    ("H100 only, staleness 1 (one-step-off): trainer 4 x H100, rollout n x H100", _single,
     (1, 2, 3, 4, 5, 6, 8), "h100", "one-step-off"),
    ("heterogeneous, staleness 1 (one-step-off): trainer 4 x H100, rollout n x A100 spot", _hetero,
     (1, 2, 3, 4, 5, 6, 8, 10), "a100-spot", "one-step-off"),
    ("H100 only, staleness 2 (AReaL, generation up to 2 versions ahead): trainer 4 x H100, rollout n x H100",
     _single_s2, (1, 2, 3, 4, 6, 8), "h100", "areal"),
]
QUICK = [(n, b, pts[:4], c, pol) for n, b, pts, c, pol in CASES]


def measure(cases) -> list:
    out = []
    for name, build, points, cls, policy in cases:
        wl = load(build(max(points)))
        trainer_class = "h100"
        prov = plan_pipeline(wl, trainer_gpus=TRAINER, trainer_class=trainer_class)
        jobs = [(build(n), policy, {"rollout_gpus": n}, 0) for n in points]
        t0 = time.process_time()
        results = run_many(jobs)
        rows = []
        for n, r in zip(points, results):
            model = evaluate(prov.inputs, {cls: n})
            rows.append({"n": n, "samples_per_s": r["samples_per_s"], "makespan_s": r["makespan_s"],
                         "mean_step_s": r["pipelines"][wl.pipelines[0].name]["mean_step_s"],
                         "cost": r["cost"]["total"], "samples_per_cost": r["cost"]["samples_per_cost"],
                         "model_step_s": model.step_s, "model_utilisation": model.learner_utilisation,
                         "model_samples_per_cost": 1.0 / model.cost_per_sample, "wall_s": r["wall_s"]})
        out.append({"case": name, "rule": prov.as_dict(), "rows": rows,
                    "cpu_s_parent": time.process_time() - t0, "load": os.getloadavg()})
    return out


def _verdict(case: dict) -> tuple[int, int, float]:
    rows = case["rows"]
    best = max(rows, key=lambda r: r["samples_per_cost"])
    n_rule = case["rule"]["rollout_devices"]
    at = {r["n"]: r for r in rows}
    if n_rule not in at:  # the rule chose a point the sweep did not run
        return n_rule, best["n"], float("nan")
    return n_rule, best["n"], at[n_rule]["samples_per_cost"] / best["samples_per_cost"]


def render(data: list) -> str:
    out = [START, "## Provisioning rule (`jigsaw plan`) against a sweep of the rollout share (simulated)", "",
           "ECHO-2's capacity model (docs/plan.md) picks the rollout pool for one asynchronous pipeline "
           "(dapo-math-async of workload (c), 128 prompts x 16 samples per step, 6 steps) with "
           "a trainer of 4 H100; the simulator runs the named policy at every rollout size n (its "
           "`rollout_gpus`). Throughput per cost "
           "= samples / (every provisioned device x makespan x its price per hour); prices are assumed list "
           f"prices: H100 on demand {H100_PRICE:.2f}, A100 spot {A100_SPOT_PRICE:.2f} per device-hour. "
           "The model's step time is steady state; the simulated mean step includes the first generation "
           "(nothing to overlap it with). Reproduce: `python benchmarks/plan.py`.", ""]
    for case in data:
        n_rule, n_best, ratio = _verdict(case)
        rule = case["rule"]
        out += [f"### {case['case']}", "",
                f"Rule: {rule['rollout_devices']} rollout device(s) ({', '.join(f'{v} x {k}' for k, v in rule['rollout'].items())}); "
                f"T_train {rule['inputs']['train_s']:.1f} s, T_dis {rule['dissemination_s']:.2f} s, "
                f"predicted step {rule['step_s']:.1f} s (bounded by the {rule['limit']}), learner utilisation "
                f"{rule['learner_utilisation']:.0%}. Sweep best: n = {n_best}. The rule's choice reaches "
                f"**{ratio:.1%}** of the best throughput per cost ({'within' if ratio >= 0.9 else 'NOT within'} 10%).",
                ""]
        rows = [[r["n"] if r["n"] != n_rule else f"**{r['n']}** (rule)", f"{r['samples_per_s']:.2f}",
                 f"{r['mean_step_s']:.1f}", f"{r['model_step_s']:.1f}", f"{r['model_utilisation']:.0%}",
                 f"{r['samples_per_cost']:.0f}", f"{r['model_samples_per_cost']:.0f}"] for r in case["rows"]]
        out += [md_table(["rollout n", "sim samples/s", "sim mean step s", "model step s", "model learner util",
                          "sim samples per cost", "model samples per cost"], rows), "",
                f"Load average while it ran: {' / '.join(f'{x:.1f}' for x in case['load'])} (2 cores shared).", ""]
    out.append(END)
    return "\n".join(out)


def main() -> int:
    data = measure_and_write("plan", RESULTS, measure, render, CASES, QUICK)
    return 0 if all(_verdict(c)[2] >= 0.9 for c in data) else 1


if __name__ == "__main__":
    sys.exit(main())
