"""The workload spec: loading, defaults, round trips and every error class."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.workload import (
    ALGORITHMS,
    KNOWN_GPUS,
    KNOWN_MODELS,
    Const,
    Lognormal,
    PipelineSpec,
    WorkloadSpec,
    load_workload,
    parse_workload,
)

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "examples" / "workloads" / "demo.yaml"

BASE = {
    "version": 1,
    "cluster": {"gpus": 8, "gpu": "h100", "gpus_per_node": 8},
    "pipelines": [
        {
            "name": "math",
            "model": "qwen2.5-7b",
            "algorithm": "dapo",
            "mode": "sync",
            "prompts_per_step": 4,
            "samples_per_prompt": 2,
            "max_response_len": 1024,
            "prompt_len": {"dist": "lognormal", "median": 150, "sigma": 0.3, "min": 16},
            "response_len": {"dist": "lognormal", "median": 466, "sigma": 0.93},
            "steps": 2,
        },
        {
            "name": "agent",
            "model": "qwen3-8b",
            "algorithm": "grpo",
            "mode": "async",
            "staleness": 2,
            "prompts_per_step": 4,
            "samples_per_prompt": 2,
            "max_response_len": 2048,
            "prompt_len": {"dist": "const", "value": 300},
            "response_len": {"dist": "uniform", "low": 10, "high": 200},
            "turns": {"dist": "categorical", "values": [1, 2, 3], "weights": [0.2, 0.5, 0.3]},
            "tool_latency_s": {"dist": "quantiles", "q": [0, 0.5, 0.9, 0.99, 1.0],
                               "values": [0.0, 0.16, 1.13, 2.69, 3.77]},
            "observation_len": {"dist": "uniform", "low": 500, "high": 1500},
            "reward": {"kind": "sandbox", "latency_s": {"dist": "const", "value": 0.5}},
            "steps": 3,
            "gpus": 4,
            "rollout_tp": 2,
        },
    ],
}


def base():
    return copy.deepcopy(BASE)


def test_parse_base():
    w = parse_workload(base())
    assert isinstance(w, WorkloadSpec) and w.version == 1
    assert w.cluster.gpus == 8 and w.cluster.gpu == "h100" and w.cluster.gpus_per_node == 8
    m, a = w.pipelines
    assert isinstance(m, PipelineSpec)
    assert (m.name, m.model, m.algorithm, m.mode, m.staleness) == ("math", "qwen2.5-7b", "dapo", "sync", 0)
    assert not m.agentic and a.agentic
    assert m.samples_per_step == 8
    assert m.turns is m.tool_latency_s is m.observation_len is None
    assert m.reward.kind == "rule" and m.reward.latency_s == Const(0.01)
    assert m.gpus is None and m.rollout_tp is None
    assert (a.staleness, a.gpus, a.rollout_tp, a.reward.kind) == (2, 4, 2, "sandbox")
    assert isinstance(m.response_len, Lognormal)
    assert w.static_gpus() == (4, 4)
    assert w.pipeline("agent") is a
    with pytest.raises(KeyError, match="math, agent"):
        w.pipeline("nope")


def test_load_demo():
    w = load_workload(DEMO)
    assert w.path == str(DEMO)
    assert w.cluster.gpus == 8 and w.cluster.gpu == "h100"
    names = [p.name for p in w.pipelines]
    assert names == ["dapo-math-7b", "search-agent-7b"]
    dapo, agent = w.pipelines
    assert dapo.algorithm == "dapo" and dapo.mode == agent.mode == "sync"
    assert dapo.model == agent.model == "qwen2.5-7b"
    assert not dapo.agentic and agent.agentic
    for p in w.pipelines:
        assert (p.prompts_per_step, p.samples_per_prompt, p.steps) == (64, 8, 3)
        for f in ("prompt_len", "response_len", "turns", "tool_latency_s", "observation_len"):
            d = getattr(p, f)
            assert d is None or d.kind != "trace"  # a fresh clone has no traces
    assert w.static_gpus() == (4, 4)


@pytest.mark.parametrize("path", sorted((REPO / "examples" / "workloads").glob("*.yaml")), ids=lambda p: p.name)
def test_bundled_parametric_workloads_load(path):
    w = load_workload(path)
    assert sum(w.static_gpus()) <= w.cluster.gpus


def test_defaults():
    d = base()
    for key in ("algorithm", "mode", "staleness", "reward"):
        d["pipelines"][0].pop(key, None)
    del d["cluster"]["gpus_per_node"]
    d["pipelines"][1].pop("staleness")
    w = parse_workload(d)
    m, a = w.pipelines
    assert (m.algorithm, m.mode, m.staleness) == ("grpo", "sync", 0)
    assert a.staleness == 1  # async default bound
    assert w.cluster.gpus_per_node == 8


def test_reward_defaults_by_kind():
    d = base()
    d["pipelines"][0]["reward"] = {"kind": "sandbox"}
    p = parse_workload(d).pipelines[0]
    assert p.reward.kind == "sandbox" and 0.5 < p.reward.latency_s.mean() < 3
    d["pipelines"][0]["reward"] = {"latency_s": 0.2}
    p = parse_workload(d).pipelines[0]
    assert p.reward.kind == "rule" and p.reward.latency_s == Const(0.2)


def test_names_are_case_insensitive_and_normalised():
    d = base()
    d["cluster"]["gpu"] = "H100"
    d["pipelines"][0]["model"] = "Qwen2.5-7B"
    d["pipelines"][0]["algorithm"] = "DAPO"
    w = parse_workload(d)
    assert w.cluster.gpu == "h100" and w.pipelines[0].model == "qwen2.5-7b" and w.pipelines[0].algorithm == "dapo"


def test_custom_gpu_and_model_dicts():
    d = base()
    d["cluster"]["gpu"] = {"flops_tflops": 400, "hbm_tbps": 2.5, "memory_gb": 64, "link_gbps": 200, "name": "x1"}
    d["pipelines"][0]["model"] = {"params_b": 1.5, "layers": 28, "hidden": 1536, "kv_heads": 2, "head_dim": 128,
                                  "vocab": 151936}
    w = parse_workload(d)
    assert w.cluster.gpu["memory_gb"] == 64 and w.pipelines[0].model["layers"] == 28
    assert parse_workload(w.to_dict()) == dataclasses.replace(w, path=None)


def test_known_names():
    assert KNOWN_GPUS == ("h100", "h800", "h200", "h20", "a100", "cpu")
    assert "qwen2.5-math-7b" in KNOWN_MODELS and "tiny-qwen2" in KNOWN_MODELS and len(KNOWN_MODELS) == 15
    assert ALGORITHMS == ("grpo", "dapo", "ppo", "reinforce")


def test_known_models_match_cost_model_profiles():
    profiles = pytest.importorskip("jigsaw_plugin.costmodel.profiles")
    assert set(KNOWN_MODELS) <= set(profiles.MODELS)
    assert set(KNOWN_GPUS) <= set(profiles.HARDWARE)


def test_to_dict_round_trip_and_yaml():
    w = parse_workload(base())
    d = w.to_dict()
    assert parse_workload(d) == w
    text = yaml.safe_dump(d)
    assert parse_workload(yaml.safe_load(text)) == w
    assert d["pipelines"][0]["reward"] == {"kind": "rule", "latency_s": {"dist": "const", "value": 0.01}}
    assert "gpus" not in d["pipelines"][0] and d["pipelines"][1]["gpus"] == 4


def test_demo_round_trip_through_yaml(tmp_path):
    w = load_workload(DEMO)
    f = tmp_path / "again.yaml"
    f.write_text(yaml.safe_dump(w.to_dict()))
    assert dataclasses.replace(load_workload(f), path=None) == dataclasses.replace(w, path=None)


def test_default_shares_with_remainder():
    d = base()
    d["cluster"]["gpus"] = 11
    d["pipelines"][1].pop("gpus")
    d["pipelines"][1]["rollout_tp"] = 1
    d["pipelines"].append({**copy.deepcopy(d["pipelines"][0]), "name": "third"})
    assert parse_workload(d).static_gpus() == (4, 4, 3)
    d["pipelines"][2]["gpus"] = 5
    assert parse_workload(d).static_gpus() == (3, 3, 5)


# ----------------------------------------------------------------- errors


def _set(path, value):
    def f(d):
        keys = path.split(".")
        cur = d
        for k in keys[:-1]:
            cur = cur[int(k)] if k.isdigit() else cur[k]
        last = keys[-1]
        if value is _DEL:
            del cur[last]
        else:
            cur[last] = value
        return d
    return f


_DEL = object()


def _agentic_without(key):
    return _set(f"pipelines.1.{key}", _DEL)


BAD_WORKLOADS = [
    # (name, mutation, field, value)
    ("missing version", _set("version", _DEL), "version", "<missing>"),
    ("version 2", _set("version", 2), "version", 2),
    ("missing cluster", _set("cluster", _DEL), "cluster", "<missing>"),
    ("cluster not a map", _set("cluster", [8]), "cluster", [8]),
    ("missing gpus", _set("cluster.gpus", _DEL), "cluster.gpus", "<missing>"),
    ("zero gpus", _set("cluster.gpus", 0), "cluster.gpus", 0),
    ("gpus wrong type", _set("cluster.gpus", "8"), "cluster.gpus", "8"),
    ("gpus float", _set("cluster.gpus", 8.0), "cluster.gpus", 8.0),
    ("gpus bool", _set("cluster.gpus", True), "cluster.gpus", True),
    ("unknown gpu", _set("cluster.gpu", "tpu-v5"), "cluster.gpu", "tpu-v5"),
    ("gpu dict missing key", _set("cluster.gpu", {"flops_tflops": 1, "hbm_tbps": 1, "memory_gb": 1}),
     "cluster.gpu.link_gbps", "<missing>"),
    ("gpu dict negative", _set("cluster.gpu", {"flops_tflops": -1, "hbm_tbps": 1, "memory_gb": 1, "link_gbps": 1}),
     "cluster.gpu.flops_tflops", -1),
    ("gpu dict unknown key", _set("cluster.gpu", {"flops_tflops": 1, "hbm_tbps": 1, "memory_gb": 1, "link_gbps": 1,
                                                  "tdp": 700}), "cluster.gpu.tdp", "tdp"),
    ("unknown cluster key", _set("cluster.nodes", 2), "cluster.nodes", "nodes"),
    ("unknown top key", _set("seed", 3), "seed", "seed"),
    ("missing pipelines", _set("pipelines", _DEL), "pipelines", "<missing>"),
    ("empty pipelines", _set("pipelines", []), "pipelines", []),
    ("pipeline not a map", _set("pipelines", ["x"]), "pipelines[0]", "x"),
    ("missing name", _set("pipelines.0.name", _DEL), "pipelines[0].name", "<missing>"),
    ("bad name", _set("pipelines.0.name", "has space"), "pipelines[0].name", "has space"),
    ("duplicate name", _set("pipelines.1.name", "math"), "pipelines[1].name", "math"),
    ("missing model", _set("pipelines.0.model", _DEL), "pipelines[0].model", "<missing>"),
    ("unknown model", _set("pipelines.0.model", "llama-7b"), "pipelines[0].model", "llama-7b"),
    ("model dict missing", _set("pipelines.0.model", {"params_b": 1}), "pipelines[0].model.layers", "<missing>"),
    ("model dict zero", _set("pipelines.0.model", {"params_b": 1, "layers": 0, "hidden": 1, "kv_heads": 1,
                                                   "head_dim": 1, "vocab": 1}), "pipelines[0].model.layers", 0),
    ("unknown algorithm", _set("pipelines.0.algorithm", "dpo"), "pipelines[0].algorithm", "dpo"),
    ("unknown mode", _set("pipelines.0.mode", "semi"), "pipelines[0].mode", "semi"),
    ("staleness with sync", _set("pipelines.0.staleness", 1), "pipelines[0].staleness", 1),
    ("negative staleness", _set("pipelines.1.staleness", -1), "pipelines[1].staleness", -1),
    ("missing prompts", _set("pipelines.0.prompts_per_step", _DEL), "pipelines[0].prompts_per_step", "<missing>"),
    ("negative prompts", _set("pipelines.0.prompts_per_step", -4), "pipelines[0].prompts_per_step", -4),
    ("zero samples", _set("pipelines.0.samples_per_prompt", 0), "pipelines[0].samples_per_prompt", 0),
    ("wrong-type max len", _set("pipelines.0.max_response_len", "1k"), "pipelines[0].max_response_len", "1k"),
    ("zero steps", _set("pipelines.1.steps", 0), "pipelines[1].steps", 0),
    ("missing response_len", _set("pipelines.0.response_len", _DEL), "pipelines[0].response_len", "<missing>"),
    ("missing prompt_len", _set("pipelines.0.prompt_len", _DEL), "pipelines[0].prompt_len", "<missing>"),
    ("unknown distribution", _set("pipelines.0.response_len", {"dist": "pareto", "alpha": 1}),
     "pipelines[0].response_len.dist", "pareto"),
    ("bad dist param", _set("pipelines.1.turns.weights", [0, 0, 0]), "pipelines[1].turns.weights", [0, 0, 0]),
    ("bad quantiles", _set("pipelines.1.tool_latency_s.q", [0, 0.9, 0.5, 0.99, 1]),
     "pipelines[1].tool_latency_s.q", [0, 0.9, 0.5, 0.99, 1]),
    ("dist wrong type", _set("pipelines.0.prompt_len", "long"), "pipelines[0].prompt_len", "long"),
    ("unreadable trace", _set("pipelines.0.response_len", {"dist": "trace", "path": "no/such/trace/dir"}),
     "pipelines[0].response_len.path", "no/such/trace/dir"),
    ("unknown pipeline key", _set("pipelines.1.respone_len", 5), "pipelines[1].respone_len", "respone_len"),
    ("unknown reward key", _set("pipelines.1.reward.timeout", 5), "pipelines[1].reward.timeout", "timeout"),
    ("unknown reward kind", _set("pipelines.1.reward.kind", "human"), "pipelines[1].reward.kind", "human"),
    ("reward model needs latency", _set("pipelines.0.reward", {"kind": "model"}),
     "pipelines[0].reward.latency_s", "<missing>"),
    ("reward bad latency", _set("pipelines.0.reward", {"latency_s": {"dist": "const"}}),
     "pipelines[0].reward.latency_s.value", "<missing>"),
    ("reward not a map", _set("pipelines.0.reward", "rule"), "pipelines[0].reward", "rule"),
    ("turns without tool latency", _agentic_without("tool_latency_s"), "pipelines[1].tool_latency_s", "<missing>"),
    ("turns without observation", _agentic_without("observation_len"), "pipelines[1].observation_len",
     "<missing>"),
    ("tool latency without turns", _set("pipelines.0.tool_latency_s", 1.0), "pipelines[0].tool_latency_s", 1.0),
    ("gpus over cluster", _set("pipelines.1.gpus", 16), "pipelines[1].gpus", 16),
    ("zero pipeline gpus", _set("pipelines.1.gpus", 0), "pipelines[1].gpus", 0),
    ("gpus not multiple of tp", _set("pipelines.1.gpus", 3), "pipelines[1].gpus", 3),
    ("tp over cluster", _set("pipelines.0.rollout_tp", 16), "pipelines[0].rollout_tp", 16),
    ("zero tp", _set("pipelines.1.rollout_tp", 0), "pipelines[1].rollout_tp", 0),
    # Qwen2.5-7B's 28 attention heads do not split over 8 devices (vLLM refuses it)
    ("tp vllm cannot shard", _set("pipelines.0.rollout_tp", 8), "pipelines[0].rollout_tp", 8),
]


@pytest.mark.parametrize("name,mutate,field,value", BAD_WORKLOADS, ids=[b[0] for b in BAD_WORKLOADS])
def test_bad_workload_is_spec_error(name, mutate, field, value):
    d = mutate(base())
    with pytest.raises(SpecError) as e:
        parse_workload(d, where="bad.yaml")
    assert e.value.field == field
    assert e.value.value == value
    assert e.value.where == "bad.yaml"
    assert e.value.allowed
    assert str(e.value).startswith(f"bad.yaml: {field}: got ")


def test_explicit_shares_over_cluster():
    d = base()
    d["pipelines"][0]["gpus"] = 6  # 6 + 4 > 8
    with pytest.raises(SpecError) as e:
        parse_workload(d)
    assert e.value.field == "pipelines[1].gpus" and "at most cluster.gpus (8)" in e.value.allowed


def test_default_share_of_nothing_is_an_error():
    d = base()
    d["pipelines"][1]["gpus"] = 8
    d["pipelines"][1]["rollout_tp"] = 1
    with pytest.raises(SpecError) as e:
        parse_workload(d)
    assert e.value.field == "pipelines[0].gpus" and e.value.value == "<missing>"


def test_default_share_smaller_than_tp():
    d = base()
    d["pipelines"][0]["rollout_tp"] = 8  # default share is 4
    with pytest.raises(SpecError) as e:
        parse_workload(d)
    assert e.value.field == "pipelines[0].rollout_tp"


def test_unknown_key_hint():
    d = base()
    d["pipelines"][0]["respone_len"] = d["pipelines"][0].pop("response_len")
    with pytest.raises(SpecError) as e:
        parse_workload(d)
    assert e.value.field == "pipelines[0].respone_len" and "did you mean 'response_len'" in e.value.allowed


def test_root_not_a_mapping():
    with pytest.raises(SpecError) as e:
        parse_workload([1, 2])
    assert e.value.field == "<root>"


def test_yaml_syntax_error(tmp_path):
    f = tmp_path / "broken.yaml"
    f.write_text("version: 1\ncluster: {gpus: 8\npipelines: [\n")
    with pytest.raises(SpecError) as e:
        load_workload(f)
    assert e.value.field == "<file>" and e.value.where == str(f)
    assert "line" in str(e.value.value)


def test_missing_file():
    with pytest.raises(SpecError) as e:
        load_workload("/nonexistent/w.yaml")
    assert e.value.field == "<file>"


def test_empty_file(tmp_path):
    f = tmp_path / "empty.yaml"
    f.write_text("")
    with pytest.raises(SpecError) as e:
        load_workload(f)
    assert e.value.field == "<root>" and e.value.where == str(f)


def test_error_names_the_file(tmp_path):
    d = base()
    d["pipelines"][1]["turns"]["weights"] = [1, 2]
    f = tmp_path / "w.yaml"
    f.write_text(yaml.safe_dump(d))
    with pytest.raises(SpecError) as e:
        load_workload(f)
    assert str(e.value).startswith(f"{f}: pipelines[1].turns.weights: got [1, 2]; allowed: ")


# ----------------------------------------------------------------- hypothesis: generated workloads round-trip

dist_st = st.one_of(
    st.builds(lambda v: {"dist": "const", "value": v}, st.integers(1, 5000)),
    st.builds(lambda m, s: {"dist": "lognormal", "median": m, "sigma": s},
              st.floats(1, 5000), st.floats(0, 2)),
    st.builds(lambda a, b: {"dist": "uniform", "low": a, "high": a + b}, st.integers(1, 100), st.integers(0, 900)),
)


@st.composite
def workload_st(draw):
    n = draw(st.integers(1, 4))
    gpus = draw(st.integers(n, 64))
    pipes = []
    for i in range(n):
        mode = draw(st.sampled_from(["sync", "async"]))
        p = {
            "name": f"p{i}",
            "model": draw(st.sampled_from(KNOWN_MODELS)),
            "algorithm": draw(st.sampled_from(ALGORITHMS)),
            "mode": mode,
            "staleness": 0 if mode == "sync" else draw(st.integers(0, 4)),
            "prompts_per_step": draw(st.integers(1, 512)),
            "samples_per_prompt": draw(st.integers(1, 16)),
            "max_response_len": draw(st.integers(1, 32768)),
            "prompt_len": draw(dist_st),
            "response_len": draw(dist_st),
            "steps": draw(st.integers(1, 100)),
        }
        if draw(st.booleans()):
            p.update(turns=draw(dist_st), tool_latency_s=draw(dist_st), observation_len=draw(dist_st))
        pipes.append(p)
    return {"version": 1, "cluster": {"gpus": gpus, "gpu": draw(st.sampled_from(KNOWN_GPUS)),
                                      "gpus_per_node": draw(st.integers(1, 8))}, "pipelines": pipes}


@settings(max_examples=60, deadline=None)
@given(workload_st())
def test_generated_workloads_round_trip(d):
    w = parse_workload(d)
    assert parse_workload(yaml.safe_load(yaml.safe_dump(w.to_dict()))) == w
    shares = w.static_gpus()
    assert sum(shares) == w.cluster.gpus and min(shares) >= 1
    for p, src in zip(w.pipelines, d["pipelines"]):
        assert p.samples_per_step == src["prompts_per_step"] * src["samples_per_prompt"]
        assert p.agentic == ("turns" in src)


# ----------------------------------------------------------------- the reference stays in sync

DOC = REPO / "docs" / "workload.md"


def test_doc_example_parses(tmp_path, monkeypatch):
    import json
    import re

    (tmp_path / "verl").mkdir()
    (tmp_path / "verl" / "x.jsonl").write_text(json.dumps({"input": 100, "output": [10, 20]}) + "\n")
    monkeypatch.setenv("JIGSAW_TRACE_DIR", str(tmp_path))
    example = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)[0]
    w = parse_workload(yaml.safe_load(example), where="docs/workload.md")
    assert [p.name for p in w.pipelines] == ["dapo-math-7b", "search-agent-7b"]


def test_doc_names_every_key_and_distribution():
    from jigsaw_plugin.workload import DISTRIBUTIONS, ROLES
    from jigsaw_plugin.workload.spec import _CLUSTER_KEYS, _PIPELINE_KEYS, _REWARD_KEYS

    text = DOC.read_text()
    for name in (*_CLUSTER_KEYS, *_PIPELINE_KEYS, *_REWARD_KEYS, *KNOWN_MODELS, *KNOWN_GPUS, *ROLES[:-1]):
        assert f"`{name}`" in text, name
    for kind in DISTRIBUTIONS:
        assert f"| `{kind}` |" in text, kind


# --------------------------------------------------------------------------- group_correlation


def test_group_correlation_default_and_round_trip():
    assert parse_workload(copy.deepcopy(BASE)).pipelines[0].group_correlation == 0.0
    data = copy.deepcopy(BASE)
    data["pipelines"][0]["group_correlation"] = 0.084
    w = parse_workload(data)
    assert w.pipelines[0].group_correlation == 0.084
    assert parse_workload(w.to_dict()).pipelines == w.pipelines
    assert "group_correlation" not in parse_workload(copy.deepcopy(BASE)).to_dict()["pipelines"][0]


@pytest.mark.parametrize("value", [-0.1, 1.0, 1.5, "high", True, [0.1], float("nan")])
def test_bad_group_correlation_is_spec_error(value):
    data = copy.deepcopy(BASE)
    data["pipelines"][0]["group_correlation"] = value
    with pytest.raises(SpecError) as e:
        parse_workload(data)
    assert e.value.field == "pipelines[0].group_correlation"
    assert "[0, 1)" in e.value.allowed
