"""benchmarks/knobs.py: each knob moved alone, the in-sample combination, and the block."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import knobs  # noqa: E402

from jigsaw_plugin.scheduler import get_policy  # noqa: E402


def test_every_knob_and_value_is_a_valid_jigsaw_option_off_its_default():
    from jigsaw_plugin.scheduler.jigsaw.config import JigsawConfig

    defaults = {f.name: f.default for f in JigsawConfig.__dataclass_fields__.values()}
    for knob, values in knobs.KNOBS.items():
        for v in values:
            get_policy("jigsaw", **{knob: v})  # a SpecError names a bad knob or type
            assert v != defaults[knob], (knob, v)


def _run(options: dict, makespan: float, bound: float = 100.0) -> dict:
    return {"options": options, "makespan_s": makespan, "bound_s": bound}


def test_the_combination_takes_each_knob_that_helped_at_its_best_value():
    runs = [_run({}, 200.0), _run({"min_gain": 1.0}, 190.0), _run({"min_gain": 4.0}, 180.0),
            _run({"width": 2}, 210.0), _run({"latency_slack": 0.2}, 199.0)]
    assert knobs._combined(runs) == {"min_gain": 4.0, "latency_slack": 0.2}
    assert knobs._combined([_run({}, 200.0), _run({"width": 2}, 200.0)]) == {}  # a tie is no gain


def test_the_gap_is_against_the_runs_own_bound():
    assert knobs._gap(300.0, _run({}, 200.0, 100.0)) == pytest.approx(0.5)
    assert knobs._gap(100.0, _run({}, 100.0, 100.0)) is None  # no gap to recover


def test_the_block_names_the_best_setting_and_the_largest_move(monkeypatch):
    monkeypatch.setattr(knobs, "KNOBS", {"min_gain": (1.0, 4.0), "width": (2,)})
    data = {"e": {"verl-sync": {"makespan_s": 300.0, "bound_s": 100.0},
                  "jigsaw": [_run({}, 200.0), _run({"min_gain": 1.0}, 202.0), _run({"min_gain": 4.0}, 180.0),
                             _run({"width": 2}, 200.0)],
                  "combined": _run({"min_gain": 4.0}, 180.0)}}
    text = knobs.render(data)
    row = next(line for line in text.splitlines() if line.startswith("| (e) |"))
    assert "| 200.0 | 50% | min_gain=4: 180.0 | 60% |" in row
    assert "| min_gain (2) | 4 | -10.0% |" in text
    assert "The largest move of one knob: 10.0% (min_gain on (e))" in text
    assert "0 of the 3 settings are faster on one workload and slower on another" in text


def test_a_run_both_values_of_a_knob_speed_up_is_named_as_moving_with_any_perturbation(monkeypatch):
    monkeypatch.setattr(knobs, "KNOBS", {"min_gain": (1.0, 4.0)})

    def wl(base, low, high):
        return {"verl-sync": {"makespan_s": 300.0, "bound_s": 100.0},
                "jigsaw": [_run({}, base), _run({"min_gain": 1.0}, low), _run({"min_gain": 4.0}, high)]}

    text = knobs.render({"a": wl(200.0, 190.0, 196.0), "f": wl(200.0, 210.0, 190.0)})
    assert "1 of the 2 settings are faster on one workload and slower on another" in text
    assert "On (a) both values tried of min_gain are faster" in text and "On (f)" not in text
    assert "on none of these" in text  # 60% < the 70% target
