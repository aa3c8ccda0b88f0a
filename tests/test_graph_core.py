"""SubStageGraph on hand-built graphs: validation messages, critical path, summary."""

import pytest

from jigsaw_plugin.graph import KINDS, GraphError, SubStage, SubStageGraph


def _chain(times=None):
    """req -> t0 -> tool -> t1 -> reward, plus a short side branch t0 -> side."""
    times = times or {}
    g = SubStageGraph()
    spec = [("req", "rollout_request", "rollout", 1), ("t0", "gen_turn", "rollout", 1),
            ("tool", "tool_call", "host", 0), ("t1", "gen_turn", "rollout", 1),
            ("reward", "reward", "host", 0), ("side", "reward", "host", 0)]
    for nid, kind, res, dev in spec:
        a, b = times.get(nid, (None, None))
        g.add(SubStage(nid, "p", 0, kind, res, dev, {}, a, b))
    g.add_edge("req", "t0", "order")
    g.add_edges([("t0", "tool"), ("tool", "t1"), ("t1", "reward"), ("t0", "side")])
    return g


def test_a_valid_graph_passes_and_reports_its_nodes_and_edges():
    g = _chain()
    g.validate()
    assert len(g) == 6 and "t0" in g and "nope" not in g
    assert [s.id for s in g.nodes(kind="gen_turn")] == ["t0", "t1"]
    assert g.nodes(pipeline="other") == [] and len(g.nodes(step=0)) == 6
    assert ("req", "t0", "order") in g.edges() and g.edges("order") == [("req", "t0", "order")]
    assert g.node("t1").kind == "gen_turn"
    assert g.g.nodes["t1"]["substage"] is g.node("t1")  # the node attribute is "substage"
    with pytest.raises(GraphError, match="no sub-stage 'nope'"):
        g.node("nope")


def test_validate_names_a_cycle():
    g = _chain()
    g.add_edge("reward", "t0", "order")
    with pytest.raises(GraphError, match=r"cycle: .*t0.*reward|cycle: .*reward.*t0"):
        g.validate()


def test_validate_reports_an_edge_to_a_missing_node():
    g = _chain()
    g.add_edge("t1", "ghost")
    with pytest.raises(GraphError, match="'t1' -> 'ghost' references missing node 'ghost'"):
        g.validate()


@pytest.mark.parametrize("resource,devices,message", [
    ("gpu", 1, "unresourced: resource 'gpu'"),
    ("rollout", 0, "unresourced: it runs on rollout but has 0 devices"),
    ("train", 0, "unresourced: it runs on train but has 0 devices"),
    ("host", -1, "-1 devices"),
])
def test_validate_rejects_unresourced_nodes(resource, devices, message):
    g = _chain()
    g.add(SubStage("bad", "p", 0, "update_actor", resource, devices))
    with pytest.raises(GraphError, match=message) as e:
        g.validate()
    assert "'bad'" in str(e.value)


def test_validate_rejects_time_running_backwards_and_unknown_kinds():
    g = _chain({"t0": (5.0, 4.0)})
    with pytest.raises(GraphError, match="ends at 4.0 before it starts at 5.0"):
        g.validate()
    with pytest.raises(GraphError, match="kind 'dance'; allowed: rollout_request"):
        g.add(SubStage("x", "p", 0, "dance", "host", 0))
    with pytest.raises(GraphError, match="kind 'after'"):
        g.add_edge("t0", "t1", "after")
    with pytest.raises(GraphError, match="kind 'after'"):
        g.add_edges([("t0", "t1")], "after")


def test_critical_path_counts_nodes_for_a_plan():
    g = _chain()
    assert g.critical_path() == ["req", "t0", "tool", "t1", "reward"]
    assert g.critical_path_length() == 5.0


def test_critical_path_uses_durations_when_the_run_is_timed():
    # the side branch is one node but lasts longer than tool -> t1 -> reward together;
    # the request spans its turns and must not add its own span on top
    g = _chain({"req": (0.0, 10.0), "t0": (0.0, 2.0), "tool": (2.0, 3.0), "t1": (3.0, 4.0),
                "reward": (4.0, 4.5), "side": (2.0, 9.0)})
    assert g.critical_path() == ["req", "t0", "side"]
    assert g.critical_path_length() == pytest.approx(9.0)
    assert g.critical_path(by="count") == ["req", "t0", "tool", "t1", "reward"]
    with pytest.raises(GraphError, match="allowed: auto, duration, count"):
        g.critical_path(by="money")
    assert SubStageGraph().critical_path() == []


def test_summary_counts_by_kind_pipeline_and_edge_kind():
    g = _chain()
    g.add(SubStage("q/s1/adv", "q", 1, "adv", "host", 0))
    s = g.summary()
    assert s["nodes"] == 7 and s["edges"] == 5
    assert s["kinds"] == {"adv": 1, "gen_turn": 2, "reward": 2, "rollout_request": 1, "tool_call": 1}
    assert s["pipelines"] == {"p": 6, "q": 1}
    assert s["by_pipeline"]["q"] == {"adv": 1} and s["by_pipeline"]["p"]["gen_turn"] == 2
    assert s["edge_kinds"] == {"data": 4, "order": 1}
    assert s["steps"] == {"p": 1, "q": 1}
    assert set(s["kinds"]) <= set(KINDS)


def test_substage_duration_and_dict():
    s = SubStage("a", "p", 0, "gen_turn", "rollout", 2, {"tokens": 5}, 1.0, 3.5, {"turn": 0})
    assert s.duration_s == 2.5
    assert SubStage("b", "p", 0, "gen_turn", "rollout", 1, {}, 1.0).duration_s is None
    assert s.to_dict()["sizes"] == {"tokens": 5} and s.to_dict()["attrs"] == {"turn": 0}
    with pytest.raises(AttributeError):
        s.devices = 3  # frozen


def test_docs_name_every_kind_and_edge_kind():
    from pathlib import Path

    from jigsaw_plugin.graph import EDGE_KINDS

    doc = (Path(__file__).resolve().parents[1] / "docs" / "graph.md").read_text()
    missing = [k for k in (*KINDS, *EDGE_KINDS) if f"`{k}`" not in doc]
    assert not missing, f"docs/graph.md does not describe {missing}"
