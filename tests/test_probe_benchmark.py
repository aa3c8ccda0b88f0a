"""benchmarks/probe.py: a policy option against the defaults, each change set beside the
workload's noise floor, the gap recovered against the saved verl-sync run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import probe  # noqa: E402


def test_a_change_counts_only_past_the_workloads_noise_floor():
    assert probe.verdict(-0.004, 0.005) == "within noise"
    assert probe.verdict(0.005, 0.005) == "within noise"  # at the floor: not past it
    assert probe.verdict(-0.006, 0.005) == "faster"
    assert probe.verdict(0.006, 0.005) == "slower"
    assert probe.verdict(0.2, None) == "no floor"


def test_the_noise_floor_is_the_largest_move_of_the_perturbed_seed_0_runs(tmp_path):
    path = tmp_path / "sensitivity.json"
    path.write_text(json.dumps({
        "a": {"jigsaw": [{"scale": 1.0, "makespan_s": 100.0}, {"scale": 1.0001, "makespan_s": 101.0},
                         {"scale": 0.9999, "makespan_s": 98.0}],
              "verl-sync": [{"scale": 1.0, "makespan_s": 500.0}, {"scale": 1.0001, "makespan_s": 400.0}]},
        "b": {"jigsaw": [{"scale": 1.0, "makespan_s": 50.0}]}}))  # no perturbed run: no floor
    floors = probe.noise_floors(path)
    assert floors == {"a": pytest.approx(0.02)}  # jigsaw's runs only, not verl-sync's
    assert probe.noise_floors(tmp_path / "missing.json") == {}


def test_the_gap_is_against_verl_sync_and_the_bound_of_the_same_seed(tmp_path):
    path = tmp_path / "seeds.json"
    path.write_text(json.dumps({"c": {"0": {"verl-sync": {"makespan_s": 300.0, "bound_s": 100.0},
                                            "jigsaw": {"makespan_s": 200.0, "bound_s": 100.0}}}}))
    base = probe.baselines(path)
    assert base == {("c", 0): (300.0, 100.0)}
    rows = [{"key": "c", "seed": 0, "defaults_s": 200.0, "with_s": 180.0},
            {"key": "c", "seed": 1, "defaults_s": 200.0, "with_s": 202.0}]
    text = probe.render(rows, {"min_gain": 4.0}, {"c": 0.05}, base)
    seed0 = next(line for line in text.splitlines() if line.startswith("| (c) | 0 |"))
    assert "-10.00%" in seed0 and "faster" in seed0 and "50% / 60%" in seed0
    seed1 = next(line for line in text.splitlines() if line.startswith("| (c) | 1 |"))
    assert "within noise" in seed1 and seed1.rstrip().endswith("| - |")  # no saved verl-sync run at seed 1
    # the geometric mean of 0.9 and 1.01
    assert "Geometric mean of the makespans' ratios: -4.66% over 2 runs (1 faster, 1 within noise)" in text
    assert text.startswith("jigsaw with min_gain=4.0 against its defaults")


@pytest.mark.parametrize("argv, said", [
    (["--policy-opt", "no_such_knob=1"], "no_such_knob"),
    (["--policy-opt", "tail_requests=many"], "tail_requests"),
    (["--policy-opt", "tail_requests=64", "--keys", "a,z"], "--keys: got z"),
    (["--policy-opt", "tail_requests=64", "--seeds", "zero"], "--seeds"),
    (["--policy-opt", "tail_requests=64", "--workers", "0"], "--workers"),
])
def test_bad_input_is_refused_by_field_before_any_run(argv, said, capsys, monkeypatch):
    monkeypatch.setattr(probe, "probe", lambda *a, **k: pytest.fail("ran"))
    assert probe.main(argv) == 2
    assert said in capsys.readouterr().err
