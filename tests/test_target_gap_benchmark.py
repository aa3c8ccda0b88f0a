"""benchmarks/target_gap.py: what recovering 70% of the gap asks of a run, from the identity
devices x makespan = ideal device-seconds + gap, and its block from the saved runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import target_gap  # noqa: E402


def test_the_cut_follows_from_the_identity():
    # 10 devices, verl-sync 300 s, bound 100 s, jigsaw 200 s with a gap of 500 device-seconds:
    # ideal 10 x 200 - 500 = 1500; 70% of the gap means 300 - 0.7 x 200 = 160 s, so a gap of
    # at most 10 x 160 - 1500 = 100 device-seconds: 400 to cut
    got = target_gap.needs(10, 300.0, 100.0, 200.0, {"idle": 300.0, "rollout": 150.0, "training": 50.0, "sync": 0.0})
    assert got["ideal_device_s"] == pytest.approx(1500.0)
    assert got["goal_makespan_s"] == pytest.approx(160.0)
    assert got["allowed_gap_device_s"] == pytest.approx(100.0)
    assert got["cut_device_s"] == pytest.approx(400.0)
    assert got["recovered"] == pytest.approx(0.5)
    # past the target: nothing to cut
    assert target_gap.needs(10, 300.0, 100.0, 150.0, {"idle": 10.0})["cut_device_s"] == 0.0


def test_the_block_gives_each_parts_share_of_the_cut_and_none_where_none_is_asked():
    rows = []
    for key, makespan in (("a", 200.0), ("f", 150.0)):
        parts = {"idle": 300.0, "rollout": 150.0, "training": 50.0, "sync": 0.0}
        row = {"key": key, "devices": 10, "verl_s": 300.0, "bound_s": 100.0, "makespan_s": makespan,
               "parts": parts, "knobs_recovered": None, "oracle_recovered": 0.55}
        row.update(target_gap.needs(10, 300.0, 100.0, makespan, parts))
        rows.append(row)
    text = target_gap.render(rows)
    a = next(line for line in text.splitlines() if line.startswith("| (a) |"))
    cells = [c.strip() for c in a.strip("|").split("|")]
    assert cells[9:15] == ["400", "133%", "267%", "800%", "-", "55%"]  # cut; its share of idle, rollout, training
    f = next(line for line in text.splitlines() if line.startswith("| (f) |"))
    assert [c.strip() for c in f.strip("|").split("|")][9:13] == ["0", "-", "-", "-"]
    assert "1 of 2 workloads are short of 70%; on (a) the cut asked is more than all" in text
    assert text.startswith("<!-- target-gap:start -->") and text.endswith("<!-- target-gap:end -->")


def test_the_saved_runs_keep_the_identity_and_match_the_seeds_block():
    rows = {r["key"]: r for r in target_gap.gather()}
    assert set(rows) == set(target_gap.KEYS)
    for r in rows.values():
        assert r["ideal_device_s"] + r["gap_device_s"] == pytest.approx(r["devices"] * r["makespan_s"])
        assert r["ideal_device_s"] / r["devices"] <= r["bound_s"] * (1 + 1e-9)  # the work bound is below the bound
        assert sum(r["parts"].values()) == pytest.approx(r["gap_device_s"])
    import seeds
    import json

    saved = json.loads((ROOT / "benchmarks" / "results" / "seeds.json").read_text())
    for key, r in rows.items():
        assert r["recovered"] == pytest.approx(seeds.figures(saved[key]["0"])[1], abs=1e-3)


def test_the_doc_block_is_what_the_saved_runs_render():
    # a re-run of a block it reads (pipeline gaps, seeds, knobs, the ablations) re-renders it
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    block = text[text.index("<!-- target-gap:start -->"):text.index("<!-- target-gap:end -->") + len("<!-- target-gap:end -->")]
    assert block == target_gap.render(target_gap.gather()), "run `python benchmarks/target_gap.py`"
