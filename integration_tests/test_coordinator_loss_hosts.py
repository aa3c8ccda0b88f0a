"""Coordinator loss under the hosts' own clients: a verl-style and an OpenRLHF-style
driver process, each joining the coordinator through its adapter's entry points
(``+jigsaw.*`` -> ``parse_options`` -> ``JigsawSession``; ``--jigsaw.*`` ->
``parse_jigsaw_flags`` -> ``RunHooks``) and taking a lease per phase of a step, as the
adapters do inside verl's ``fit`` and OpenRLHF's trainer. The coordinator is then killed
(``ray.kill``: Ray tells the client at its next call) or frozen (SIGSTOP: only the
heartbeat's timeout tells), under each ``on_coordinator_loss`` mode:

- stop: the driver's next lease call raises ``CoordinatorDied`` naming the coordinator
  (what the host's own error handling then shows), stderr has the client's one ERROR
  line, the process exits non-zero within a bounded time and leaves no process behind;
- fallback: one WARNING line, the driver goes on leasing the host's own devices and
  finishes its run with exit 0, leaving no process behind.

Needs Ray only (no engines): runs in ``.venv-cpu`` with ``make integration`` and in
``.venv``. The adapters pass neither ``heartbeat_s`` nor ``loss_timeout_s``, so a frozen
coordinator is noticed after the client's default 10 s loss timeout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("ray")

NAMESPACE = "jigsaw-loss-hosts"

_VERL_DRIVER = textwrap.dedent("""
    import sys, time, ray
    from jigsaw_plugin.adapters.verl.options import parse_options
    from jigsaw_plugin.adapters.verl.session import JigsawSession
    address, name, mode = sys.argv[1:4]
    ray.init(address=address, namespace=%(ns)r, log_to_driver=False)
    options = parse_options({"pipeline": "verl-host", "coordinator": name, "namespace": %(ns)r,
                             "address": address, "on_coordinator_loss": mode})
    session = JigsawSession(options, n_devices=2)
    session.start({"algorithm": "grpo"})
    fallback_steps = 0
    for step in range(1, 100000):
        for stage in ("gen", "reward", "old_log_prob", "update_actor", "weight_sync"):
            devices = session.devices_for(stage, default=(0, 1))
            time.sleep(0.01)
        session.release()
        if step == 2:
            print("READY", flush=True)
        if session.client.fallback:
            fallback_steps += 1
            print("FALLBACK", list(devices), flush=True)
            if fallback_steps >= 5:
                break
    session.finish()
    print("FINISHED", step, flush=True)
""") % {"ns": NAMESPACE}

_OPENRLHF_DRIVER = textwrap.dedent("""
    import sys, time, ray
    from jigsaw_plugin.adapters.openrlhf.config import parse_jigsaw_flags
    from jigsaw_plugin.adapters.openrlhf.hooks import RunHooks
    address, name, mode = sys.argv[1:4]
    ray.init(address=address, namespace=%(ns)r, log_to_driver=False)
    config, rest = parse_jigsaw_flags(["--jigsaw.enable", "--jigsaw.pipeline", "orl-host", "--jigsaw.coordinator",
                                       name, "--jigsaw.namespace", %(ns)r, "--jigsaw.on_coordinator_loss", mode,
                                       "--pretrain", "tiny"])
    assert rest == ["--pretrain", "tiny"]
    hooks = RunHooks({**config.to_dict(), "t0": time.time()})
    hooks.set_static_devices(rollout=(0, 1), train=(0, 1))
    hooks.register_pipeline({"algorithm": "grpo"})
    fallback_steps = 0
    for step in range(1, 100000):
        for purpose in ("rollout", "train"):
            devices = hooks.acquire(purpose, 2)
            time.sleep(0.02)
            hooks.release(devices)
        if step == 2:
            print("READY", flush=True)
        if hooks.client.fallback:
            fallback_steps += 1
            print("FALLBACK", list(devices), flush=True)
            if fallback_steps >= 5:
                break
    hooks.close()
    print("FINISHED", step, flush=True)
""") % {"ns": NAMESPACE}

DRIVERS = {"verl": _VERL_DRIVER, "openrlhf": _OPENRLHF_DRIVER}


def _descendants(pid: int) -> list[int]:
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


@pytest.fixture(scope="module")
def ray_head():
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, resources={"jigsaw_device": 2}, include_dashboard=False, log_to_driver=False,
             namespace=NAMESPACE)
    yield ray
    ray.shutdown()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("loss", ["killed", "frozen"])
@pytest.mark.parametrize("mode", ["stop", "fallback"])
@pytest.mark.parametrize("host", ["verl", "openrlhf"])
def test_a_host_driver_stops_or_falls_back_when_its_coordinator_is_lost(ray_head, host, mode, loss):
    from jigsaw_plugin.runtime.coordinator import connect_coordinator

    name = f"loss-{host}-{mode}-{loss}"
    client = connect_coordinator(name=name, namespace=NAMESPACE, devices=2)
    coordinator_pid = client.info()["pid"]
    address = ray_head.get_runtime_context().gcs_address
    driver = subprocess.Popen([sys.executable, "-c", DRIVERS[host], address, name, mode], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        lines = []
        for line in driver.stdout:
            lines.append(line)
            if line.startswith("READY"):
                break
        assert lines and lines[-1].startswith("READY"), (lines, driver.stderr.read()[-3000:])
        family = [driver.pid] + _descendants(driver.pid)
        assert client.info()["pipelines"]  # the host's pipeline is registered
        if loss == "killed":
            client.shutdown()  # the coordinator actor dies
        else:
            os.kill(coordinator_pid, signal.SIGSTOP)  # it hangs: only the heartbeat's timeout tells
        lost = time.monotonic()
        out, err = driver.communicate(timeout=120)
        took = time.monotonic() - lost
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(30)
        if loss == "frozen":
            os.kill(coordinator_pid, signal.SIGCONT)
            client.shutdown()
    print(f"{host} {mode} {loss}: driver exited {took:.2f} s after the coordinator was lost, rc {driver.returncode}")
    deadline = time.monotonic() + 30
    while [p for p in family if _alive(p)] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [p for p in family if _alive(p)]  # no orphan: the driver and all its children are gone
    if mode == "stop":
        assert took < 1.0 + 10.0 + 20.0, took  # heartbeat + loss timeout + slack (a loaded machine)
        assert driver.returncode != 0 and "FINISHED" not in out
        assert "jigsaw-plugin: ERROR: " in err and "on_coordinator_loss=stop" in err, err[-3000:]
        assert ("did not answer a heartbeat" if loss == "frozen" else f"coordinator '{name}' died") in err
        # what the host's own error handling shows: the exception naming the coordinator
        assert f"CoordinatorDied: the jigsaw coordinator '{name}'" in err, err[-3000:]
    else:
        assert took < 1.0 + 10.0 + 30.0, took
        assert driver.returncode == 0, err[-3000:]
        assert err.count("on_coordinator_loss=fallback") == 1, err[-3000:]
        if loss == "frozen":
            assert "did not answer a heartbeat" in err, err[-3000:]
        assert "Traceback" not in err, err[-3000:]
        fallback = [line for line in out.splitlines() if line.startswith("FALLBACK")]
        assert len(fallback) == 5 and all(line == "FALLBACK [0, 1]" for line in fallback), out
        assert "FINISHED" in out
