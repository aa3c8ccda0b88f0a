"""benchmarks/tail_free.py: a workload's tail-free variant (every per-request figure at
its mean)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import tail_free  # noqa: E402

from jigsaw_plugin.errors import SpecError  # noqa: E402
from jigsaw_plugin.workload import parse_workload  # noqa: E402
from jigsaw_plugin.workload.distributions import build_distribution  # noqa: E402

AGENT = yaml.safe_load((ROOT / "examples" / "workloads" / "a_sync4_32gpu.yaml").read_text())


def test_every_per_request_figure_becomes_its_mean_and_the_rest_is_kept():
    out = tail_free.tail_free_spec(AGENT)
    for before, after in zip(AGENT["pipelines"], out["pipelines"]):
        for key, whole in tail_free.PER_REQUEST.items():
            if key not in before:
                assert key not in after
                continue
            mean = build_distribution(before[key], key).mean()
            assert after[key]["dist"] == "const"
            want = max(1, round(mean)) if whole else mean
            assert after[key]["value"] == pytest.approx(want)
        assert after["reward"]["latency_s"]["dist"] == "const"
        assert {k: v for k, v in after.items() if k not in tail_free.PER_REQUEST and k != "reward"} == \
               {k: v for k, v in before.items() if k not in tail_free.PER_REQUEST and k != "reward"}
    assert AGENT["pipelines"][1]["turns"]["dist"] == "categorical"  # the workload itself is left alone


def test_the_variant_is_a_valid_workload_whose_samples_do_not_vary():
    w = parse_workload(tail_free.tail_free_spec(AGENT))
    agent = next(p for p in w.pipelines if p.name == "search-agent-a")
    rng = np.random.default_rng(0)
    assert len(set(agent.response_len.sample(rng, 64))) == 1
    turns = build_distribution(AGENT["pipelines"][1]["turns"], "turns").mean()  # 2.62 on average
    assert set(agent.turns.sample(rng, 8).tolist()) == {float(round(turns))}


def test_a_bad_distribution_is_refused_naming_its_field():
    spec = {"version": 1, "cluster": {"gpus": 8, "gpu": "h100"},
            "pipelines": [{"name": "x", "response_len": {"dist": "nope"}}]}
    with pytest.raises(SpecError, match=r"pipelines\[0\].response_len.dist"):
        tail_free.tail_free_spec(spec)
