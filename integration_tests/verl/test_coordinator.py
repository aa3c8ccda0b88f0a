"""Several verl trainers in separate driver processes share one jigsaw coordinator's pool.

The test process starts the coordinator (``connect_coordinator``, 2 devices) on its Ray
cluster; two driver processes (``driver_trainer.py``) each build verl's jigsaw trainer with
``+jigsaw.coordinator`` and ``+jigsaw.address`` and run 3 steps. Each phase of a step asks
the pool for both devices, so the two pipelines must take turns: no two leases overlap.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_two_trainer_drivers_share_the_coordinators_device_pool(ray_tq):
    import ray

    from jigsaw_plugin.graph import build_from_events
    from jigsaw_plugin.runtime.coordinator import connect_coordinator

    client = connect_coordinator(name="jigsaw-verl-test", namespace="jigsaw", devices=2)
    address = ray.get_runtime_context().gcs_address
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, str(HERE / "driver_trainer.py"), address, "jigsaw-verl-test",
                               f"verl-{p}", "3", "0.05"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env, cwd=str(HERE)) for p in "ab"]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    leases = sorted((lease for o in outs for lease in o["leases"]), key=lambda x: x["start"])
    assert {o["pipeline"] for o in outs} == {"verl-a", "verl-b"}
    assert all(len(o["leases"]) == 6 for o in outs)  # 3 steps x (rollout, train)
    assert all(lease["devices"] == [0, 1] for lease in leases)
    for a, b in zip(leases, leases[1:]):
        assert a["end"] <= b["start"] + 1e-3, (a, b)  # the pool is shared: never both at once

    events = client.events()
    registered = [e["pipeline"] for e in events if e["hook"] == "jigsaw_register_pipeline"]
    assert sorted(registered) == ["verl-a", "verl-b"]
    ordered = [e for e in events if e["hook"] == "jigsaw_register_pipeline"]
    for p in ("verl-a", "verl-b"):
        mine = [e for e in events if e.get("pipeline") == p]
        assert [e["hook"] for e in mine].count("jigsaw_step_end") == 3
        assert [e["hook"] for e in mine].count("jigsaw_pipeline_end") == 1
        assert sum(e["hook"] == "jigsaw_lease_granted" for e in mine) == 6
        # The coordinator (an async actor) may record fire-and-forget emits out of order;
        # each trainer's own clock t orders its events again (leases carry the coordinator's clock).
        ordered += sorted((e for e in mine if e["hook"].startswith(("jigsaw_step", "jigsaw_stage", "jigsaw_weight"))),
                          key=lambda e: e["t"])
    graph = build_from_events(ordered)
    assert {n.pipeline for n in graph.nodes(kind="update_actor")} == {"verl-a", "verl-b"}
    assert client.info()  # still alive; both pipelines left it
    client.shutdown()
