"""The coordinator: lease book-keeping (pure), the event forwarder, and the Ray actor."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.runtime.liveness import HeartbeatBook, LivenessSettings

from jigsaw_plugin.manager import Emitter, get_plugin_manager, register
from jigsaw_plugin.runtime.coordinator import (
    CoordinatorDied,
    CoordinatorForwarder,
    DevicePool,
    LeaseError,
    SpillingEventLog,
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


def test_heartbeat_book_expires_only_the_silent():
    book = HeartbeatBook(timeout_s=2.0)
    book.watch("a", now=0.0)
    book.watch("b", now=0.0)
    assert book.beat("a", now=1.5) and not book.beat("never-registered", now=1.5)
    assert book.expired(now=2.5) == ["b"]  # silent for 2.5 s > 2
    assert book.watched() == ("a",) and not book.beat("b", now=2.6)  # b's driver learns it was reaped
    assert book.expired(now=3.4) == [] and book.expired(now=3.6) == ["a"]
    with pytest.raises(SpecError, match="heartbeat_timeout_s: got 0; allowed: a number of seconds > 0"):
        HeartbeatBook(0)


@pytest.mark.parametrize("kwargs, field", [
    ({"on_coordinator_loss": "retry"}, "on_coordinator_loss: got 'retry'; allowed: stop | fallback"),
    ({"heartbeat_s": -1}, "heartbeat_s: got -1"),
    ({"loss_timeout_s": True}, "loss_timeout_s: got True"),
    ({"loss_timeout_s": float("nan")}, "loss_timeout_s: got nan"),
])
def test_liveness_settings_name_the_bad_field(kwargs, field):
    with pytest.raises(SpecError, match=field.replace("|", r"\|")):
        LivenessSettings(**kwargs)


def test_pool_release_all_wakes_the_pipelines_waiters_without_a_grant():
    pool = DevicePool(2)
    pool.request("a", "gen", 2)
    w = pool.request("b", "gen", 1)
    other = pool.request("c", "gen", 2)
    assert pool.release_all("b") == () and w.event.is_set() and w.granted is None
    assert pool.release_all("a") == (0, 1) and other.granted == (0, 1)


# ---- real Ray: a driver killed while it holds a lease, a coordinator lost under a driver ----

_DRIVER = textwrap.dedent("""
    import sys, time, ray
    from jigsaw_plugin.runtime.coordinator import CoordinatorDied, connect_coordinator
    address, name, mode, pipeline, n = sys.argv[1:6]
    ray.init(address=address, namespace="test-coordinator", log_to_driver=False)
    client = connect_coordinator(name=name, heartbeat_s=0.2, loss_timeout_s=1.0, on_coordinator_loss=mode)
    client.register_pipeline(pipeline, {"framework": "test"})
    held = client.acquire(pipeline, "gen", int(n))
    print("HELD", list(held), flush=True)
    if pipeline.startswith("dies"):
        time.sleep(600)  # SIGKILLed here, holding its lease
    cycles = 0
    try:
        for cycles in range(1, 1000):
            client.release(pipeline, held)
            held = client.acquire(pipeline, "gen", int(n), default=(7,))
            if cycles == 1:
                print("READY", flush=True)
            if client.fallback:
                print("FALLBACK", list(held), flush=True)
                if cycles > 20:
                    break
            time.sleep(0.05)
    except CoordinatorDied as e:  # what a host does with it: say why, exit non-zero, cleanly
        print("DIED", e, flush=True)
        ray.shutdown()
        sys.exit(3)
    client.unregister_pipeline(pipeline)
    ray.shutdown()
