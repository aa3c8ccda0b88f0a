"""The policy scheduler through the real coordinator actor (Ray in the unit-test env): the
frozen config and host declarations cross into the actor, two drivers' stages are granted
by the jigsaw policy, a refusal reaches the waiting driver as an error naming its cause."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from jigsaw_plugin.runtime.capabilities import HostCapabilities
from jigsaw_plugin.runtime.host_executor import HostPipeline
from jigsaw_plugin.runtime.lease_schedulers import LeaseError

STAGES = ("gen", "old_log_prob", "update_actor", "weight_sync")  # dapo: adv runs on the driver


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="test-host-scheduler")
    yield ray
    ray.shutdown()


def _host(name: str, width: int = 1) -> HostPipeline:
    return HostPipeline(name, "tiny-qwen2", "dapo", 2, 2, 16, 64, 2, width,
                        HostCapabilities("verl", training_width=width))


def test_two_drivers_get_every_stage_from_the_jigsaw_policy_in_the_actor(ray_local):
    from jigsaw_plugin.runtime.coordinator import connect_coordinator

    client = connect_coordinator(name="host-policy", namespace="test-host-scheduler", devices=2, policy="jigsaw",
                                 policy_options={"horizon_s": 30.0})
    assert client.info()["policy"] == "jigsaw"
    for name in ("a", "b"):
        client.register_pipeline(name, {"framework": "verl"}, _host(name))

    def driver(name):
        got = []
        for step in range(2):
            for stage in STAGES:
                devices = client.acquire(name, "rollout" if stage == "gen" else "train", 1, timeout_s=30,
                                         default=(0,), step=step, stage=stage)
                got.append((step, stage))
                client.release(name, devices, step=step, stage=stage, tokens=32 if stage == "gen" else None)
        client.unregister_pipeline(name)
        return got

    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(driver, ("a", "b")))
    assert runs == [[(k, st) for k in range(2) for st in STAGES]] * 2
    grants = [e for e in client.events() if e.get("hook") == "jigsaw_stage_granted"]
    assert len(grants) == 16 and {e["policy"] for e in grants} == {"jigsaw"}
    report = client.scheduler_report()
    assert report["policy"] == "jigsaw" and report["decisions"] > 0
    client.shutdown()


def test_a_refused_stage_reaches_the_driver_as_an_error(ray_local):
    from jigsaw_plugin.runtime.coordinator import connect_coordinator

    # verl-sync runs a stage on the pipeline's whole share (1 device); this host declares a
    # training gang of 2: the RunStage is outside its capabilities
    client = connect_coordinator(name="host-refusal", namespace="test-host-scheduler", devices=1,
                                 policy="verl-sync")
    client.register_pipeline("w", {"framework": "verl"},
                             HostPipeline("w", "tiny-qwen2", "dapo", 2, 2, 16, 64, 1, 1,
                                          HostCapabilities("verl", training_width=2)))
    got = client.acquire("w", "rollout", 1, timeout_s=30, step=0, stage="gen")
    client.release("w", got, step=0, stage="gen", tokens=8)
    with pytest.raises(LeaseError, match="fixed at 2 device.*asked for 1"):
        client.acquire("w", "train", 1, timeout_s=30, step=0, stage="old_log_prob")
    refused = [e for e in client.events() if e.get("hook") == "jigsaw_decision_refused"]
    assert refused and "training_resizable=false" in refused[0]["reason"]
    client.shutdown()
