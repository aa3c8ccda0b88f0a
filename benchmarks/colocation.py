"""Co-location ablation: jigsaw with ``colocate`` on and off on the bundled workloads (a)-(d).

Each arm (seeds 0 and 1) runs in a fresh process, one at a time (a shared 2-core machine). Per arm:
makespan, samples/s, the gap breakdown's fractions (``res['gap_breakdown']``) and how many
co-located pairs the policy launched (``World.colocations``). Writes
benchmarks/results/colocation.json and the block ``colocation`` of docs/benchmarks.md and
of docs/colocation.md.

    python benchmarks/colocation.py            # measure (a)-(d), save, write the blocks
    python benchmarks/colocation.py --quick    # (c) only, nothing written
    python benchmarks/colocation.py --render   # re-render the saved results
"""

from __future__ import annotations

import os
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, md_table, measure_and_write  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "colocation.json"
COLOCATION_DOC = ROOT / "docs" / "colocation.md"
WORKLOADS = ["a_sync4_32gpu.yaml", "b_sync8_64gpu.yaml", "c_async2_16gpu.yaml", "d_hetero_32gpu.yaml"]
QUICK = ["c_async2_16gpu.yaml"]
SEEDS = (0, 1)


def run_arm(job: tuple) -> dict:
    """(workload file, colocate, seed) -> the figures of one jigsaw run."""
    from common import load

    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.sim import Simulation

    workload, colocate, seed = job
    t0 = time.perf_counter()
    sim = Simulation(load(workload), get_policy("jigsaw", colocate=colocate), seed)
    res = sim.run()
    pairs = sim.world.colocations
    return {
        "workload": workload, "colocate": colocate, "seed": seed, "makespan_s": res["makespan_s"],
        "samples_per_s": res["samples_per_s"], "gap_fractions": res["gap_breakdown"]["fractions"],
        "gap_device_s": res["gap_breakdown"]["gap_device_s"], "colocations": len(pairs),
        "colocated_device_s": sum(((p["end_t"] if p["end_t"] is not None else res["makespan_s"]) - p["start_t"])
                                  * len(p["devices"]) for p in pairs),
        "wall_s": time.perf_counter() - t0,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def measure(workloads: list) -> dict:
    jobs = [(w, c, seed) for seed in SEEDS for w in workloads for c in (False, True)]
    with ProcessPoolExecutor(max_workers=1, max_tasks_per_child=1) as ex:
        runs = list(ex.map(run_arm, jobs))
    return {"runs": runs, "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def render(data: dict) -> str:
    rows = []
    for r in data["runs"]:
        f = r["gap_fractions"]
        seed = r.get("seed", 0)
        off = next(x for x in data["runs"] if x["workload"] == r["workload"] and not x["colocate"]
                   and x.get("seed", 0) == seed)
        rows.append([r["workload"].split("_")[0], seed, "on" if r["colocate"] else "off", f"{r['makespan_s']:.1f}",
                     f"{off['makespan_s'] / r['makespan_s']:.3f}x", f"{r['samples_per_s']:.3f}",
                     f"{f['idle']:.3f}", f"{f['rollout_above_ideal']:.3f}", f"{f['training_above_ideal']:.3f}",
                     f"{f['weight_sync']:.3f}", r["colocations"], f"{r['colocated_device_s']:.0f}"])
    la = ", ".join(f"{x:.1f}" for x in data["load_average"])
    return (
        "<!-- colocation:start -->\n"
        "### Co-location ablation (`benchmarks/colocation.py`, jigsaw `colocate` off / on)\n\n"
        f"Simulator, default predictor; measured {data['date']} (load average after the runs: {la}). "
        "`vs off`: makespan off / makespan on. Gap columns: fractions of `gap_breakdown` "
        "(device-seconds between the run and the ideal). `pairs`: co-located pairs launched; "
        "`pair dev-s`: device-seconds the pairs shared devices.\n\n"
        + md_table(["workload", "seed", "colocate", "makespan s", "vs off", "samples/s", "idle", "rollout above ideal",
                    "training above ideal", "weight sync", "pairs", "pair dev-s"], rows)
        + "\n<!-- colocation:end -->"
    )


def write_colocation_doc(block: str) -> None:
    """The same block in docs/colocation.md (in place, or appended the first time)."""
    start, end = "<!-- colocation:start -->", "<!-- colocation:end -->"
    doc = COLOCATION_DOC.read_text()
    if start in doc and end in doc:
        doc = doc[: doc.index(start)] + block + doc[doc.index(end) + len(end):]
    else:
        doc = doc.rstrip("\n") + "\n\n" + block + "\n"
    COLOCATION_DOC.write_text(doc)


if __name__ == "__main__":
    data = measure_and_write("colocation", RESULTS, measure, render, WORKLOADS, QUICK)
    if "--quick" not in sys.argv:
        write_colocation_doc(render(data))
