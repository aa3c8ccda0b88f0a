"""Training gangs priced with their expected restarts (``JigsawConfig.restart_pricing``), on
against off, where devices are preempted (simulated).

A training pass loses its progress whenever a device of its gang is preempted and runs
again once the replacement joins, so the jigsaw policy prices each candidate gang with the
restarts the preemptions seen so far foretell (scheduler/jigsaw/restarts.py). Off, gangs
are priced as if their devices stayed (the build before stop 67, less its fixes to pricing
a grown stage at its own class).

1. Spot pools: dapo-math-async of workload (c) (128 x 16 samples a step, 8 steps,
   staleness 1) on 12 H100, every device preemptible at 1, 5 and 20 per device-hour (and
   at 0, where on and off must be the same run),
   replaced after 120 s (a spot market's order of magnitude: a device lost every few hours
   to every few minutes); seeds 0-8 (the preemption times: at 5 and 20 per device-hour a
   run's makespan moves with the draws by 0.6-1.7x a seed).
2. The odd workloads of ``odd_workloads.py --preempt`` (1-4 pipelines on 1-3 device
   classes, each preemptible at even odds at 200-20,000 per device-hour) with a
   preemptible class that jigsaw ran on stop 67's build (stop 68's also runs 17, 22, 25
   and 26, pools that run until the simulator's 100,000 preemptions are spent:
   not added), under jigsaw and jigsaw with cost-aware activation off (training on any
   class), simulation seeds 0-4 each.

    python benchmarks/restart_pricing.py            # run, print, write the <!-- restart-pricing --> block
    python benchmarks/restart_pricing.py --quick    # one seed, a few odd workloads, print only
    python benchmarks/restart_pricing.py --render   # re-render the saved results
"""

from __future__ import annotations

import copy
import math
import os
import statistics
import time
import traceback
from concurrent.futures import ProcessPoolExecutor

from common import EXAMPLES, ROOT, load, md_table, measure_and_write
from odd_workloads import CPU_S, OverCpu, limit_cpu, spec_of, with_classes, with_preemption

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.scheduler import get_policy
from jigsaw_plugin.sim import Simulation
from jigsaw_plugin.workload import load_workload

RESULTS = ROOT / "benchmarks" / "results" / "restart_pricing.json"
RATES = (0.0, 1.0, 5.0, 20.0)  # 0: no preemption, where on and off must match
REPLACE_S = 120.0
DEVICES = 12
# the odd --preempt workloads of seeds 0-69 with a preemptible class that jigsaw ran on stop 67's build
ODD_SEEDS = (2, 18, 24, 28, 30, 35, 36, 48, 51, 52, 56, 58, 61, 63, 68, 69)
VARIANTS = {"jigsaw": {}, "jigsaw-activation-off": {"cost_aware": False}}


def _spot(rate: float) -> dict:
    p = copy.deepcopy(load_workload(EXAMPLES / "c_async2_16gpu.yaml").to_dict()["pipelines"][0])
    p.update(prompts_per_step=128, steps=8)
    p.pop("gpus", None)
    spot = {"name": "spot", "gpu": "h100", "count": DEVICES, "gpus_per_node": 8}
    if rate:
        spot["preemptible"] = {"rate_per_hour": rate, "replace_s": REPLACE_S}
    return {"version": 1, "pipelines": [p], "cluster": {"classes": [spot]}}


def _odd(seed: int) -> dict:
    return with_preemption(with_classes(spec_of(seed), seed), seed)


def _run(job: tuple) -> dict:
    kind, key, variant, pricing, seed = job
    spec = _spot(key) if kind == "spot" else _odd(key)
    options = dict(VARIANTS[variant], restart_pricing=pricing)
    row = {"kind": kind, "key": key, "variant": variant, "pricing": pricing, "seed": seed}
    t0 = time.process_time()
    try:
        r = Simulation(load(spec), get_policy("jigsaw", **options), seed).run()
    except SpecError as e:
        return dict(row, outcome="refused", detail=str(e))
    except OverCpu:
        return dict(row, outcome="slow", detail=f"past {CPU_S} CPU seconds")
    except Exception:  # a stall or a crash is a finding: reported in the table, not raised
        return dict(row, outcome="failed", detail=traceback.format_exc())
    pre = r["preemptions"] or {}
    return dict(row, outcome="ok", makespan_s=r["makespan_s"], samples_per_s=r["samples_per_s"],
                bound_s=r["bounds"]["makespan_lower_bound_s"], preemptions=pre.get("preemptions", 0),
                restarted_stages=pre.get("restarted_stages", 0),
                cpu_s=time.process_time() - t0)


def measure(args) -> dict:
    seeds, odd_seeds, sims = args
    t0 = time.time()
    jobs = [("spot", rate, "jigsaw", pricing, seed) for rate in RATES for seed in seeds for pricing in (True, False)]
    jobs += [("odd", s, v, pricing, sim) for s in odd_seeds for v in VARIANTS for sim in range(sims)
             for pricing in (True, False)]
    with ProcessPoolExecutor(max_workers=2, max_tasks_per_child=1, initializer=limit_cpu) as ex:
        rows = list(ex.map(_run, jobs))
    return {"rows": rows, "seeds": list(seeds), "odd_seeds": list(odd_seeds), "sims": sims,
            "wall_s": time.time() - t0, "load": os.getloadavg()}


