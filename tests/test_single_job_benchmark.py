"""benchmarks/single_job.py: one job alone on its own nodes, jigsaw against verl-sync."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import single_job  # noqa: E402

from jigsaw_plugin.workload import parse_workload  # noqa: E402

HETERO = yaml.safe_load((ROOT / "examples" / "workloads" / "d_hetero_32gpu.yaml").read_text())


def test_a_pipeline_alone_keeps_its_spec_on_a_pool_of_its_share():
    shares = single_job._shares(HETERO)
    assert shares == {"dapo-1.5b": 8, "agent-7b": 8, "dapo-32b": 16}
    one = single_job.alone_on_share(HETERO, "dapo-32b", 16)
    assert one["cluster"]["gpus"] == 16 and one["cluster"]["gpus_per_node"] == 8
    (p,) = one["pipelines"]
    assert "gpus" not in p and {k: v for k, v in p.items()} == {
        k: v for k, v in HETERO["pipelines"][2].items() if k != "gpus"}
    parse_workload(one, base_dir=ROOT / "examples" / "workloads")  # a valid workload
    small = single_job.alone_on_share(HETERO, "agent-7b", 4)
    assert small["cluster"]["gpus_per_node"] == 4  # no node larger than the pool
    assert len(HETERO["pipelines"]) == 3  # the workload itself is left alone


def test_a_pipeline_without_a_share_gets_an_equal_split():
    sync4 = yaml.safe_load((ROOT / "examples" / "workloads" / "a_sync4_32gpu.yaml").read_text())
    assert set(single_job._shares(sync4).values()) == {8}


def _run(part, label, policy, makespan, bound=100.0):
    return {"part": part, "label": label, "policy": policy, "makespan_s": makespan, "bound_s": bound}


def test_the_block_sets_jigsaw_beside_the_fastest_verl_sync_and_lists_each_held_out_loss():
    runs = [_run("bundled", "(x) p on 8", "verl-sync", 300.0), _run("bundled", "(x) p on 8", "verl-sync tp4", 240.0),
            _run("bundled", "(x) p on 8", "jigsaw", 250.0),
            _run("held-out", "s1 q on 4 H100", "verl-sync", 200.0), _run("held-out", "s1 q on 4 H100", "jigsaw", 220.0),
            _run("held-out", "s2 r on 4 H100", "verl-sync", 200.0), _run("held-out", "s2 r on 4 H100", "areal", 150.0),
            _run("held-out", "s2 r on 4 H100", "jigsaw", 120.0),
            {"part": "held-out", "label": "s3 big on 2 H100", "policy": "jigsaw", "error": "refused"},
            {"part": "held-out", "label": "s3 big on 2 H100", "policy": "verl-sync", "error": "refused"}]
    text = single_job.render({"seed": 1, "mixes": 3, "runs": runs})
    row = next(line for line in text.splitlines() if line.startswith("| (x) p on 8"))
    # against verl-sync 1.20x, against its fastest width (tp4) 0.96x; gap (300 - 250) / (300 - 100)
    assert "240.0 (verl-sync tp4)" in row and "1.20x" in row and "0.96x" in row and "25%" in row
    assert "2 ran, 1 refused" in text
    assert "| s1 q on 4 H100 | 200.0 (verl-sync) | 220.0 | 0.909x |" in text
    assert "s2 r on 4 H100 |" not in text  # jigsaw ahead of areal there: not a loss
