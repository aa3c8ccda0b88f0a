"""The coordinator: lease book-keeping (pure), the event forwarder, and the Ray actor."""

from __future__ import annotations

import threading
import time

import pytest

from jigsaw_plugin.events import EventRecorder
from jigsaw_plugin.manager import Emitter, get_plugin_manager, register
from jigsaw_plugin.runtime.coordinator import (
    CoordinatorDied,
    CoordinatorForwarder,
    DevicePool,
    LeaseError,
    connect_coordinator,
)


def test_pool_grants_in_arrival_order_rollout_first_and_without_starvation():
    pool = DevicePool(4)
    a = pool.request("a", "update_actor", 3)
    assert a.granted == (0, 1, 2)
    big = pool.request("b", "update_actor", 2)  # does not fit: waits
    small = pool.request("c", "update_actor", 1)  # would fit, but must not overtake `big`
    assert big.granted is None and small.granted is None
    gen = pool.request("d", "gen", 1)  # rollout goes first among the waiting
    assert gen.granted == (3,)
    pool.release("a", (0, 1, 2))
    assert big.granted == (0, 1) and small.granted == (2,)
    with pytest.raises(LeaseError, match=r"does not hold device\(s\) \[3\]"):
        pool.release("a", (3,))
    with pytest.raises(LeaseError, match=r"n_devices must be in 1\.\.4"):
        pool.request("a", "gen", 5)
    pool.release_all("b")
    assert sorted(pool.free()) == [0, 1]


class _Client:
    def __init__(self):
        self.sent = []

    def emit(self, hook_name, **kwargs):
        self.sent.append((hook_name, kwargs))


def test_forwarder_sends_every_event_hook_with_its_arguments():
    pm = get_plugin_manager(load_entrypoints=False, default_plugins=False)
    client = _Client()
    register(pm, CoordinatorForwarder(client), name="fwd")
    emit = Emitter(pm)
    emit.jigsaw_stage_start(pipeline="p", step=1, stage="gen", devices=(0,), samples=8, tokens=100, t=0.5)
    emit.jigsaw_register_pipeline(pipeline="p", spec={"algorithm": "grpo"})  # the coordinator's own record
    emit.jigsaw_lease_granted(pipeline="p", devices=(0,), purpose="gen", t=0.6)  # likewise
    emit.jigsaw_step_end(pipeline="p", step=1, t=0.7)
    assert client.sent == [
        ("jigsaw_stage_start", dict(pipeline="p", step=1, stage="gen", devices=(0,), samples=8, tokens=100, t=0.5)),
        ("jigsaw_step_end", dict(pipeline="p", step=1, t=0.7)),
    ]
    everything = _Client()
    pm2 = get_plugin_manager(load_entrypoints=False, default_plugins=False)
    register(pm2, CoordinatorForwarder(everything, hooks=["jigsaw_register_pipeline"]), name="fwd")
    Emitter(pm2).jigsaw_register_pipeline(pipeline="p", spec={})
    assert everything.sent == [("jigsaw_register_pipeline", {"pipeline": "p", "spec": {}})]


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, resources={"jigsaw_device": 2}, include_dashboard=False, log_to_driver=False,
             namespace="test-coordinator")
    yield ray
    ray.shutdown()


def test_coordinator_actor_leases_events_and_death(ray_local):
    client = connect_coordinator(name="coord-test")
    assert client.info()["devices"] == 2  # from the cluster's jigsaw_device resources
    same = connect_coordinator(name="coord-test")  # a second driver finds the same actor
    client.register_pipeline("a", {"framework": "verl"})
    same.register_pipeline("b", {"framework": "openrlhf"})
    assert client.acquire("a", "update_actor", 2) == (0, 1)
    got = []
    waiter = threading.Thread(target=lambda: got.append(same.acquire("b", "gen", 1, timeout_s=30)))
    waiter.start()
    time.sleep(0.5)
    assert not got  # b waits while a holds the pool
    client.release("a", (0, 1))
    waiter.join(30)
    assert got == [(0,)]
    with pytest.raises(TimeoutError, match="no 2 device"):
        client.acquire("a", "update_actor", 2, timeout_s=0.3)
    with pytest.raises(LeaseError, match="not registered"):
        client.acquire("zzz", "gen", 1)
    with pytest.raises(ValueError, match="unknown hook 'jigsaw_nope'"):
        client.emit("jigsaw_nope", pipeline="a")
    client.emit("jigsaw_step_start", pipeline="a", step=0, t=1.0)
    for k in range(300):  # fire-and-forget, yet recorded in the order emitted
        client.emit("jigsaw_step_end", pipeline="a", step=k, t=2.0 + k)
    import pickle

    copy = pickle.loads(pickle.dumps(client))  # as shipped to another process: its own numbering
    copy.emit("jigsaw_pipeline_end", pipeline="a", t=999.0)
    copy.flush()
    events = client.events()
    assert [e["step"] for e in events if e["hook"] == "jigsaw_step_end"] == list(range(300))
    assert [e["t"] for e in events if e["hook"] == "jigsaw_pipeline_end"] == [999.0]
    names = [e["hook"] for e in events]
    assert names.count("jigsaw_register_pipeline") == 2 and "jigsaw_step_start" in names
    assert names.count("jigsaw_lease_granted") == 2 and names.count("jigsaw_lease_released") == 1
    client.shutdown()
    with pytest.raises(CoordinatorDied, match="coord-test"):
        for _ in range(50):
            client.info()
            time.sleep(0.1)
