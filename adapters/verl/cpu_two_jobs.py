"""Two verl ``main_ppo`` jobs on one Ray cluster and one jigsaw coordinator, on CPU.

``python -m jigsaw_plugin.adapters.verl.cpu_two_jobs`` (``make verl-e2e-two-jobs``) starts a Ray
head in this process (``cpu_device`` units for both jobs' gangs, ``VERL_PLATFORM=cpu`` and
``JIGSAW_TQ_PER_JOB=1`` in the environment its workers inherit), creates the coordinator
with a pool of ``pool_devices`` (default 1: the jobs take turns on it, phase by phase), then
runs the two jobs (``cpu_e2e`` runs joined to the cluster, ``+jigsaw.coordinator``) one after
the other and then at the same time, and prints one JSON line: each run's result, the wall
times, and the coordinator's lease intervals.

What a coordinator can change in such a run: *when* each phase of each job runs (leases).
What it cannot: verl places each job's gang when it builds its worker groups (placement
groups held for the whole run, so the Ray cluster needs ``cpu_device`` for both gangs), and
on CPU sleep/wake are no-ops (both jobs' engines stay resident).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from jigsaw_plugin.adapters.verl.cpu_device import PLATFORM_ENV, PLATFORM_NAME, RAY_RESOURCE
from jigsaw_plugin.adapters.verl.cpu_e2e import E2EResult, E2ESettings, run

__all__ = ["TwoJobResult", "lease_intervals", "overlapping", "run_two_jobs", "main"]

COORDINATOR = "jigsaw-verl-cpu"
NAMESPACE = "jigsaw"


@dataclass(frozen=True)
class TwoJobResult:
    sequential: list[E2EResult]
    concurrent: list[E2EResult]
    sequential_wall_s: float
    concurrent_wall_s: float
    leases: list[dict]  # the concurrent runs' leases: pipeline, devices, purpose, start, end (coordinator clock)


def lease_intervals(events: list[dict]) -> list[dict]:
    """Pair the coordinator's ``jigsaw_lease_granted`` / ``_released`` events per pipeline."""
    open_, out = {}, []
    for e in events:
        if e["hook"] == "jigsaw_lease_granted":
            open_[e["pipeline"]] = {"pipeline": e["pipeline"], "devices": list(e["devices"]),
                                    "purpose": e.get("purpose"), "start": e["t"]}
        elif e["hook"] == "jigsaw_lease_released" and e["pipeline"] in open_:
            lease = open_.pop(e["pipeline"])
            out.append({**lease, "end": e["t"]})
    return sorted(out, key=lambda x: x["start"])


def overlapping(leases: list[dict]) -> list[tuple[dict, dict]]:
    """Pairs of leases of different pipelines that hold a common device at the same time."""
    bad = []
    for i, a in enumerate(leases):
        for b in leases[i + 1:]:
            if a["pipeline"] != b["pipeline"] and set(a["devices"]) & set(b["devices"]) \
                    and a["start"] < b["end"] and b["start"] < a["end"]:
                bad.append((a, b))
    return bad


def _start_cluster(devices: int):
    import ray

    for key, value in ((PLATFORM_ENV, PLATFORM_NAME), ("JIGSAW_TQ_PER_JOB", "1"), ("VLLM_CPU_KVCACHE_SPACE", "1")):
        os.environ[key] = value  # inherited by the cluster's raylet, hence by every worker
    kw = dict(num_cpus=32, resources={RAY_RESOURCE: devices}, include_dashboard=False, log_to_driver=False,
              object_store_memory=400 * 1024 * 1024, namespace=NAMESPACE)
    for attempt in (1, 2):  # Ray's node start has a hard-coded 30 s timeout (loaded machine)
        try:
            return ray.init(**kw)
        except Exception:
            ray.shutdown()
            if attempt == 2:
                raise
            time.sleep(5)


def run_two_jobs(workdir: Path, steps: int = 2, pool_devices: int = 1, timeout_s: float = 1200.0) -> TwoJobResult:
    import ray

    from jigsaw_plugin.runtime.coordinator import connect_coordinator

    workdir = Path(workdir).resolve()
    _start_cluster(devices=2)
    try:
        address = ray.get_runtime_context().gcs_address
        jobs = [E2ESettings(devices=1, steps=steps, workdir=workdir / p, pipeline=p, ray_address=address,
                            coordinator=COORDINATOR) for p in ("verl-a", "verl-b")]
        client = connect_coordinator(name=COORDINATOR, namespace=NAMESPACE, devices=pool_devices)
        t0 = time.monotonic()
        sequential = [run(replace(j, pipeline=f"{j.pipeline}-seq"), timeout_s=timeout_s) for j in jobs]
        sequential_wall = time.monotonic() - t0
        n_seq = len(client.events())
        t0 = time.monotonic()
        with ThreadPoolExecutor(len(jobs)) as pool:
            concurrent = list(pool.map(lambda j: run(j, timeout_s=timeout_s), jobs))
        concurrent_wall = time.monotonic() - t0
        leases = lease_intervals(client.events()[n_seq:])
        client.shutdown()
    finally:
        ray.shutdown()
    return TwoJobResult(sequential, concurrent, round(sequential_wall, 1), round(concurrent_wall, 1), leases)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", default="build/verl-e2e/two-jobs")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--pool-devices", type=int, default=1)
    a = p.parse_args(argv)
    result = run_two_jobs(Path(a.workdir), steps=a.steps, pool_devices=a.pool_devices)
    out = asdict(result)
    for key in ("sequential", "concurrent"):
        for r in out[key]:
            r.pop("steps")  # the per-step metrics are in each run's log
    out["overlapping_leases"] = len(overlapping(result.leases))
    print(json.dumps(out), flush=True)
    ok = all(r.returncode == 0 for r in [*result.sequential, *result.concurrent])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
