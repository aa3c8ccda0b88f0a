"""Export (JSON round trip, DOT text, PNG both ways), `jigsaw graph` in-process, and size."""

import argparse
import json
import time

import pytest

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.graph import GraphError, SubStage, SubStageGraph, build_from_spec, from_json, to_dot, to_json, to_png
from jigsaw_plugin.graph.command import add_graph_arguments, run_graph, run_graph_from_events
from jigsaw_plugin.workload import parse_workload


def _spec(prompts=2, samples=2, gpus=2, steps=2, turns=True, algorithm="ppo"):
    p = {"name": "agent", "model": "qwen2.5-1.5b", "algorithm": algorithm, "mode": "sync", "staleness": 0,
         "prompts_per_step": prompts, "samples_per_prompt": samples, "max_response_len": 4096,
         "prompt_len": {"dist": "lognormal", "median": 150, "sigma": 0.3},
         "response_len": {"dist": "lognormal", "median": 400, "sigma": 1.0}, "steps": steps}
    if turns:
        p.update(turns={"dist": "categorical", "values": [1, 2, 3], "weights": [0.3, 0.4, 0.3]},
                 tool_latency_s={"dist": "uniform", "low": 0.1, "high": 1.0},
                 observation_len={"dist": "uniform", "low": 50, "high": 400})
    other = dict(p, name="math", turns=None, tool_latency_s=None, observation_len=None)
    other = {k: v for k, v in other.items() if v is not None}
    return {"version": 1, "cluster": {"gpus": gpus * 2, "gpu": "h100", "gpus_per_node": 8},
            "pipelines": [p, other]}


@pytest.fixture
def workload_file(tmp_path):
    import yaml

    path = tmp_path / "wl.yaml"
    path.write_text(yaml.safe_dump(_spec()))
    return path


def test_json_round_trip_keeps_every_field(tmp_path):
    g = build_from_spec(parse_workload(_spec()), "agent", seed=1)
    g.add(SubStage("agent/s0/switch0", "agent", 0, "context_switch", "train", 2, {"devices": 2}, 1.5, 2.0,
                   {"devices": [0, 1], "from_pipeline": None}))
    to_json(g, tmp_path / "g.json")
    data = json.loads((tmp_path / "g.json").read_text())
    assert data["format"] == "jigsaw-substage-graph" and data["summary"] == g.summary()
    back = from_json(tmp_path / "g.json")
    assert [s for s in back.nodes()] == [s for s in g.nodes()]
    assert sorted(back.edges()) == sorted(g.edges())
    back.validate()
    (tmp_path / "x.json").write_text(json.dumps({"format": "chrome-trace", "nodes": []}))
    with pytest.raises(GraphError, match="not a sub-stage graph"):
        from_json(tmp_path / "x.json")


def test_dot_is_graphviz_text_with_clusters_colours_and_escaped_labels(tmp_path):
    g = build_from_spec(parse_workload(_spec()), "agent", steps=2)
    g.add(SubStage('odd "id"', "agent", 9, "adv", "host", 0, {"note": 'a "b"'}))
    to_dot(g, tmp_path / "g.dot")
    dot = (tmp_path / "g.dot").read_text()
    assert dot.startswith("digraph substages {") and dot.rstrip().endswith("}")
    assert dot.count(" -> ") == len(g.edges())
    assert dot.count("subgraph cluster_") == 3  # steps 0, 1 and the odd node's step 9
    assert '"agent/s0/r0/t0" [label="gen_turn\\ntokens=' in dot
    assert '"odd \\"id\\"" [label="adv\\nnote=a \\"b\\""' in dot
    assert "style=bold" in dot and "style=dotted" in dot and 'fillcolor="#3182bd"' in dot


