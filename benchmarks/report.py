"""Run every simulator benchmark and write docs/benchmarks.md.

    python benchmarks/report.py        # about 6 minutes on the 2-core CI machine

Numbers come from the deterministic simulator (same seed, same samples for every
policy); only wall times and decision latencies are measured and vary with machine load.
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import control_plane  # noqa: E402
import decision_latency  # noqa: E402
import policies  # noqa: E402
import real_ab  # noqa: E402
import sim_speed  # noqa: E402
from common import ROOT  # noqa: E402



def main() -> None:
    speed = sim_speed.run()
    pol, summary = policies.run()
    lat, lat_summary = decision_latency.run()
    cp = control_plane.run()
    calib = (ROOT / "docs" / "calibration.md").read_text()
    calib_table = calib[calib.index("| quantity |"):].split("\n\n")[0]
    text = f"""# Benchmarks

Every figure below is produced by `python benchmarks/report.py` (simulator, `--backend
sim`), which rewrites this file. Machine: {platform.machine()}, {platform.python_version()},
2 cores; each run is a separate process. Throughput figures are deterministic (seed 0,
the same samples for every policy); wall times and decision latencies are measured and
move with machine load. The last section holds real-engine figures (Ray + vLLM on this
machine's CPU cores), written by `benchmarks/real_ab.py`; none of the numbers here come
from real GPUs.

## Cost model calibration (docs/calibration.md)

{calib_table}

## jigsaw against the baselines (samples/s, higher is better)

Workloads are `examples/workloads/a_sync4_32gpu.yaml`, `b_sync8_64gpu.yaml`,
`c_async2_16gpu.yaml`, `d_hetero_32gpu.yaml` (distributions fitted to the PolyTrace verl
and search_r1 traces, 10 steps per pipeline). "verl-sync best tp" re-runs verl-sync with
rollout tensor-parallel 2 and 4 and keeps the best, so that jigsaw is also compared with
a tuned baseline. Reproduce one cell: `jigsaw bench examples/workloads/a_sync4_32gpu.yaml
--baseline verl-sync --out runs/a`.

{pol}

### Against the targets

| target | workload | measured | met? |
|---|---|---|---|
""" + "\n".join(
        f"| jigsaw / verl-sync >= 1.85 | ({k}) | {summary[k]['vs_verl_sync']:.2f}x (tuned baseline {summary[k]['vs_tuned_verl_sync']:.2f}x) | no |"
        for k in ("a", "b")
    ) + f"""
| jigsaw (async) / best of streamrl, areal, one-step-off >= 1.54 | (c) | {summary['c']['vs_best_async']:.2f}x vs {summary['c']['best_async']} | no |
""" + "\n".join(
        f"| gpu_busy_fraction >= 0.90 | ({k}) | {summary[k]['busy']:.2f} | {'yes' if summary[k]['busy'] >= 0.9 else 'no'} |"
        for k in ("a", "b")
    ) + f"""
| decision p99 < 1 ms at 64 GPUs / 8 pipelines | scaling table | {lat_summary[(64, 8)]:.0f} us | {'yes' if lat_summary[(64, 8)] < 1000 else 'no'} |
| decision p99 < 10 ms at 1024 GPUs / 32 pipelines | scaling table | {lat_summary[(1024, 32)]:.0f} us | {'yes' if lat_summary[(1024, 32)] < 10000 else 'no'} |

Why the throughput targets are not reached here: in these workloads a synchronous
pipeline's step is bounded by its longest response (10-20K tokens decoded one token per
step), and no scheduler can make a step shorter than that on-policy. jigsaw shortens the
tail itself (re-sharding it onto a wider tensor-parallel replica) and fills the devices
the tail leaves idle with other pipelines' training, which is worth 1.2-1.3x over
verl-sync as configured; a verl-sync whose rollout tensor-parallel size is tuned by hand
recovers part of the same tail speed-up, so the margin over it is smaller. The paper's
1.85x is reported on agentic workloads whose per-pipeline device shares are far more
oversubscribed than these.

## Scheduler decision latency (jigsaw policy)

{lat}

## Control plane on the EMULATED backend (runtime, not the simulator)

The same jigsaw policy object drives live engines through the runtime's router
(`runtime/live.py`, `runtime/router.py`); the engines here are EMULATED (no model: decode
steps slept on the cost model's clock at 1/100 speed), so these rows measure the control
plane only. "CPU ms/request" is the whole process (router, LiveWorld, policy and the
emulated engines) per request: an upper bound of the router's own cost. Peak memory grows
with the requests in flight (last row), and only slightly with finished requests (rows 1-3).

{cp}

## Simulator speed

Reference: 64 GPUs, 4 pipelines, 10 steps, 512 x 16 samples per step per pipeline (target
< 30 s and < 2 GiB peak). Rows below vary the pool and the samples; wall time grows with
the number of requests (about linearly) and only weakly with the pool size.

{speed}
"""
    if real_ab.RESULTS.exists():  # measured separately (needs .venv-cpu): kept from its JSON
        text += f"\n{real_ab.START}\n{real_ab.render(json.loads(real_ab.RESULTS.read_text()))}\n{real_ab.END}\n"
    (ROOT / "docs" / "benchmarks.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
