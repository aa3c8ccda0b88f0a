"""Simulator speed: the issue's reference workload and how cost grows with GPUs and samples.

Reference: 64 GPUs, 4 pipelines, 10 steps, 512 x 16 samples per step per pipeline (DAPO
math lengths), under verl-sync and jigsaw. Each run is a fresh process on one core; wall
time and peak resident memory (ru_maxrss) are measured. Target: < 30 s, < 2 GiB.
"""

from __future__ import annotations

import copy

from common import load, md_table, run_many

import yaml
from common import EXAMPLES


def workload(gpus=64, pipelines=4, prompts=512, samples=16, steps=10) -> dict:
    demo = yaml.safe_load((EXAMPLES / "demo.yaml").read_text())
    base = demo["pipelines"][0]
    pipes = []
    for i in range(pipelines):
        p = copy.deepcopy(base)
        p.update(name=f"dapo-{i}", prompts_per_step=prompts, samples_per_prompt=samples, steps=steps)
        pipes.append(p)
    return {"version": 1, "cluster": {"gpus": gpus, "gpu": "h100", "gpus_per_node": 8}, "pipelines": pipes}


def run() -> str:
    cases = [("reference", workload())]
    cases += [(f"{g} GPUs", workload(gpus=g)) for g in (16, 32, 128)]
    cases += [(f"{s} samples/prompt", workload(samples=s)) for s in (4, 8)]
    jobs = [(w, pol, None, 0) for _, w in cases for pol in ("verl-sync", "jigsaw")]
    results = run_many(jobs)
    rows = []
    for i, (label, w) in enumerate(cases):
        for j, pol in enumerate(("verl-sync", "jigsaw")):
            r = results[2 * i + j]
            n = sum(p["prompts_per_step"] * p["samples_per_prompt"] * p["steps"] for p in w["pipelines"])
            rows.append([label, w["cluster"]["gpus"], n, pol, f"{r['wall_s']:.1f}", f"{r['peak_rss_mib']:.0f}",
                         f"{r['sim']['events']:,}", f"{1e6 * r['wall_s'] / n:.0f}"])
    return md_table(["case", "GPUs", "requests", "policy", "wall s", "peak RSS MiB", "events", "us/request"], rows)


if __name__ == "__main__":
    print(run())
