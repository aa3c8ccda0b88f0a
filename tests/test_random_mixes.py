"""benchmarks/random_mixes.py draws valid, reproducible job mixes (the benchmark itself
runs every policy on them; here only what it feeds them is checked)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import random_mixes as rm  # noqa: E402

from jigsaw_plugin.workload import parse_workload  # noqa: E402


def test_mixes_are_reproducible_valid_and_fill_whole_nodes():
    drawn = rm.mixes(2026, 16)
    assert drawn == rm.mixes(2026, 16)
    assert drawn != rm.mixes(2027, 16)
    for name, spec in drawn:
        wl = parse_workload(spec, base_dir=rm.EXAMPLES)
        assert 2 <= len(wl.pipelines) <= 5
        assert wl.cluster.gpus % 8 == 0 and wl.cluster.gpus == sum(p.gpus for p in wl.pipelines)
        assert all(p.steps == rm.STEPS for p in wl.pipelines)
        assert all(p.gpus >= 8 for p in wl.pipelines if rm._large(p.model))


def test_the_block_separates_on_policy_from_off_policy_baselines():
    spec = rm.mixes(1, 1)[0][1]
    runs = [{"mix": "m0", "policy": "jigsaw", "makespan_s": 100.0, "effective_utilisation": 0.5,
             "bounds": {"makespan_lower_bound_s": 80.0}},
            {"mix": "m0", "policy": "verl-sync", "makespan_s": 150.0},
            {"mix": "m0", "policy": "rollmux", "error": "pipelines[0].gpus: too small"},
            {"mix": "m0", "policy": "one-step-off", "makespan_s": 120.0},
            {"mix": "m0", "policy": "streamrl", "makespan_s": 120.0},
            {"mix": "m0", "policy": "areal", "makespan_s": 90.0}]
    text = rm.section({"seed": 1, "steps": 4, "mixes": {"m0": spec}, "runs": runs}, "-", "-")
    assert "| 1.50x |" in text  # vs the best on-policy baseline (verl-sync; rollmux refused)
    assert "0.90x (areal)" in text and "m0 (jigsaw 100 s): areal 90 s" in text
    assert "No on-policy baseline finished a mix first." in text
    assert "| n/a |" in text
