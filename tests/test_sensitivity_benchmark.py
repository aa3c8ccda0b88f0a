"""benchmarks/sensitivity.py: a run's makespan under a change too small to matter."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import sensitivity  # noqa: E402


def _runs(*spans, bound=50.0):
    return [{"scale": s, "makespan_s": m, "bound_s": bound} for s, m in zip(sensitivity.SCALES, spans)]


def test_each_perturbed_run_is_read_against_the_fitted_models():
    assert sensitivity.moves(_runs(100.0, 100.5, 99.0, 100.0, 101.0)) == pytest.approx([0.005, -0.01, 0.0, 0.01])


def test_the_block_names_the_largest_and_median_change_of_each_run():
    data = {"c": {"jigsaw": _runs(100.0, 100.5, 99.0, 100.0, 101.0), "verl-sync": _runs(200.0, 200.0, 200.0, 200.0, 200.0)}}
    block = sensitivity.render(data)
    assert "| (c) | jigsaw | 100.0 | 100.5, 99.0, 100.0, 101.0 | 1.00% | 0.75% | 3 | 50.0 |" in block
    assert "| (c) | verl-sync | 200.0 | 200.0, 200.0, 200.0, 200.0 | 0.00% | 0.00% | 0 | 50.0 |  |" in block
    assert "moves jigsaw's runs by up to 1.00%" in block


def test_jigsaw_gap_recovered_is_read_against_verl_sync_at_the_same_scale():
    """(200 - 100) / (200 - 50) = 67% at the fitted model; the perturbed runs 66%-67%."""
    data = {"c": {"jigsaw": _runs(100.0, 100.5, 99.0, 100.0, 101.0), "verl-sync": _runs(200.0, 200.0, 200.0, 200.0, 200.0)}}
    assert sensitivity._gaps(data["c"]) == pytest.approx([100 / 150, 99.5 / 150, 101 / 150, 100 / 150, 99 / 150])
    assert "| 50.0 | 67% (66% - 67%) |" in sensitivity.render(data)


def test_a_run_scales_only_the_host_time_per_decode_step(monkeypatch):
    """The job prices with the fitted factors of the workload's device class, one term scaled."""
    seen = {}

    class _Sim:
        def __init__(self, wl, policy, seed, factors=None):
            seen["factors"] = factors

        def run(self):
            return {"makespan_s": 1.0, "bounds": {"makespan_lower_bound_s": 0.5}}

    import jigsaw_plugin.sim as sim
    from jigsaw_plugin.costmodel.predictor import EfficiencyFactors

    monkeypatch.setattr(sim, "Simulation", _Sim)
    got = sensitivity.run((str(sensitivity.EXAMPLES / "demo.yaml"), "jigsaw", 1 + 1e-4))
    assert got == {"makespan_s": 1.0, "bound_s": 0.5}
    base = EfficiencyFactors()
    assert seen["factors"].decode_step_overhead_s == pytest.approx(base.decode_step_overhead_s * (1 + 1e-4))
    assert seen["factors"].forward_mfu == base.forward_mfu
