"""benchmarks/seeds.py: the bundled workloads at several seeds, each against its own bound."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import seeds  # noqa: E402


def _runs(verl: float, jig: float, bound: float) -> dict:
    return {"verl-sync": {"makespan_s": verl, "bound_s": bound}, "jigsaw": {"makespan_s": jig, "bound_s": bound}}


def test_each_seed_is_measured_against_its_own_bound():
    ratio, gap = seeds.figures(_runs(200.0, 150.0, 100.0))
    assert ratio == pytest.approx(200 / 150) and gap == pytest.approx(0.5)
    assert seeds.figures(_runs(100.0, 100.0, 100.0))[1] is None  # no gap to recover


def test_the_block_gives_each_workloads_median_and_range_over_its_seeds():
    data = {"a": {"0": _runs(200.0, 150.0, 100.0), "1": _runs(200.0, 125.0, 100.0), "2": _runs(200.0, 175.0, 100.0)},
            "f": {"0": _runs(300.0, 150.0, 100.0), "1": _runs(150.0, 125.0, 100.0)}}
    text = seeds.render(data)
    row = next(line for line in text.splitlines() if line.startswith("| (a) |"))
    assert "| 3 | 1.33x | 1.14x - 1.60x | 50% | 25% - 75% |" in row
    assert "(a) 50% at seed 0, median 50%" in text
    assert "(f) 1.20x - 2.00x" in text  # the widest spread of the speed-up is named
