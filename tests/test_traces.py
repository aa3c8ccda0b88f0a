"""Trace replay: PolyTrace readers by role, path resolution, errors, caching.

Tests on the real traces use ../shared/traces/polytrace (relative to the repository root),
or $JIGSAW_TRACE_DIR where set, and skip when the folder is absent. The other tests write
small synthetic trace files and always run.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.workload import (
    ROLES,
    build_distribution,
    clear_trace_cache,
    load_trace,
    load_workload,
    resolve_trace_path,
    sample_step,
)

REPO = Path(__file__).resolve().parents[1]
TRACE_DIR = Path(os.environ.get("JIGSAW_TRACE_DIR") or Path(__file__).resolve().parents[2] / "shared/traces/polytrace")


@pytest.fixture
def traces(monkeypatch) -> Path:
    if not (TRACE_DIR / "verl").is_dir() or not (TRACE_DIR / "search_r1").is_dir():
        pytest.skip(f"PolyTrace traces not found at {TRACE_DIR} (set JIGSAW_TRACE_DIR to the polytrace folder)")
    monkeypatch.setenv("JIGSAW_TRACE_DIR", str(TRACE_DIR))
    return TRACE_DIR


def trace(path, role, **kw):
    return build_distribution({"dist": "trace", "path": str(path), **kw}, "p.f", role=role, where="w.yaml")


def write_jsonl(path: Path, records, gz: bool | None = None) -> Path:
    text = "".join(json.dumps(r) + "\n" for r in records).encode()
    if gz if gz is not None else path.name.endswith(".gz"):
        text = gzip.compress(text)
    path.write_bytes(text)
    return path


VERL_RECS = [
    {"step": 0, "input": 100, "output": [10, 20, 30], "validate": False},
    {"step": 0, "input": 200, "output": [40], "validate": False},
    {"step": 0, "input": 999, "output": [99999], "validate": True},  # validation batch: skipped
]
SEARCH_RECS = [
    {"prompt_len": 300, "turn_count": 2, "validate": False,
     "turns": [{"completion_tokens": 40}, {"completion_tokens": 131}],
     "tool_calls": [{"latency_s": 0.5, "response_token_len": 1027}]},
    {"prompt_len": 310, "turn_count": 1, "validate": False, "turns": [{"completion_tokens": 7}], "tool_calls": []},
]


# ----------------------------------------------------------------- real traces


def test_verl_response_and_prompt_roles(traces):
    resp = trace(traces / "verl", "response_len")
    assert len(resp.values) == 4608  # 6 steps x 96 prompts x 8 samples; filter indices ignored
    assert np.quantile(resp.values, 0.5) == 466 and resp.values.max() == 10112
    prompt = trace(traces / "verl", "prompt_len")
    assert len(prompt.values) == 576
    x = resp.sample(np.random.default_rng(0), 50_000)
    assert set(np.unique(x)) <= set(np.unique(resp.values))  # empirical replay
    assert abs(np.median(x) - 466) < 15
    d = resp.describe()
    assert d["n_values"] == 4608 and d["p50"] == 466 and d["role"] == "response_len"


def test_search_r1_roles(traces):
    p = traces / "search_r1"
    turns = trace(p, "turns")
    assert set(np.unique(turns.values)) == {1, 2, 3, 4, 5}
    assert np.bincount(turns.values.astype(int)).argmax() == 2  # mode 2 (PROVENANCE.md)
    lat = trace(p, "tool_latency_s")
    assert np.quantile(lat.values, [0.5, 0.9, 0.99]) == pytest.approx([0.16, 1.13, 2.69], abs=0.01)
    obs = trace(p, "observation_len")
    assert len(obs.values) == len(lat.values) and obs.values.min() > 0
    resp = trace(p, "response_len")
    assert len(resp.values) > len(turns.values)  # one value per turn
    assert len(resp.values) == pytest.approx(turns.values.sum(), rel=0)
    prompt = trace(p, "prompt_len")
    assert 300 < prompt.mean() < 340


def test_rllm_reward_latency_is_per_sample(traces):
    d = trace(traces / "rllm", "reward_latency_s")
    assert len(d.values) == 10
    # 64-sample batches taking 35-125 s: roughly a second per sample
    assert 0.3 < d.values.min() and d.values.max() < 3


def test_role_without_values_is_spec_error(traces):
    with pytest.raises(SpecError) as e:
        trace(traces / "verl", "tool_latency_s")
    assert e.value.field == "p.f.path" and "tool_calls" in e.value.allowed


def test_single_file_path_and_scale(traces):
    f = traces / "verl" / "packed_lengths_step_0.jsonl.gz"
    d = trace(f, "response_len", scale=2.0)
    assert len(d.values) == 96 * 8
    x = d.sample(np.random.default_rng(1), 1000)
    assert set(np.unique(x)) <= set(np.unique(d.values * 2))
    assert d.mean() == pytest.approx(2 * d.values.mean())


def test_env_var_path_and_determinism(traces):
    a = trace("$JIGSAW_TRACE_DIR/verl", "response_len")
    b = trace("${JIGSAW_TRACE_DIR}/verl", "response_len")
    assert a == b
    assert np.array_equal(a.sample(np.random.default_rng(5), 100), b.sample(np.random.default_rng(5), 100))


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "examples/workloads/trace").glob("*.yaml")))
def test_bundled_trace_workloads_replay(traces, name):
    w = load_workload(REPO / "examples/workloads/trace" / name)
    for p in w.pipelines:
        for field in ("prompt_len", "response_len", "turns", "tool_latency_s", "observation_len"):
            d = getattr(p, field)
            if d is not None and d.kind == "trace":
                assert d.role == field
        s = sample_step(p, 0, 0)
        assert len(s.prompt_len) == p.samples_per_step
        assert np.all(s.generated_per_sample() <= p.max_response_len)


def test_trace_demo_matches_parametric_demo(traces):
    """The parametric demo is fitted to the same traces its twin replays: means agree."""
    fit = load_workload(REPO / "examples/workloads/demo.yaml")
    rep = load_workload(REPO / "examples/workloads/trace/demo.yaml")
    for pf, pr in zip(fit.pipelines, rep.pipelines):
        assert pf.name == pr.name
        for field in ("prompt_len", "response_len", "turns", "tool_latency_s", "observation_len"):
            a, b = getattr(pf, field), getattr(pr, field)
            if a is not None:
                assert a.mean() == pytest.approx(b.mean(), rel=0.08), (pf.name, field)


def test_cache_returns_the_same_array(traces):
    clear_trace_cache()
    p = resolve_trace_path("$JIGSAW_TRACE_DIR/verl")
    a = load_trace(p, "response_len")
    assert load_trace(p, "response_len") is a
    assert not a.flags.writeable
    clear_trace_cache()
    assert load_trace(p, "response_len") is not a


# ----------------------------------------------------------------- synthetic files (always run)


def test_verl_records_and_validate_skipped(tmp_path):
    f = write_jsonl(tmp_path / "a.jsonl.gz", VERL_RECS)
    assert sorted(trace(f, "response_len").values) == [10, 20, 30, 40]
    assert sorted(trace(f, "prompt_len").values) == [100, 200]


def test_search_records_every_role(tmp_path):
    write_jsonl(tmp_path / "s.jsonl", SEARCH_RECS)
    assert sorted(trace(tmp_path, "response_len").values) == [7, 40, 131]
    assert sorted(trace(tmp_path, "turns").values) == [1, 2]
    assert list(trace(tmp_path, "tool_latency_s").values) == [0.5]
    assert list(trace(tmp_path, "observation_len").values) == [1027]
    assert sorted(trace(tmp_path, "prompt_len").values) == [300, 310]


def test_reward_timings_divided_by_batch(tmp_path):
    write_jsonl(tmp_path / "r.jsonl", [{"batch_size": 64, "reward_time_s": 128.0},
                                       {"batch_size": 32, "reward_time_s": 16.0, "validate": False}])
    assert sorted(trace(tmp_path, "reward_latency_s").values) == [0.5, 2.0]


def test_directory_mixes_files_and_ignores_others(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", VERL_RECS[:1])
    write_jsonl(tmp_path / "b.jsonl.gz", SEARCH_RECS[1:])
    (tmp_path / "README.md").write_text("not a trace")
    assert sorted(trace(tmp_path, "response_len").values) == [7, 10, 20, 30]


def test_relative_path_resolves_against_workload_folder(tmp_path):
    tdir = tmp_path / "data" / "mytrace"
    tdir.mkdir(parents=True)
    write_jsonl(tdir / "x.jsonl", VERL_RECS)
    wdir = tmp_path / "work"
    wdir.mkdir()
    (wdir / "w.yaml").write_text(
        "version: 1\ncluster: {gpus: 4, gpu: h100}\npipelines:\n"
        "  - {name: a, model: qwen2.5-7b, prompts_per_step: 2, samples_per_prompt: 2, max_response_len: 100,\n"
        "     steps: 1, prompt_len: {dist: trace, path: ../data/mytrace},\n"
        "     response_len: {dist: trace, path: ../data/mytrace, scale: 0.5}}\n"
    )
    w = load_workload(wdir / "w.yaml")
    d = w.pipelines[0].response_len
    assert d.path == tdir.resolve() and sorted(d.values) == [10, 20, 30, 40]
    s = sample_step(w.pipelines[0], 0, 0)
    assert set(s.gen_tokens) <= {5, 10, 15, 20}
    assert set(s.prompt_len) <= {100, 200}


def test_tilde_expands_to_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    write_jsonl(tmp_path / "t.jsonl", VERL_RECS)
    assert sorted(trace("~/t.jsonl", "prompt_len").values) == [100, 200]


@pytest.mark.parametrize("setup,allowed_part", [
    (lambda d: d / "missing", "existing"),
    (lambda d: d, "*.jsonl"),  # empty directory
    (lambda d: (d / "x.txt").write_text("{}") and d / "x.txt", ".jsonl"),
    (lambda d: (d / "x.jsonl.gz").write_text('{"output": [1]}\n') and d / "x.jsonl.gz", "not gzip"),
    (lambda d: (d / "x.jsonl.gz").write_bytes(b"\x1f\x8b\x08\x00broken") and d / "x.jsonl.gz", "gzip"),
    (lambda d: (d / "x.jsonl").write_text('{"output": [1]}\n{oops\n') and d / "x.jsonl", "line 2"),
    (lambda d: (d / "x.jsonl").write_text("[1, 2]\n") and d / "x.jsonl", "JSON object"),
    (lambda d: (d / "x.jsonl").write_text('{"output": ["a"]}\n') and d / "x.jsonl", "malformed"),
    (lambda d: (d / "x.jsonl").write_text('{"other": 1}\n') and d / "x.jsonl", "verl 'output'"),
    (lambda d: (d / "x.jsonl").write_bytes(b"\xff\xfe\x00") and d / "x.jsonl", "UTF-8"),
])
def test_unreadable_traces_are_spec_errors(tmp_path, setup, allowed_part):
    path = setup(tmp_path)
    with pytest.raises(SpecError) as e:
        trace(path, "response_len")
    assert e.value.field == "p.f.path" and e.value.where == "w.yaml"
    assert allowed_part in e.value.allowed


def test_unset_variable_names_it(monkeypatch):
    monkeypatch.delenv("JIGSAW_TRACE_DIR", raising=False)
    with pytest.raises(SpecError) as e:
        trace("$JIGSAW_TRACE_DIR/verl", "response_len")
    assert "$JIGSAW_TRACE_DIR is not set" in e.value.allowed


def test_roles_listed():
    assert ROLES == ("prompt_len", "response_len", "turns", "tool_latency_s", "observation_len",
                     "reward_latency_s")
    with pytest.raises(SpecError):
        load_trace(Path("."), "bogus_role")
