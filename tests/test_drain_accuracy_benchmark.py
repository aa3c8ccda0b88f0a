"""benchmarks/drain_accuracy.py: the order statistic and the per-bucket summary."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import drain_accuracy  # noqa: E402


@pytest.mark.parametrize("n", [1, 2, 8, 64])
def test_equal_exponential_means_give_the_harmonic_number(n):
    harmonic = sum(1.0 / k for k in range(1, n + 1))
    assert drain_accuracy.expected_max_exponential([300.0] * n) == pytest.approx(300.0 * harmonic, rel=2e-3)


def test_the_order_statistic_matches_a_monte_carlo_of_unequal_means_and_skips_empty_ones():
    rng = np.random.default_rng(0)
    means = rng.lognormal(5, 1, 12)
    draws = rng.exponential(means, size=(200_000, len(means))).max(axis=1)
    got = drain_accuracy.expected_max_exponential(np.concatenate((means, [0.0, -1.0])))
    assert got == pytest.approx(draws.mean(), rel=0.01)
    assert got > means.max()  # the expected largest exceeds the largest expectation
    assert drain_accuracy.expected_max_exponential([]) == 0.0


def test_the_summary_buckets_by_requests_held_and_drops_rows_with_nothing_left():
    rows = [(1, 100.0, 100.0, 200.0, 100.0, 200.0),  # half the truth
            (3, 50.0, 120.0, 100.0, 90.0, 90.0),
            (3, 50.0, 120.0, 0.0, 0.0, 0.0),  # nothing left: dropped
            (70, 10.0, 40.0, 40.0, 700.0, 350.0)]
    out = {b["requests"]: b for b in drain_accuracy.summarise(rows)}
    assert set(out) == {"1", "2-4", "65+"}
    assert out["1"]["largest_mean"][1] == pytest.approx(0.5)
    assert out["1"]["largest_mean_log_err"] == pytest.approx(math.log(2))
    assert out["2-4"]["replicas"] == 1 and out["2-4"]["e_max"][1] == pytest.approx(1.2)
    assert out["65+"]["largest_mean"][1] == pytest.approx(0.25) and out["65+"]["work"] == pytest.approx(2.0)
    assert out["65+"]["e_max_log_err"] == pytest.approx(0.0)


def test_the_probe_reads_the_simulators_truth_beside_the_predictions():
    # a short run of the demo workload: each probed replica's rows are consistent (its true
    # longest within its true work, E[max] at least the largest mean)
    probe, _ = drain_accuracy.probed_run("demo.yaml", every=5)
    assert probe.rows and probe.rounds >= 5
    for held, largest, e_max, truth, work, true_work in probe.rows:
        assert held >= 1 and largest >= 0 and truth >= 0 and true_work >= truth
        assert e_max >= largest * 0.999  # E[max] of the means is never below the largest mean
    assert drain_accuracy.summarise(probe.rows)


def test_with_the_oracle_the_probe_finds_every_drain_exact():
    # the probe pairs each replica's predictions with the truth of the same requests: with the
    # oracle's answers (the truth itself; ablation only) the largest mean is the true longest,
    # but for the few replicas whose rows the policy read carried (``RefreshPolicy.carry_drift``:
    # a large replica keeps its rows, advanced at its step time, until an eighth changed)
    probe, _ = drain_accuracy.probed_run("demo.yaml", every=3, predictor="oracle")
    rows = np.asarray(probe.rows, float)
    assert len(rows) > 20
    largest, truth, work, true_work = rows[:, 1], rows[:, 3], rows[:, 4], rows[:, 5]
    exact = np.abs(largest - truth) <= 2.0  # whole tokens; a carried row advances by its step time
    assert exact.mean() >= 0.95
    assert np.allclose(work[exact & (rows[:, 0] < 64)], true_work[exact & (rows[:, 0] < 64)],
                       atol=2.0 * rows[exact & (rows[:, 0] < 64), 0])  # replicas too small to carry rows
