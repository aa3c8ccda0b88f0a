"""The bundled benchmark workloads (a)-(f): they parse, are registered by key, a 1-step version
of (e) and (f) simulates without losing a sample, a 1-step version of each keeps its bounds and
every pipeline's own floor, and (where the PolyTrace traces are on this machine) every fitted
figure in (e) and (f) is what benchmarks/fit_traces.py computes."""

from __future__ import annotations

import copy
import os
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml

from jigsaw_plugin.bench.bundled import (BUNDLED_WORKLOADS, benchmark_workload, bundled_workload,
                                         resolve_workload)
from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.scheduler import get_policy
from jigsaw_plugin.sim import Simulation
from jigsaw_plugin.workload import load_workload, parse_workload
from sim_helpers import HookLog

ROOT = Path(__file__).resolve().parents[1]
NEW = ("e_dapo_longtail_32gpu.yaml", "f_agentic_32gpu.yaml")
# prompts are cut by this much in the 1-step runs so the test stays at a second or two
SHRINK = {NEW[0]: 8, NEW[1]: 32}


def test_every_benchmark_workload_is_a_bundled_file_that_parses():
    assert [w.key for w in BUNDLED_WORKLOADS] == list("abcdef")
    for w in BUNDLED_WORKLOADS:
        wl = load_workload(w.path)
        assert wl.pipelines, w.file


def test_resolve_workload_by_key_stem_name_or_path():
    e = bundled_workload(NEW[0])
    assert resolve_workload("e") == e
    assert resolve_workload("e_dapo_longtail_32gpu") == e
    assert resolve_workload(NEW[0]) == e
    assert resolve_workload(str(ROOT / "examples/workloads" / NEW[1])) == ROOT / "examples/workloads" / NEW[1]
    assert benchmark_workload("f").file == NEW[1]
    with pytest.raises(SpecError) as err:
        resolve_workload("g")
    assert err.value.field == "workload" and err.value.value == "g"
    assert "e, f" in err.value.allowed and NEW[0] in err.value.allowed


def test_long_tail_workload_reaches_the_32k_cap():
    wl = load_workload(bundled_workload(NEW[0]))
    dapo = [p for p in wl.pipelines if p.algorithm == "dapo"]
    assert len(dapo) >= 2 and {p.model for p in dapo} >= {"qwen2.5-7b", "qwen2.5-32b"}
    rng = np.random.default_rng(0)
    for p in dapo:
        assert p.max_response_len == 32768 and p.mode == "sync"
        draws = p.response_len.sample(rng, 200_000)
        assert draws.max() > 20_000  # the long tail reaches 20-32K
        assert np.quantile(draws, 0.99) / np.median(draws) > 5  # p99 about 6x the median (verl/)


def test_agentic_workload_has_many_turns_minute_tools_and_a_sandboxed_reward():
    wl = load_workload(bundled_workload(NEW[1]))
    assert all(p.agentic for p in wl.pipelines)
    swe = next(p for p in wl.pipelines if p.name == "swe-agent-32b")
    rng = np.random.default_rng(0)
    tools = swe.tool_latency_s.sample(rng, 100_000)
    assert np.quantile(tools, 0.5) < 5 and tools.max() >= 60  # seconds to minutes
    assert swe.turns.sample(rng, 100_000).max() >= 30
    assert swe.reward.kind == "sandbox" and swe.reward.latency_s.sample(rng, 1000).mean() > 30


def _one_step(name: str, shrink: int) -> object:
    """The file with one step per pipeline and prompts cut by ``shrink`` (a fast test)."""
    doc = copy.deepcopy(yaml.safe_load(bundled_workload(name).read_text()))
    for p in doc["pipelines"]:
        p["steps"] = 1
        p["prompts_per_step"] = max(1, p["prompts_per_step"] // shrink)
    return parse_workload(doc)


@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize("policy", ["verl-sync", "jigsaw"])
def test_one_step_simulates_without_loss(name, policy):
    wl = _one_step(name, SHRINK[name])
    log = HookLog()
    sim = Simulation(wl, get_policy(policy), seed=0, hooks=log, record_requests=True)
    result = sim.run()
    for p in wl.pipelines:
        assert result["pipelines"][p.name]["samples"] == p.samples_per_step
        s = sim.world.pipelines[p.name].steps[0]
        assert s.n_rewarded == s.n == p.samples_per_step
        finished = Counter((kw["request_id"], kw["turn"]) for kw in log.by("jigsaw_request_finished")
                           if kw["pipeline"] == p.name)
        assert set(finished.values()) == {1}, "a request finished twice"
        assert set(finished) == {(f"{p.name}/0/{i}", t) for i in range(s.n) for t in range(int(s.samples.turns[i]))}
        assert sum(kw["generated_tokens"] for kw in log.by("jigsaw_request_finished")
                   if kw["pipeline"] == p.name) == int(s.samples.gen_tokens.sum())
    assert result["makespan_s"] >= result["bounds"]["makespan_lower_bound_s"] - 1e-6


@pytest.mark.parametrize("key", [w.key for w in BUNDLED_WORKLOADS])
@pytest.mark.parametrize("policy, predictor", [("verl-sync", "history"), ("jigsaw", "history"),
                                               ("jigsaw", "oracle")])
def test_no_run_of_a_bundled_workload_holds_a_pipeline_below_its_own_floor(key, policy, predictor):
    # one step, prompts cut 32-fold: each pipeline's part of the ideal (``Bounds.pipelines``)
    # is a floor on its own rollout and training device-seconds, and the makespan bound holds
    r = Simulation(_one_step(benchmark_workload(key).file, 32), get_policy(policy), seed=0,
                   predictor=predictor).run()
    assert r["makespan_s"] >= r["bounds"]["makespan_lower_bound_s"] - 1e-6
    mine = r["gap_breakdown"]["pipelines"]
    assert set(mine) == set(r["pipelines"])
    for own in mine.values():
        assert own["rollout_above_ideal_device_s"] >= -1e-6 and own["training_above_ideal_device_s"] >= -1e-6, own


TRACES = Path(os.environ.get("JIGSAW_TRACE_DIR", ROOT.parent / "shared" / "traces" / "polytrace"))


@pytest.mark.skipif(not (TRACES / "search_r1").is_dir(), reason="PolyTrace traces not on this machine")
@pytest.mark.parametrize("workload", ["e", "f"])
def test_fitted_figures_are_what_fit_traces_computes(workload):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from fit_traces import check_workload

    checks = check_workload(workload, TRACES)
    assert checks and [c for c in checks if not c.agrees] == []
