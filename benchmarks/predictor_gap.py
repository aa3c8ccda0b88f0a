"""jigsaw with the default length predictor against the oracle ablation, per workload.

    python benchmarks/predictor_gap.py      # writes benchmarks/results/predictor_gap.json

The policy sees predicted remaining lengths (``jigsaw_predict_remaining``, the built-in
history predictor); the oracle predictor reads true lengths and exists only as this
labelled ablation. Also reports the predictor's accuracy at the policy's decision points.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, dump, load, md_table  # noqa: E402

from jigsaw_plugin.scheduler import get_policy  # noqa: E402
from jigsaw_plugin.sim import Simulation  # noqa: E402

WORKLOADS = [("(a)", "a_sync4_32gpu.yaml"), ("(b)", "b_sync8_64gpu.yaml"), ("(c)", "c_async2_16gpu.yaml"),
             ("(d)", "d_hetero_32gpu.yaml"), ("demo", "demo.yaml")]
OUT = ROOT / "benchmarks" / "results" / "predictor_gap.json"


def _one(job):
    name, policy, predictor = job
    t0 = time.perf_counter()
    r = Simulation(load(name), get_policy(policy), 0, predictor=predictor).run()
    r["wall_s"] = time.perf_counter() - t0
    return r


def run(workers: int = 2) -> tuple[str, list]:
    from concurrent.futures import ProcessPoolExecutor

    jobs = [(f, pol, pred) for _, f in WORKLOADS for pol, pred in
            (("verl-sync", "history"), ("jigsaw", "history"), ("jigsaw", "oracle"))]
    with ProcessPoolExecutor(max_workers=workers, max_tasks_per_child=1) as ex:
        results = list(ex.map(_one, jobs))
    rows, data = [], []
    for i, (label, f) in enumerate(WORKLOADS):
        base, hist, orac = results[3 * i: 3 * i + 3]
        acc = hist["predictor"]
        data.append({"workload": f, "verl-sync": base, "jigsaw": hist, "jigsaw-oracle": orac})
        rows.append([label, f"{base['samples_per_s']:.1f}", f"{hist['samples_per_s']:.1f}",
                     f"{orac['samples_per_s']:.1f}",
                     f"**{hist['samples_per_s'] / base['samples_per_s']:.2f}x**",
                     f"{orac['samples_per_s'] / base['samples_per_s']:.2f}x",
                     f"{hist['samples_per_s'] / orac['samples_per_s'] - 1:+.0%}",
                     _fmt(acc.get("remaining_tokens_rel_error"), ".2f"), _fmt(acc.get("rank_corr"), ".2f"),
                     _fmt(acc.get("remaining_s_mae"), ".1f"), acc.get("notes"),
                     f"{hist['scheduler']['decision_p99_us'] / 1000:.1f}", f"{hist['wall_s']:.0f}"])
    table = md_table(["workload", "verl-sync samples/s", "jigsaw (predictor) samples/s",
                      "jigsaw (ORACLE ablation) samples/s", "jigsaw / verl-sync", "oracle / verl-sync",
                      "predictor vs oracle", "remaining-tokens rel. error", "rank corr.", "remaining-s MAE",
                      "scored predictions", "decision p99 ms", "sim wall s"], rows)
    dump(data, OUT)
    return table, data


if __name__ == "__main__":
    print(run()[0])
