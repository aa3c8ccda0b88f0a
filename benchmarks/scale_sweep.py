"""verl-sync from 16 to 128 GPUs on one workload, and 7B decode per token on one H100.

1. The calibration workload (examples/workloads/calibration_dapo7b_h20.yaml: Qwen2.5-Math-7B
   DAPO, 512 x 16 samples, 20,480 max response, H20) under verl-sync on 16, 32, 64 and 128
   GPUs: the mean gen stage, the share of it after 90% of the step's samples had finished
   (the tail), and the training stages.
2. One decode step of Qwen2.5-7B on one H100 (tp 1) at batch 1, 64 and saturation (the
   largest batch the KV cache holds, capped by max_num_seqs), next to the public figures
   of docs/calibration.md (Llama-3.1-8B, the nearest public model; its own prediction is
   printed beside them).

    python benchmarks/scale_sweep.py [--gpus 16,32,64,128] [--steps 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jigsaw_plugin.costmodel import CostModel, hardware_profile, model_profile  # noqa: E402
from jigsaw_plugin.costmodel.public_points import LLAMA31_8B  # noqa: E402
from jigsaw_plugin.scheduler import get_policy  # noqa: E402
from jigsaw_plugin.sim import Simulation  # noqa: E402
from jigsaw_plugin.workload import parse_workload  # noqa: E402

WORKLOAD = ROOT / "examples" / "workloads" / "calibration_dapo7b_h20.yaml"
TAIL_QUANTILE = 0.9  # the tail: what is left of gen after this share of the samples finished


class _GenTimes:
    """Hook sink: gen start and each sample's finish time, per step (other hooks ignored)."""

    def __init__(self):
        self.start: dict[int, float] = {}
        self.finished: dict[int, list] = {}

    def jigsaw_stage_start(self, pipeline, step, stage, devices, samples, tokens, t):
        if stage == "gen":
            self.start[step] = t

    def jigsaw_request_finished(self, pipeline, step, request_id, turn, replica, generated_tokens, t):
        self.finished.setdefault(step, []).append(t)

    def __getattr__(self, name):
        if name.startswith("jigsaw_"):
            return lambda **kw: None
        raise AttributeError(name)


def sweep_row(gpus: int, steps: int, seed: int = 0) -> dict:
    spec = yaml.safe_load(WORKLOAD.read_text())
    spec["cluster"]["gpus"] = gpus
    spec["pipelines"][0]["steps"] = steps
    times = _GenTimes()
    r = Simulation(parse_workload(spec), get_policy("verl-sync"), seed, hooks=times, record_requests=True).run()
    gens, tails = [], []
    for step, done in times.finished.items():
        done = sorted(done)
        end, start = done[-1], times.start[step]
        knee = done[int(TAIL_QUANTILE * (len(done) - 1))]
        gens.append(end - start)
        tails.append((end - knee) / (end - start))
    st = r["pipelines"]["dapo-math-7b"]["stage_s"]
    return {"gpus": gpus, "gen": statistics.mean(gens), "tail": statistics.mean(tails),
            "old_log_prob": st["old_log_prob"], "update_actor": st["update_actor"],
            "step": r["pipelines"]["dapo-math-7b"]["mean_step_s"], "samples_per_s": r["samples_per_s"]}


def sweep_table(gpu_counts: list[int], steps: int) -> str:
    rows = ["| GPUs | gen (s) | tail share of gen (after 90% of samples) | old_log_prob (s) | update_actor (s) "
            "| step (s) | samples/s |", "|---|---|---|---|---|---|---|"]
    for g in gpu_counts:
        x = sweep_row(g, steps)
        rows.append(f"| {g} | {x['gen']:.1f} | {100 * x['tail']:.0f}% | {x['old_log_prob']:.1f} | "
                    f"{x['update_actor']:.1f} | {x['step']:.1f} | {x['samples_per_s']:.2f} |")
    return "\n".join(rows)


def decode_table(context: int = 1000) -> str:
    cost = CostModel(hardware_profile("h100"))
    qwen = model_profile("qwen2.5-7b")
    saturated = min(cost.f.max_num_seqs, cost.kv_capacity_tokens(qwen, 1) // context)
    rows = [f"| batch (context {context} each) | Qwen2.5-7B step (ms) | Qwen2.5-7B tok/s | Llama-3.1-8B step (ms) "
            "| Llama-3.1-8B tok/s | public figure (Llama-3.1-8B, vLLM, H100) |", "|---|---|---|---|---|---|"]
    public = {1: "6.48 ms/token (InferenceBench, conc=1)",
              64: "no clean figure (InferenceBench conc=64 TPOT 46.9 ms includes interleaved prefills)",
              saturated: "about 12,500 tok/s (morphllm table; ShareGPT-style, with prefills)"}
    for b in (1, 64, saturated):
        q = cost.decode_step_s(qwen, 1, b, b * context)
        ll = cost.decode_step_s(LLAMA31_8B, 1, b, b * context)
        label = f"{b} (saturated: KV cache full)" if b == saturated else str(b)
        rows.append(f"| {label} | {1e3 * q:.2f} | {b / q:,.0f} | {1e3 * ll:.2f} | {b / ll:,.0f} | {public[b]} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", default="16,32,64,128")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    print(decode_table())
    print()
    print(sweep_table([int(g) for g in args.gpus.split(",")], args.steps))


if __name__ == "__main__":
    main()