@pytest.mark.parametrize("samples,max_nodes", [(2, 400), (64, 100)])
def test_png_draws_small_graphs_node_by_node_and_big_ones_as_a_summary(tmp_path, samples, max_nodes):
    g = build_from_spec(parse_workload(_spec(prompts=4, samples=samples)), "agent", steps=2)
    t = time.process_time()
    to_png(g, tmp_path / "g.png", max_nodes=max_nodes)
    assert time.process_time() - t < 30
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_run_graph_writes_each_format_and_prints_one_line(workload_file, tmp_path, capsys):
    for suffix in (".json", ".dot", ".png"):
        out = tmp_path / "out" / f"g{suffix}"
        assert run_graph(str(workload_file), "agent", str(out), steps=1, max_samples=3) == 0
        assert out.exists() and out.stat().st_size > 0
        line = capsys.readouterr().out.strip()
        assert line.startswith(str(out)) and "rollout_request 3" in line and "\n" not in line
    g = from_json(tmp_path / "out" / "g.json")
    assert g.summary()["steps"] == {"agent": 1} and len(g.nodes(kind="reward")) == 3


@pytest.mark.parametrize("kwargs,field,allowed", [
    ({"out": "g.svg"}, "--out", ".json, .dot, .png"),
    ({"pipeline": "nope"}, "--pipeline", "agent, math"),
    ({"steps": 0}, "--steps", ">= 1"),
    ({"max_samples": -1}, "--max-samples", ">= 1"),
])
def test_run_graph_rejects_bad_options_with_a_spec_error(workload_file, tmp_path, kwargs, field, allowed):
    args = {"pipeline": "agent", "out": str(tmp_path / "g.json"), **kwargs}
    with pytest.raises(SpecError) as e:
        run_graph(str(workload_file), args.pop("pipeline"), args.pop("out"), **args)
    assert e.value.field == field and allowed in e.value.allowed


def test_add_graph_arguments_matches_run_graph():
    ap = argparse.ArgumentParser()
    add_graph_arguments(ap)
    a = ap.parse_args(["wl.yaml", "--pipeline", "p", "--out", "g.png", "--steps", "2", "--max-samples", "8"])
    assert (a.workload, a.pipeline, a.out, a.steps, a.seed, a.max_samples, a.from_events) == (
        "wl.yaml", "p", "g.png", 2, 0, 8, None)


def test_run_graph_from_events_filters_a_pipeline(tmp_path, capsys):
    events = tmp_path / "ev.jsonl"
    rows = []
    for pipe in ("a", "b"):
        req = {"pipeline": pipe, "step": 0, "request_id": 0, "turn": 0}
        rows += [{"hook": "jigsaw_request_submitted", **req, "replica": 0, "prompt_tokens": 9, "max_tokens": 9,
                  "t": 0.0},
                 {"hook": "jigsaw_request_finished", **req, "replica": 0, "generated_tokens": 4, "t": 1.0}]
    events.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert run_graph_from_events(str(events), str(tmp_path / "g.json"), pipeline="b") == 0
    assert from_json(tmp_path / "g.json").summary()["pipelines"] == {"b": 3}
    with pytest.raises(SpecError, match="allowed: a, b"):
        run_graph_from_events(str(events), str(tmp_path / "g.json"), pipeline="c")
    events.write_text(json.dumps({"hook": "jigsaw_nope"}) + "\n")
    with pytest.raises(SpecError, match="unknown hook 'jigsaw_nope'"):
        run_graph_from_events(str(events), str(tmp_path / "g.json"))


def test_a_512_by_16_step_builds_fast_with_linear_edges():
    wl = parse_workload(_spec(prompts=512, samples=16, gpus=16, steps=1, turns=False, algorithm="grpo"))
    t = time.process_time()
    g = build_from_spec(wl, "agent")
    elapsed = time.process_time() - t
    n = 512 * 16
    assert len(g.nodes(kind="reward")) == n and len(g.nodes(kind="old_log_prob_shard")) == 16
    # linear in the samples: the step's barrier is one join, not every reward x every shard
    assert g.summary()["edges"] < 4 * n
    assert sum(s.sizes["samples"] for s in g.nodes(kind="ref_shard")) == n
    assert elapsed < 5.0, f"build_from_spec of one 512 x 16 step took {elapsed:.2f} s"
    t = time.process_time()
    g.validate()
    g.critical_path()
    assert time.process_time() - t < 5.0
    assert SubStageGraph().summary()["nodes"] == 0
