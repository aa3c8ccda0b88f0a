"""Sub-stage graphs: validation, the two builders agree, export round trips, the command."""

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from jigsaw_plugin.graph import (
    GraphError,
    SubStage,
    SubStageGraph,
    build_from_events,
    build_from_spec,
    from_json,
    to_dot,
    to_json,
    to_png,
)
from jigsaw_plugin.scheduler import get_policy
from jigsaw_plugin.sim import Simulation
from sim_helpers import HookLog, small_workload

ROOT = Path(__file__).resolve().parents[1]


def _events(wl, policy="verl-sync"):
    log = HookLog()
    Simulation(wl, get_policy(policy), seed=3, hooks=log, record_requests=True).run()
    return [{"hook": name, **kw} for name, kw in log.calls]


def test_validate_rejects_cycles_and_unresourced_nodes():
    g = SubStageGraph()
    g.add(SubStage("a", "p", 0, "gen_turn", "rollout", 1))
    g.add(SubStage("b", "p", 0, "reward", "host", 0))
    g.add_edge("a", "b")
    g.validate()
    g.add_edge("b", "a")
    with pytest.raises(GraphError, match="cycle"):
        g.validate()
    h = SubStageGraph()
    h.add(SubStage("x", "p", 0, "update_actor", "train", 0))
    with pytest.raises(GraphError, match="0 devices"):
        h.validate()
    with pytest.raises(GraphError, match="kind"):
        h.add(SubStage("y", "p", 0, "dance", "host", 0))


@pytest.mark.parametrize("agentic", [(False,), (True,)])
def test_spec_and_event_graphs_have_the_same_shape(agentic):
    wl = small_workload(gpus=8, pipelines=1, prompts=4, samples=3, steps=2, agentic=agentic, algorithms=("ppo",))
    spec_graph = build_from_spec(wl, "p0", seed=3)
    event_graph = build_from_events(_events(wl))
    spec_graph.validate()
    event_graph.validate()
    assert spec_graph.summary()["kinds"] == event_graph.summary()["kinds"]
    assert spec_graph.kind_edges() == event_graph.kind_edges()
    # the real run carries times; the plan does not
    assert all(s.start_s is not None for s in event_graph.nodes("gen_turn"))
    assert all(s.start_s is None for s in spec_graph.nodes("gen_turn"))


def test_migrations_become_segments_with_a_migration_node():
    wl = small_workload(gpus=8, pipelines=2, prompts=16, samples=8, steps=2, median=1500)
    events = _events(wl, "jigsaw")
    moved = [e for e in events if e["hook"] == "jigsaw_request_migrated"]
    assert moved, "this workload is meant to exercise migration"
    g = build_from_events(events)
    g.validate()
    assert len(g.nodes("migration")) == len(moved)
    kinds = Counter(s.kind for s in g.nodes())
    turns = sum(1 for e in events if e["hook"] == "jigsaw_request_finished")
    assert kinds["gen_turn"] == turns + len(moved)


def test_unknown_hook_in_events_is_an_error():
    with pytest.raises(GraphError, match="jigsaw_bogus"):
        build_from_events([{"hook": "jigsaw_bogus"}])


def test_export_round_trip_and_formats(tmp_path):
    wl = small_workload(pipelines=1, prompts=2, samples=2, steps=2)
    g = build_from_spec(wl, "p0")
    to_json(g, tmp_path / "g.json")
    back = from_json(tmp_path / "g.json")
    assert back.summary() == g.summary() and sorted(back.edges()) == sorted(g.edges())
    to_dot(g, tmp_path / "g.dot")
    dot = (tmp_path / "g.dot").read_text()
    assert dot.startswith("digraph") and dot.count("->") == len(g.edges())
    to_png(g, tmp_path / "g.png")
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"


def test_async_steps_wait_for_the_sync_staleness_steps_earlier():
    wl = small_workload(pipelines=1, prompts=2, samples=1, steps=4, modes=("async",), staleness=(1,))
    g = build_from_spec(wl, "p0")
    gates = {(u, v) for u, v, k in g.edges() if k == "barrier" and g.node(u).kind == "weight_sync"}
    assert {(g.node(u).step, g.node(v).step) for u, v in gates} == {(0, 2), (1, 3)}


def test_graph_command(tmp_path):
    demo = ROOT / "examples" / "workloads" / "demo.yaml"
    run = lambda *a: subprocess.run([sys.executable, "-m", "jigsaw_plugin.cli", "graph", str(demo), *map(str, a)],
                                    capture_output=True, text=True, cwd=ROOT)
    p = run("--pipeline", "search-agent-7b", "--out", tmp_path / "g.json", "--steps", 1, "--max-samples", 5)
    assert p.returncode == 0, p.stderr
    data = json.loads((tmp_path / "g.json").read_text())
    assert data["summary"]["kinds"]["rollout_request"] == 5
    p = run("--pipeline", "nope", "--out", tmp_path / "g.json")
    assert p.returncode == 2 and "dapo-math-7b" in p.stderr and "Traceback" not in p.stderr
    p = run("--pipeline", "search-agent-7b", "--out", tmp_path / "g.svg")
    assert p.returncode == 2 and ".png" in p.stderr
