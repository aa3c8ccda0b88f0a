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


def test_synthetic_mixes_are_reproducible_valid_and_varied():
    drawn = rm.synthetic_mixes(0, 60)
    assert drawn == rm.synthetic_mixes(0, 60)
    assert [name for name, _ in drawn[:2]] == ["s0", "s1"] and rm.synthetic_mixes(5, 1)[0][1] == drawn[5][1]
    seen = {"algorithm": set(), "mode": set(), "gpu": set(), "gpus_per_node": set(), "multi-turn": set()}
    for name, spec in drawn:
        wl = parse_workload(spec)
        assert 1 <= len(wl.pipelines) <= 5
        assert wl.cluster.gpus % wl.cluster.gpus_per_node == 0
        assert wl.cluster.gpus == sum(p.gpus for p in wl.pipelines)
        for p in wl.pipelines:
            assert p.gpus >= 2 * rm.SYNTHETIC_MODELS[p.model]
            seen["algorithm"].add(p.algorithm)
            seen["mode"].add(p.mode)
            seen["multi-turn"].add(p.turns is not None)
        seen["gpu"].add(spec["cluster"]["gpu"])
        seen["gpus_per_node"].add(wl.cluster.gpus_per_node)
    assert seen == {"algorithm": {"grpo", "dapo", "ppo", "reinforce"}, "mode": {"sync", "async"},
                    "gpu": {"h100", "h20", "a100"}, "gpus_per_node": {4, 8}, "multi-turn": {True, False}}


def test_the_synthetic_block_counts_rollmux_against_verl_sync():
    spec = rm.synthetic_mixes(3, 1)[0][1]
    runs = [{"mix": "s3", "policy": "jigsaw", "makespan_s": 100.0, "effective_utilisation": 0.5,
             "bounds": {"makespan_lower_bound_s": 80.0}},
            {"mix": "s3", "policy": "verl-sync", "makespan_s": 150.0},
            {"mix": "s3", "policy": "rollmux", "makespan_s": 140.0},
            {"mix": "s3", "policy": "one-step-off", "makespan_s": 120.0},
            {"mix": "s3", "policy": "streamrl", "makespan_s": 120.0},
            {"mix": "s3", "policy": "areal", "makespan_s": 130.0}]
    text = rm.section({"seed": 3, "steps": None, "synthetic": True, "mixes": {"s3": spec}, "runs": runs}, "-", "-")
    assert text.startswith("## Synthetic job mixes")
    assert "model-algorithm" in text and "`python benchmarks/random_mixes.py --synthetic --mixes 1 --seed 3`" in text
    text = rm.section({"seed": 0, "steps": None, "synthetic": True, "mixes": {"s3": spec}, "runs": runs}, "-", "-")
    assert "`python benchmarks/random_mixes.py --synthetic --mixes 1`" in text  # the default seed: not named
    assert "RollMux against verl-sync: ahead on 1 of 1 mixes, median makespan ratio 0.93." in text


def test_a_large_mix_runs_three_synthetic_mixes_pipelines_on_one_pool_of_whole_nodes():
    drawn = rm.large_mixes(9000, 3)
    assert drawn == rm.large_mixes(9000, 3) and [name for name, _ in drawn] == ["L9000", "L9003", "L9006"]
    for (name, spec), first in zip(drawn, (9000, 9003, 9006)):
        parts = [s for _, s in rm.synthetic_mixes(first, rm.LARGE_PARTS)]
        wl = parse_workload(spec)
        assert [p.name for p in wl.pipelines] == [f"m{k}-{p['name']}" for k, part in enumerate(parts)
                                                  for p in part["pipelines"]]
        assert spec["cluster"]["gpu"] == parts[0]["cluster"]["gpu"]
        assert wl.cluster.gpus_per_node == parts[0]["cluster"]["gpus_per_node"]
        assert wl.cluster.gpus % wl.cluster.gpus_per_node == 0 and wl.cluster.gpus == sum(p.gpus for p in wl.pipelines)
        assert wl.cluster.gpus >= sum(s["cluster"]["gpus"] for s in parts)  # each share as drawn, or grown
    assert sum(len(spec["pipelines"]) for _, spec in drawn) > 3 * 5  # more than a synthetic mix can hold


def test_the_large_block_names_its_mixes_sizes_and_command():
    spec = rm.large_mixes(9000, 1)[0][1]
    runs = [{"mix": "L9000", "policy": p, "makespan_s": m} for p, m in
            (("verl-sync", 150.0), ("rollmux", 140.0), ("one-step-off", 120.0), ("streamrl", 120.0), ("areal", 130.0))]
    runs.append({"mix": "L9000", "policy": "jigsaw", "makespan_s": 100.0, "effective_utilisation": 0.5,
                 "bounds": {"makespan_lower_bound_s": 80.0}})
    data = {"seed": 9000, "steps": None, "synthetic": True, "large": True, "mixes": {"L9000": spec}, "runs": runs}
    text = rm.section(data, "-", "-")
    assert text.startswith("## Large job mixes")
    assert f"here {len(spec['pipelines'])} pipelines on {spec['cluster']['gpus']} GPUs" in text
    assert "random_mixes.py --large --mixes 1" in text and "| 1.40x |" in text


