"""benchmarks/ablations_ef.py (the ablation table of (e) and (f)) and the policy tables'
saved-run bookkeeping in benchmarks/policies.py (read by position: a misaligned file must
fail, not print another mechanism's figures)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import ablations_ef  # noqa: E402
import policies  # noqa: E402

from jigsaw_plugin.bench import ab  # noqa: E402


def _run(makespan: float, bound: float = 1000.0) -> dict:
    return {"makespan_s": makespan, "lower_bound_s": bound, "samples_per_s": 1.0, "wall_s": 1.0}


def test_every_mechanism_of_ablate_has_a_row_with_its_change_and_its_gap_recovered():
    labels = [label for label, _ in ablations_ef._runs("e")]
    assert labels[:2] == ["verl-sync", "jigsaw (defaults)"] and labels[-1] == ablations_ef.ORACLE
    assert len(labels) == 3 + len(ab.ABLATIONS) + len(ab.OFF_BY_DEFAULT)
    assert "no lend_beside_stages" in labels and "with lend_rollouts_to_critical" in labels
    data = {"e": {label: _run(1500.0) for label in labels}}
    data["e"]["verl-sync"] = _run(2000.0)
    data["e"]["no migration"] = _run(1800.0)  # slower without it: migration pays
    data["e"]["with colocate"] = _run(1400.0)  # faster with it
    text = ablations_ef.render(data)
    # gap recovered against verl-sync's makespan and the run's own bound: (2000 - 1500) / (2000 - 1000)
    assert "| jigsaw (defaults) | 1500.0 (+0.0%) / 50% |" in text
    assert "| no migration | 1800.0 (+20.0%) / 20% |" in text
    assert "| with colocate | 1400.0 (-6.7%) / 60% |" in text
    data["e"]["with balance"] = _run(1600.0)  # off by default, slower on
    text = ablations_ef.render(data)
    assert "(the run without it is slower): no migration +20.0%;" in text
    assert "(the run with it is slower by over 0.5%): with balance +6.7%;" in text
    assert "(the run with it flipped is faster): with colocate -6.7%." in text


def test_a_saved_policy_file_of_another_length_is_refused_not_misread(tmp_path, monkeypatch):
    saved = tmp_path / "policies.json"
    saved.write_text(json.dumps([{"policy": "verl-sync"}] * 3))
    monkeypatch.setattr(policies, "RESULTS", saved)
    monkeypatch.setattr(policies, "SPLITS", tmp_path / "splits.json")
    (tmp_path / "splits.json").write_text(json.dumps({k: {} for k in policies.WORKLOADS}))
    with pytest.raises(SystemExit, match="--add-ablation"):
        policies.run(reuse=True)


def test_add_ablation_names_what_it_does_not_know(tmp_path, monkeypatch):
    saved = tmp_path / "policies.json"
    saved.write_text("[]")
    monkeypatch.setattr(policies, "RESULTS", saved)
    with pytest.raises(SystemExit, match="no_such_switch is not one of"):
        policies._add_ablation([], "migration,no_such_switch")


def test_add_runs_only_the_named_mechanisms_and_keeps_the_rest(tmp_path, monkeypatch):
    saved = {k: {label: _run(1500.0) for label, _ in ablations_ef._runs(k)} for k in ablations_ef.KEYS}
    out = tmp_path / "ablations_ef.json"
    out.write_text(json.dumps(saved))
    monkeypatch.setattr(ablations_ef, "OUT", out)
    ran = []

    def fake_run_many(jobs):  # the jobs it would run, each answered with a made-up result
        ran.extend(jobs)
        return [{"makespan_s": 1400.0, "bounds": {"makespan_lower_bound_s": 1000.0}, "samples_per_s": 1.0,
                 "wall_s": 1.0} for _ in jobs]

    monkeypatch.setattr(ablations_ef, "run_many", fake_run_many)
    data = ablations_ef.add("migration")
    assert [j[2] for j in ran] == [{"migration": False}] * len(ablations_ef.KEYS)
    assert all(data[k]["no migration"]["makespan_s"] == 1400.0 for k in ablations_ef.KEYS)
    assert all(data[k]["no resize"]["makespan_s"] == 1500.0 for k in ablations_ef.KEYS)
    with pytest.raises(SystemExit, match="no_such_switch is not one of"):
        ablations_ef.add("no_such_switch")
