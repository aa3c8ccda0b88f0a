"""Control-plane scale on the EMULATED backend: 64 devices, 8 pipelines, one machine.

The jigsaw policy drives live emulated engines (runtime/emulated.py: no model, decode
steps slept on the cost model's clock, scaled by 1/100) through the router in real time.
Measured: scheduler decision latency, control-plane CPU time per request (router +
LiveWorld + emulated engines together: an upper bound of the router's cost), and peak
memory as requests grow (it must not grow per finished request). These are control-plane
figures only; nothing here says anything about throughput.
"""

from __future__ import annotations

import resource
import time
from concurrent.futures import ProcessPoolExecutor

from common import md_table
from decision_latency import workload

SCALE = 0.01


def one(job: tuple) -> dict:
    prompts, steps = job
    from jigsaw_plugin.costmodel import CostModel, hardware_profile
    from jigsaw_plugin.runtime.emulated import EmulatedEngine
    from jigsaw_plugin.runtime.live import run_live
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.workload import parse_workload

    cost = CostModel(hardware_profile("h100"))
    wl = parse_workload(workload(64, 8, prompts, steps=steps))
    cpu0, t0 = time.process_time(), time.perf_counter()
    r = run_live(wl, get_policy("jigsaw"), lambda p, d: EmulatedEngine(cost, p.model, tp=len(d), time_scale=SCALE),
                 time_scale=SCALE)
    r["wall_s"] = time.perf_counter() - t0
    r["cpu_s"] = time.process_time() - cpu0
    r["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return r


def run() -> str:
    # more steps of the same size: finished requests grow, requests in flight do not
    sizes = [(16, 1), (16, 2), (16, 4), (32, 2)]
    with ProcessPoolExecutor(max_workers=1, max_tasks_per_child=1) as ex:
        results = list(ex.map(one, sizes))
    rows = []
    for (prompts, steps), r in zip(sizes, results):
        n = r["samples"]
        s = r["scheduler"]
        rows.append([64, 8, steps, prompts * 8 * 8, n, f"{r['wall_s']:.1f}", f"{1e3 * r['cpu_s'] / n:.2f}", s["decisions"],
                     f"{s['decision_p50_us']:.0f}", f"{s['decision_p99_us']:.0f}", f"{r['peak_rss_mib']:.0f}"])
    return md_table(["devices", "pipelines", "steps", "requests/step", "requests", "wall s", "CPU ms/request", "decisions", "p50 us",
                     "p99 us", "peak RSS MiB"], rows)


if __name__ == "__main__":
    print(run())
