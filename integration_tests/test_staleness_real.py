"""Bounded staleness on real engines: ``jigsaw bench --backend ray`` runs two asynchronous
reference GRPO pipelines (staleness 1 and 2) on vLLM engines and torch trainers, and the
bench JSON reports every trained sample's policy-version lag as a histogram per pipeline,
never above the pipeline's bound.

Needs ``.venv-cpu`` (``make integration``); starts four vLLM engines (two pipelines x two
devices) on the 2-core machine, so run it under the shared real-run lock:
``flock /tmp/jigsaw-real.lock .venv-cpu/bin/python -m pytest -x -q -s integration_tests/test_staleness_real.py``
(about 3.5 minutes at load average 15; ``-s`` prints the histograms).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here: `make venv-cpu` builds .venv-cpu")
yaml = pytest.importorskip("yaml")

pytestmark = pytest.mark.ray_cluster  # its own Ray cluster and engines: after the shared-engine tests

BOUNDS = {"s1": 1, "s2": 2}
STEPS, PROMPTS, SAMPLES = 4, 4, 4


def _workload() -> dict:
    def pipeline(name: str, staleness: int) -> dict:
        return {"name": name, "model": "tiny-qwen2", "algorithm": "grpo", "mode": "async", "staleness": staleness,
                "prompts_per_step": PROMPTS, "samples_per_prompt": SAMPLES, "max_response_len": 256,
                "prompt_len": {"dist": "const", "value": 16},
                # a long tail: the next step's rollout has something to overlap
                "response_len": {"dist": "quantiles", "q": [0, 0.5, 0.9, 1], "values": [8, 40, 120, 256]},
                "reward": {"kind": "rule", "latency_s": {"dist": "const", "value": 0.0}}, "steps": STEPS}

    return {"version": 1, "cluster": {"gpus": 2, "gpu": "cpu", "gpus_per_node": 2},
            "pipelines": [pipeline(name, bound) for name, bound in BOUNDS.items()]}


def test_async_pipelines_on_real_engines_report_per_sample_lag_within_the_bound(tmp_path):
    path = tmp_path / "staleness.yaml"
    path.write_text(yaml.safe_dump(_workload()))
    out = tmp_path / "bench.json"
    jigsaw = Path(sys.executable).with_name("jigsaw")
    proc = subprocess.run([str(jigsaw), "bench", str(path), "--backend", "ray", "--baseline", "verl-sync",
                           "--candidate", "jigsaw", "--repeats", "1", "--json", str(out), "-q"],
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    bench = json.loads(out.read_text())
    lagged = {}
    for side in ("baseline", "candidate"):
        r = bench[side]
        assert r["backend"] == "ray"
        assert r["measured"]["trainer_versions"] == {name: STEPS for name in BOUNDS}  # real updates ran
        for name, bound in BOUNDS.items():
            p = r["pipelines"][name]
            hist = {int(lag): n for lag, n in p["staleness_histogram"].items()}
            assert p["staleness_unit"] == "sample"  # one count per trained sample
            assert sum(hist.values()) == p["samples"] == STEPS * PROMPTS * SAMPLES
            assert max(hist) == p["max_staleness"] <= bound, (side, name, hist)
            lagged[side, name] = sum(n for lag, n in hist.items() if lag > 0)
    # the numbers behind the check (``pytest -s`` shows them)
    print("staleness histograms (version lag: samples):", json.dumps(
        {side: {name: bench[side]["pipelines"][name]["staleness_histogram"] for name in BOUNDS}
         for side in ("baseline", "candidate")}),
        "samples/s:", {side: round(bench[side]["samples_per_s"], 3) for side in ("baseline", "candidate")})
    # verl-sync trains on-policy; jigsaw uses the bound (the next rollout overlaps training)
    assert all(lagged["baseline", name] == 0 for name in BOUNDS), lagged
    assert sum(lagged["candidate", name] for name in BOUNDS) > 0, lagged