def _pair(rows, **match) -> tuple[list, list]:
    sel = [r for r in rows if all(r[k] == v for k, v in match.items())]
    on = {(r["key"], r["variant"], r["seed"]): r for r in sel if r["pricing"]}
    off = {(r["key"], r["variant"], r["seed"]): r for r in sel if not r["pricing"]}
    keys = sorted(k for k in on if k in off)
    return [on[k] for k in keys], [off[k] for k in keys]


def render(data: dict) -> str:
    rows = data["rows"]
    out = ["## Training gangs priced with their expected restarts (simulated, `benchmarks/restart_pricing.py`)", "",
           "The jigsaw policy prices each candidate training gang with the restarts the preemptions seen so far "
           "foretell (a pass restarts from its start whenever a device of its gang is preempted: "
           "scheduler/jigsaw/restarts.py, docs/plan.md \"Preemption\"); `off` is `restart_pricing=False` (gangs "
           "priced as if their devices stayed). Reproduce: `python benchmarks/restart_pricing.py`.", "",
           f"**Spot pools.** dapo-math-async of workload (c) (128 x 16 samples a step, 8 steps, staleness 1) on "
           f"{DEVICES} H100, every device preemptible at the given rate (0: none, where on and off are the same "
           f"run), replaced after {REPLACE_S:.0f} s; seeds "
           f"{', '.join(str(s) for s in data['seeds'])} (the preemption times); medians.", ""]
    table = []
    for rate in RATES:
        on, off = _pair(rows, kind="spot", key=rate)
        ok = [(a, b) for a, b in zip(on, off) if a["outcome"] == b["outcome"] == "ok"]
        if not ok:
            continue
        med = lambda rs, k: statistics.median(r[k] for r in rs)
        a, b = [x for x, _ in ok], [y for _, y in ok]
        table.append([f"{rate:g}", f"{med(a, 'preemptions'):.0f} / {med(b, 'preemptions'):.0f}",
                      f"{med(a, 'restarted_stages'):.0f} / {med(b, 'restarted_stages'):.0f}",
                      f"{med(a, 'makespan_s'):.1f} / {med(b, 'makespan_s'):.1f}",
                      f"{statistics.median(x['makespan_s'] / y['makespan_s'] for x, y in ok):.3f}",
                      f"{med(a, 'bound_s'):.1f}",
                      f"{med(a, 'makespan_s') / med(a, 'bound_s'):.2f} / {med(b, 'makespan_s') / med(b, 'bound_s'):.2f}"])
    out += [md_table(["preemptions / device-hour", "preemptions (on / off)", "stages restarted (on / off)",
                      "makespan s (on / off)", "on / off (median of seeds)", "makespan lower bound s",
                      "makespan / bound (on / off)"], table), "",
            "The bound (`makespan_lower_bound_s`) is the pool's with every device present: no schedule "
            "avoids a preemption the simulator draws, so it is not reachable here at any rate above 0.", ""]
    out += [f"**Odd workloads** (`odd_workloads.py --preempt`, seeds {', '.join(str(s) for s in data['odd_seeds'])}: "
            "those of 0-69 with a preemptible class that jigsaw ran on stop 67's build; stop 68's also runs 17, "
            "22, 25 and 26, pools that run until the simulator's 100,000 preemptions are spent), "
            "simulation seeds "
            f"0-{data['sims'] - 1} each; a run past {CPU_S} CPU s is \"slow\".", ""]
    table = []
    for variant in VARIANTS:
        on, off = _pair(rows, kind="odd", variant=variant)
        ok = [(a, b) for a, b in zip(on, off) if a["outcome"] == b["outcome"] == "ok"]
        logs = {}
        for a, b in ok:
            logs.setdefault(a["key"], []).append(math.log(a["makespan_s"] / b["makespan_s"]))
        per = {k: math.exp(statistics.mean(v)) for k, v in logs.items()}
        allg = math.exp(statistics.mean(x for v in logs.values() for x in v)) if logs else float("nan")
        faster = sorted((g, k) for k, g in per.items() if g < 0.99)
        slower = sorted(((g, k) for k, g in per.items() if g > 1.01), reverse=True)
        fmt = lambda xs: ", ".join(f"s{k} {g:.2f}x" for g, k in xs) or "none"
        other = {}
        for a, b in zip(on, off):
            if not a["outcome"] == b["outcome"] == "ok":
                other.setdefault((a["outcome"], b["outcome"]), []).append(f"s{a['key']}.{a['seed']}")
        over = lambda side: math.exp(statistics.mean(math.log(r["makespan_s"] / r["bound_s"]) for r in side))
        table.append([variant, len(ok), f"{allg:.3f}",
                      f"{over([a for a, _ in ok]):.2f} / {over([b for _, b in ok]):.2f}" if ok else "-",
                      fmt(faster), fmt(slower),
                      "; ".join(f"{x} / {y}: {', '.join(runs)}" for (x, y), runs in sorted(other.items())) or "none"])
    out += [md_table(["policy", "runs ok both ways", "on / off (geometric mean)",
                      "makespan / bound, on / off (geometric mean)", "workloads faster by over 1% "
                      "(geometric mean over seeds)", "slower by over 1%", "other outcomes (on / off: workload.seed)"], table), ""]
    out += [f"Wall time {data['wall_s']:.0f} s; load average at the end: "
            f"{' / '.join(f'{x:.1f}' for x in data['load'])} (2 cores shared; simulated time, so load does not "
            "change these numbers)."]
    return "\n".join(out)


if __name__ == "__main__":
    measure_and_write("restart-pricing", RESULTS, measure, render,
                      full=(tuple(range(9)), ODD_SEEDS, 5), quick_args=((0,), ODD_SEEDS[:3], 1))