""")


def _children(pid: int) -> list[int]:
    """Every descendant pid of ``pid`` (from /proc: no psutil here)."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [pid]
    while todo:
        pid = todo.pop()
        kids = [c for c, p in parent.items() if p == pid]
        out += kids
        todo += kids
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _start_driver(ray, name, mode, pipeline, n):
    address = ray.get_runtime_context().gcs_address
    proc = subprocess.Popen([sys.executable, "-c", _DRIVER, address, name, mode, pipeline, str(n)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    return proc


def _wait_line(proc, prefix, timeout=90):
    deadline = time.monotonic() + timeout
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith(prefix):
            return line
    proc.kill()
    raise AssertionError(f"driver never printed {prefix!r}: {lines} {proc.stderr.read()[-3000:]}")


def test_a_killed_drivers_lease_comes_back_and_the_waiter_gets_it(ray_local):
    ray = ray_local
    client = connect_coordinator(name="coord-liveness", devices=2, heartbeat_s=0.2, heartbeat_timeout_s=2.0)
    client.register_pipeline("alive", {"framework": "test"})
    driver = _start_driver(ray, "coord-liveness", "stop", "dies-a", 2)
    try:
        assert _wait_line(driver, "HELD") == "HELD [0, 1]\n"
        family = [driver.pid] + _children(driver.pid)
        got = []
        waiter = threading.Thread(target=lambda: got.append(client.acquire("alive", "gen", 2, timeout_s=60)))
        waiter.start()
        time.sleep(0.5)
        assert not got and client.info()["holder"] == {0: "dies-a", 1: "dies-a"}
        os.killpg(driver.pid, signal.SIGKILL)
        killed = time.monotonic()
        waiter.join(60)
        waited = time.monotonic() - killed
    finally:
        driver.kill()
        driver.wait(30)
    print(f"lease back {waited:.2f} s after SIGKILL (heartbeat timeout 2 s)")  # pytest -s shows it
    assert got == [(0, 1)], got
    assert waited < 2.0 + 1.0 + 3.0  # heartbeat timeout + reaper period + slack for a loaded machine
    assert not [pid for pid in family if _alive(pid)]  # every pid of the killed driver is gone
    info = client.info()
    assert "dies-a" not in info["pipelines"] and [r["pipeline"] for r in info["reaped"]] == ["dies-a"]
    released = [e for e in client.events() if e["hook"] == "jigsaw_lease_released"]
    assert [(e["pipeline"], e["devices"], e["reason"]) for e in released] == [("dies-a", [0, 1], "driver_lost")]
    client.release("alive", (0, 1))
    client.unregister_pipeline("alive")
    client.shutdown()


@pytest.mark.parametrize("mode", ["stop", "fallback"])
def test_coordinator_loss_stops_or_falls_back_within_a_bounded_time(ray_local, mode):
    ray = ray_local
    name = f"coord-loss-{mode}"
    client = connect_coordinator(name=name, devices=2, heartbeat_timeout_s=5.0)
    driver = _start_driver(ray, name, mode, f"p-{mode}", 1)
    try:
        _wait_line(driver, "READY")
        family = [driver.pid] + _children(driver.pid)
        coordinator_pid = client.info()["pid"]
        if mode == "stop":
            client.shutdown()  # the actor dies: Ray tells its callers at once
        else:
            os.kill(coordinator_pid, signal.SIGSTOP)  # it hangs: only the heartbeat's timeout tells
        lost = time.monotonic()
        out, err = driver.communicate(timeout=60)
        took = time.monotonic() - lost
    finally:
        driver.kill()
        if mode == "fallback":
            os.kill(coordinator_pid, signal.SIGKILL)
    print(f"{mode}: driver exited {took:.2f} s after the coordinator was lost")  # pytest -s shows it
    assert took < 0.2 + 1.0 + 10.0, took  # heartbeat + loss timeout + slack (driver exit, Ray shutdown)
    assert not [pid for pid in family if _alive(pid)]  # the driver and all its children exited
    if mode == "stop":
        assert driver.returncode == 3, err[-2000:]
        assert f"DIED the jigsaw coordinator '{name}' died" in out
        assert "on_coordinator_loss=stop" in err and "Traceback" not in err
    else:
        assert driver.returncode == 0, err[-2000:]
        assert "FALLBACK [7]" in out  # the host's own devices (acquire's default)
        assert err.count("on_coordinator_loss=fallback") == 1 and "did not answer a heartbeat" in err
        assert "Traceback" not in err


def test_event_log_memory_stays_flat_over_many_events(tmp_path):
    import tracemalloc

    log = SpillingEventLog(max_in_memory=200, spill_path=tmp_path / "events.jsonl")
    pm = get_plugin_manager(load_entrypoints=False, default_plugins=False)
    register(pm, log, name="log")
    emit = Emitter(pm)

    def run(steps):
        for k in steps:
            emit.jigsaw_stage_start(pipeline="p", step=k, stage="gen", devices=(0, 1), samples=8, tokens=k, t=k)

    tracemalloc.start()
    run(range(0, 1_000))
    after_1k = tracemalloc.get_traced_memory()[0]
    run(range(1_000, 10_000))
    after_10k, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(log.events) <= 200 and len(log) == 10_000 and log.spilled == len(log) - len(log.events)
    assert after_10k < after_1k * 1.2 + 32 * 1024, (after_1k, after_10k)  # ten times the events, same memory
    assert peak < after_1k * 1.5 + 128 * 1024, (after_1k, peak)
    everything = log.all_events()
    assert [e["step"] for e in everything] == list(range(10_000))  # nothing lost, in order
    with pytest.raises(SpecError, match="max_events_in_memory: got 1; allowed: an integer >= 2"):
        SpillingEventLog(max_in_memory=1)


def test_the_coordinators_log_spills_beyond_its_limit(ray_local):
    client = connect_coordinator(name="coord-spill", devices=1, max_events_in_memory=10)
    for k in range(50):
        client.emit("jigsaw_step_end", pipeline="p", step=k, t=float(k))
    events = client.events()
    info = client.info()
    assert info["events"] == 50 and info["events_in_memory"] <= 10 and info["events_spilled"] >= 40
    assert [e["step"] for e in events] == list(range(50))
    client.shutdown()
