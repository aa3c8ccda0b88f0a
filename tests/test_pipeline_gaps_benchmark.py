"""benchmarks/pipeline_gaps.py: each pipeline's device-seconds against its own ideal."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import pipeline_gaps  # noqa: E402


def _own(rollout: float, ideal_rollout: float, training: float, ideal_training: float) -> dict:
    return {"rollout_device_s": rollout, "ideal_rollout_device_s": ideal_rollout,
            "rollout_above_ideal_device_s": rollout - ideal_rollout, "training_device_s": training,
            "ideal_training_device_s": ideal_training, "training_above_ideal_device_s": training - ideal_training,
            "weight_sync_device_s": 0.0}


def _result(gap: float, idle: float, pipelines: dict) -> dict:
    return {"gap_breakdown": {"gap_device_s": gap, "idle_device_s": idle, "pipelines": pipelines}}


def test_each_pipeline_is_set_against_its_own_ideal_and_the_runs_gap():
    base = _result(900.0, 300.0, {"p": _own(400.0, 100.0, 200.0, 200.0), "q": _own(300.0, 100.0, 100.0, 100.0)})
    ours = _result(400.0, 100.0, {"p": _own(250.0, 100.0, 220.0, 200.0), "q": _own(180.0, 100.0, 100.0, 100.0)})
    rows = pipeline_gaps.rows("a", base, ours)
    assert rows[0] == ["(a)", "p", "100 / 200", "4.00x", "2.50x", "1.10x", "150 (38%)", "170 (42%)"]
    assert rows[1][1] == "q" and rows[1][3:5] == ["3.00x", "1.80x"]
    assert pipeline_gaps.largest({"a": (base, ours)}) == ["(a) p 42%"]


def test_a_pipeline_with_no_ideal_and_a_run_with_no_gap_render_a_dash():
    ours = _result(0.0, 0.0, {"p": _own(0.0, 0.0, 0.0, 0.0)})
    row = pipeline_gaps.rows("c", ours, ours)[0]
    assert row[3:6] == ["-", "-", "-"] and row[6] == "0 (-)"
    assert "(c) -" in pipeline_gaps.render({"c": (ours, ours)})
