"""Where jigsaw's idle device-seconds lie on the bundled workloads (a)-(d): by the length
of each idle gap and by what the device did before and after it (``result["idle_gaps"]``,
``core/bounds.py``). Writes the ``idle-gaps`` block of docs/benchmarks.md.

    python benchmarks/idle_gaps.py            # runs jigsaw (default options) on (a)-(d)
"""

from __future__ import annotations

import sys

from common import md_table, run_many, write_doc_block
from jigsaw_plugin.core.bounds import IDLE_GAP_EDGES_S, idle_gap_label

WORKLOADS = {"a": "a_sync4_32gpu.yaml", "b": "b_sync8_64gpu.yaml", "c": "c_async2_16gpu.yaml",
             "d": "d_hetero_32gpu.yaml"}
TOP = 4  # transitions shown per workload


def render(results: dict) -> str:
    labels = [idle_gap_label(e) for e in IDLE_GAP_EDGES_S]
    length_rows, move_rows = [], []
    for key, r in results.items():
        idle = r["gap_breakdown"]["idle_device_s"]
        gaps = r["idle_gaps"]
        sync = gaps["during_weight_sync_s"]
        length_rows.append([f"({key})", f"{r['makespan_s']:.0f}", f"{idle:.0f}",
                            f"{r['gap_breakdown']['fractions']['idle']:.0%}",
                            f"{sync:.0f} ({sync / idle:.0%})" if idle > 0 else "-"]
                           + [f"{gaps['by_length_s'][lab] / idle:.0%}" if idle > 0 else "-" for lab in labels])
        top = list(gaps["by_transition"].items())[:TOP]
        move_rows.append([f"({key})"] + [f"{k.replace('->', ' -> ')}: {v:.0f} ({v / idle:.0%})" for k, v in top])
    return (
        "## Where jigsaw's idle device-seconds lie (`benchmarks/idle_gaps.py`)\n\n"
        "jigsaw with its default options (the default predictor), simulated, seed 0. The idle "
        "device-seconds of the gap breakdown above (devices with no task), split by the length of each "
        "idle gap (a device's time between two tasks, or before its first and after its last) and by what "
        "the device did before and after it (`idle_gaps` in every result JSON). Short gaps are waits on a "
        "boundary (a micro-batch, a weight sync, a tail's end); long ones are devices no work could use.\n\n"
        + md_table(["workload", "makespan s", "idle device-s", "idle share of the gap",
                    "idle while its pipeline syncs weights: device-s (share of the idle)"]
                   + [f"gaps {lab} s" for lab in labels], length_rows)
        + "\n\nThe largest places, as (device's task before) -> (task after): device-seconds (share of the idle).\n\n"
        + md_table(["workload"] + [f"#{i + 1}" for i in range(TOP)], move_rows)
        + "\n\nReading: `rollout -> old_log_prob` is a device its rollout let go that waits for the step's "
        "last responses before the log-prob pass (early forward passes take part of it where the tail is "
        "long: docs/simulator.md); `update_actor -> rollout` a training gang's devices during the weight "
        "sync before the next rollout; `start`/`end` devices before a pipeline's first task or after the "
        "last pipeline using them finished. "
        "\"Idle while its pipeline syncs weights\": seconds a device waits while the pipeline whose task it "
        "ran last pushes its new weights (`during_weight_sync_s`: the simulator runs a sync on one device, "
        "and the rest of the update's gang waits it out before that pipeline's next rollout or pass; "
        "another pipeline could use them, for a few seconds at a time).\n\n"
        f"`python benchmarks/idle_gaps.py`\n")


def main() -> None:
    jobs = [(fname, "jigsaw", None, 0) for fname in WORKLOADS.values()]
    results = dict(zip(WORKLOADS, run_many(jobs)))
    text = render(results)
    print(text)
    if "--no-write" not in sys.argv:
        write_doc_block("idle-gaps", text)


if __name__ == "__main__":
    main()
