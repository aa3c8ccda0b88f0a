"""Scheduler decision latency of the jigsaw policy as the pool and pipeline count grow.

Each row is a simulated run; the engine times every ``decide`` call (the policy alone, no
I/O). Targets: p99 < 1 ms at 64 GPUs / 8 pipelines, < 10 ms at 1024 GPUs / 32 pipelines.
"""

from __future__ import annotations

import copy

import yaml
from common import EXAMPLES, md_table, run_many


def workload(gpus: int, pipelines: int, prompts: int, steps: int = 2) -> dict:
    demo = yaml.safe_load((EXAMPLES / "demo.yaml").read_text())
    pipes = []
    for i in range(pipelines):
        p = copy.deepcopy(demo["pipelines"][i % 2])
        p.update(name=f"{p['name']}-{i}", prompts_per_step=prompts, samples_per_prompt=8, steps=steps)
        pipes.append(p)
    return {"version": 1, "cluster": {"gpus": gpus, "gpu": "h100", "gpus_per_node": 8}, "pipelines": pipes}


CASES = [(64, 8, 512), (256, 16, 256), (1024, 32, 256)]


def run() -> tuple[str, dict]:
    results = run_many([(workload(g, n, pr), "jigsaw", None, 0) for g, n, pr in CASES])
    rows, summary = [], {}
    for (g, n, pr), r in zip(CASES, results):
        s = r["scheduler"]
        summary[(g, n)] = s["decision_p99_us"]
        rows.append([g, n, pr * 8 * n, s["decisions"], f"{s['decision_p50_us']:.0f}", f"{s['decision_p99_us']:.0f}",
                     f"{r['wall_s']:.1f}"])
    return md_table(["GPUs", "pipelines", "requests/step", "decisions", "p50 us", "p99 us", "sim wall s"], rows), summary


if __name__ == "__main__":
    print(run()[0])
