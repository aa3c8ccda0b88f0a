"""benchmarks/alone.py: a workload's pipeline alone on the whole pool."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import alone  # noqa: E402


SPEC = {"version": 1, "cluster": {"gpus": 32, "gpu": "h100", "gpus_per_node": 8},
        "pipelines": [{"name": "a", "gpus": 8, "steps": 2}, {"name": "b", "gpus": 24, "steps": 3}]}


def test_a_pipeline_alone_keeps_its_fields_and_gets_the_whole_pool():
    out = alone.alone_spec(SPEC, "b")
    assert out["cluster"] == SPEC["cluster"]
    assert out["pipelines"] == [{"name": "b", "steps": 3}]
    assert SPEC["pipelines"][1]["gpus"] == 24  # the workload itself is left alone


def test_an_unknown_pipeline_is_refused_naming_the_ones_allowed():
    with pytest.raises(SystemExit, match="'c' not in the workload; allowed: a, b"):
        alone.alone_spec(SPEC, "c")
