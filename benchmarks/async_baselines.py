"""The asynchronous baselines against verl-sync, on the settings their papers report.

- one-step-off: verl's one_step_off recipe (16 H20, 4 generation / 12 training GPUs) reports
  749 s -> 520 s per step (1.44x) over colocated sync: the calibration workload.
- areal: AReaL (Fu et al. 2025, arXiv 2505.24298) reports up to 2.77x over synchronous
  systems with the same GPUs, at a staleness bound of 4 (its default). Run here on the
  same workload as async with staleness 1 and 4, at 16 and 64 GPUs.

Prints mean step seconds and throughput per policy; docs/simulator.md explains the gaps.

    python benchmarks/async_baselines.py [--gpus 16,64] [--steps 6]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jigsaw_plugin.scheduler import get_policy  # noqa: E402
from jigsaw_plugin.sim import simulate  # noqa: E402
from jigsaw_plugin.workload import parse_workload  # noqa: E402

WORKLOAD = ROOT / "examples" / "workloads" / "calibration_dapo7b_h20.yaml"


def _workload(gpus: int, steps: int, staleness: int | None):
    spec = yaml.safe_load(WORKLOAD.read_text())
    spec["cluster"]["gpus"] = gpus
    p = spec["pipelines"][0]
    p["steps"] = steps
    if staleness is not None:
        p["mode"], p["staleness"] = "async", staleness
    return parse_workload(spec)


def run(gpus: int, steps: int) -> list[tuple[str, float]]:
    rows = []
    sync = simulate(_workload(gpus, steps, None), "verl-sync")["samples_per_s"]
    rows.append(("verl-sync", sync))
    split = gpus // 4
    rows.append((f"one-step-off ({split} gen / {gpus - split} train)",
                 simulate(_workload(gpus, steps, None), get_policy("one-step-off", rollout_gpus=split))["samples_per_s"]))
    for staleness in (1, 4):
        r = simulate(_workload(gpus, steps, staleness), "areal")["samples_per_s"]
        rows.append((f"areal (staleness {staleness}, split by the cost model)", r))
    return [(name, v, v / sync) for name, v in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", default="16,64")
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    print("| GPUs | policy | samples/s | over verl-sync |\n|---|---|---|---|")
    for g in (int(x) for x in args.gpus.split(",")):
        for name, v, ratio in run(g, args.steps):
            print(f"| {g} | {name} | {v:.2f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