def test_the_large_block_reports_what_the_scale_costs_the_scheduler():
    spec = rm.large_mixes(9000, 1)[0][1]
    runs = [{"mix": "L9000", "policy": p, "makespan_s": m, "wall_s": 3.0} for p, m in
            (("verl-sync", 150.0), ("rollmux", 140.0), ("one-step-off", 120.0), ("streamrl", 120.0), ("areal", 130.0))]
    runs.append({"mix": "L9000", "policy": "jigsaw", "makespan_s": 100.0, "effective_utilisation": 0.5,
                 "bounds": {"makespan_lower_bound_s": 80.0}, "decisions": 12345, "decision_p50_us": 1500.0,
                 "decision_p99_us": 22000.0, "wall_s": 250.0})
    data = {"seed": 9000, "steps": None, "synthetic": True, "large": True, "mixes": {"L9000": spec}, "runs": runs}
    assert "| L9000 | 176 | 11 | 12,345 | 1,500 / 22,000 | 250 / 3 |" in rm.section(data, "-", "-")
    data["large"] = False  # the synthetic block has no such table
    assert "12,345" not in rm.section(data, "-", "-")


def test_jigsaw_only_refuses_saved_results_of_other_mixes_and_says_what_it_kept(tmp_path):
    import json

    import pytest

    spec = rm.synthetic_mixes(3, 1)[0][1]
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps({"seed": 4, "steps": None, "synthetic": True, "mixes": {"s3": spec}, "runs": []}))
    with pytest.raises(SystemExit, match="not those of seed 3, 1 mixes; run without --jigsaw-only"):
        rm.measure_jigsaw_only(saved, 3, 1, synthetic=True)
    runs = [{"mix": "s3", "policy": "jigsaw", "makespan_s": 100.0, "effective_utilisation": 0.5,
             "bounds": {"makespan_lower_bound_s": 80.0}}]
    runs += [{"mix": "s3", "policy": p, "makespan_s": 150.0} for p in rm.POLICIES[1:]]
    data = {"seed": 3, "steps": None, "synthetic": True, "mixes": {"s3": spec}, "runs": runs, "jigsaw_only": True,
            "wall_s": 120.0}
    text = rm.section(data, "-", "-")
    assert ("`python benchmarks/random_mixes.py --synthetic --mixes 1 --seed 3 --jigsaw-only` (2 minutes on 2 cores;"
            " jigsaw's runs only, the baselines' saved from the run before)") in text


def test_synthetic_mixes_laid_out_on_classes_parse_and_name_their_pools():
    # --classes: each mix's pool as 1-3 device classes (odd_workloads.with_classes, the mix's
    # own seed); only those that parse are kept, and the printed block names the classes
    drawn = rm._drawn(10, 10, True, False, classes=True)
    assert drawn == rm._drawn(10, 10, True, False, classes=True) and 0 < len(drawn) <= 10
    plain = dict(rm.synthetic_mixes(10, 10))
    for name, spec in drawn:
        parse_workload(spec, base_dir=rm.EXAMPLES)
        assert spec["pipelines"] == plain[name]["pipelines"]
        assert sum(c["count"] for c in spec["cluster"]["classes"]) == plain[name]["cluster"]["gpus"]
    name, spec = next((n, s) for n, s in drawn if len(s["cluster"]["classes"]) > 1)
    runs = [{"mix": name, "policy": "jigsaw", "makespan_s": 100.0, "effective_utilisation": 0.5,
             "bounds": {"makespan_lower_bound_s": 80.0}},
            {"mix": name, "policy": "verl-sync", "makespan_s": 150.0},
            {"mix": name, "policy": "rollmux", "makespan_s": 140.0},
            {"mix": name, "policy": "one-step-off", "error": "pipelines[0].gpus: too small"},
            {"mix": name, "policy": "streamrl", "makespan_s": 120.0},
            {"mix": name, "policy": "areal", "makespan_s": 130.0}]
    text = rm.section({"seed": 10, "steps": None, "synthetic": True, "classes": True, "mixes": {name: spec},
                       "runs": runs}, "-", "-")
    assert f"| {rm._pool(spec)} |" in text and " + " in rm._pool(spec)
    assert "--synthetic --classes --mixes 1 --seed 10" in text and "device classes" in text
    # a mix jigsaw refused is left out of the table, not a crash
    refused = [{**r, "mix": "other"} for r in runs]
    refused[0] = {"mix": "other", "policy": "jigsaw", "error": "pipelines[1].gpus: too small"}
    text = rm.section({"seed": 10, "steps": None, "synthetic": True, "classes": True,
                       "mixes": {name: spec, "other": spec}, "runs": runs + refused}, "-", "-")
    assert "| other |" not in text and f"| {name} |" in text
