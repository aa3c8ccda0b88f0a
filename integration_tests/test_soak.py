"""Soak under churn, short: two reference GRPO pipelines on real vLLM engines while an
engine actor and the driver are SIGKILLed; every sample counted, every pid checked
(benchmarks/soak.py holds the harness; its checks raise ``SoakFailure``).

Needs ``.venv-cpu`` (``make integration``). About 5-10 min on the 2-core machine: one
device, an engine per pipeline; the driver's restart starts both engines again and an
engine kill starts a replacement. Marked ``ray_cluster`` (runs last, after the
shared local engines are shut down).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here: `make venv-cpu` builds .venv-cpu")
pytest.importorskip("psutil")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import soak  # noqa: E402

pytestmark = pytest.mark.ray_cluster


@pytest.fixture(scope="module")
def soak_cluster(local_engines):
    import ray

    from jigsaw_plugin.runtime.coordinator import connect_coordinator

    local_engines.close()  # the shared local engines go first: memory and cores
    if ray.is_initialized():
        ray.shutdown()
    # Ray's memory monitor kills this cluster's workers (the coordinator first) when the
    # *machine* nears full, whoever fills it: on a shared machine that is other work's doing.
    # The soak injects its own faults; the kernel's OOM killer still guards the machine.
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    ray.init(num_cpus=2, resources={"jigsaw_device": 2}, include_dashboard=False, log_to_driver=False,
             namespace=soak.NAMESPACE)
    client = connect_coordinator(name="soak-test", namespace=soak.NAMESPACE, devices=2,
                                 heartbeat_timeout_s=soak.HEARTBEAT_TIMEOUT_S, max_events_in_memory=200)
    yield client, ray.get_runtime_context().gcs_address
    client.shutdown()
    ray.shutdown()


@pytest.mark.timeout(1500)
def test_engine_and_driver_kills_lose_and_duplicate_no_sample(soak_cluster, tmp_path):
    client, address = soak_cluster
    case = soak.SoakCase("test", steps=3, engine_kills=2, driver_kills=1, response_len=(16, 64))
    workdir = Path(tempfile.mkdtemp(prefix="jigsaw-soak-test-"))  # outlives pytest's rotation of tmp dirs
    res = soak.run_case(case, client, address, workdir, timeout_s=1400)
    print(res)  # pytest -s shows the figures
    assert res.engine_kills >= 1 and res.driver_kills == 1
    assert res.samples == 3 * 2 * 8 and res.samples_lost == 0 and res.samples_duplicated == 0
    # both pipelines' leases came back from each dead driver (a crash by itself, e.g. Ray's
    # OOM killer on a crowded machine, is restarted the same way and reported)
    assert res.driver_lost_releases == 2 * (1 + len(res.unplanned_restarts))
    assert res.pids_left == 0 and res.pids_checked >= 1 + 2 + 4  # driver, trainers, engine actors
    info = client.info()
    assert info["events_in_memory"] <= 200  # the coordinator's log spilled instead of growing
    shutil.rmtree(workdir, ignore_errors=True)


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


@pytest.mark.timeout(600)
def test_the_coordinators_memory_stays_flat_over_many_events(soak_cluster, tmp_path):
    """Side by side: a coordinator that spills its log beyond 500 events and one that keeps
    them all get the same events (about 1 KB each); after a warm-up, the RSS of the first
    stays flat while the second's grows with the log. (A historic hook such as
    ``jigsaw_register_pipeline`` would not do: pluggy keeps every historic call.)"""
    from jigsaw_plugin.runtime.coordinator import connect_coordinator

    spill = connect_coordinator(name="mem-spill", namespace=soak.NAMESPACE, devices=1, max_events_in_memory=500,
                                event_spill_path=str(tmp_path / "spill.jsonl"))
    keep = connect_coordinator(name="mem-keep", namespace=soak.NAMESPACE, devices=1, max_events_in_memory=10**7)
    pids = {"spill": spill.info()["pid"], "keep": keep.info()["pid"]}
    rss = {k: [] for k in pids}
    name = "p" + "x" * 1000

    def emit(lo, hi):
        for k in range(lo, hi):
            for c in (spill, keep):
                c.emit("jigsaw_stage_start", pipeline=name, step=k, stage="gen", devices=(0,), samples=8, tokens=k,
                       t=float(k))
        spill.flush()
        keep.flush()
        for key, pid in pids.items():
            rss[key].append(_rss_mib(pid))

    for lo, hi in ((0, 4_000), (4_000, 14_000), (14_000, 24_000)):
        emit(lo, hi)
    grew = {k: round(v[2] - v[1], 1) for k, v in rss.items()}  # over the last 10,000 events
    print(f"coordinator RSS at 4k / 14k / 24k events (MiB): {rss}; growth over the last 10k {grew}")  # pytest -s
    assert spill.info()["events"] == keep.info()["events"] == 24_000
    assert spill.info()["events_in_memory"] <= 500
    assert grew["keep"] > 8, grew  # the log in memory shows (10 MB of payload)
    assert grew["spill"] < grew["keep"] / 3, grew
    assert [e["step"] for e in spill.events()] == list(range(24_000))  # nothing lost, in order
    spill.shutdown()
    keep.shutdown()
