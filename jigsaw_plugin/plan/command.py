"""The ``jigsaw plan`` command: load a workload, apply the rule, print (and save) its answer."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["run_plan", "format_provision"]


def format_provision(prov) -> str:
    i = prov.inputs
    lines = [
        f"pipeline {i.pipeline}: staleness bound {i.staleness}, {i.samples_per_step} samples per step",
        f"trainer: {i.trainer_gpus} x {i.trainer_class} at {i.trainer_price_per_hour:g}/device-hour",
        "the rule's inputs (cost model):",
        f"  training time per step T_train   {i.train_s:10.2f} s",
        f"  dissemination latency T_dis      {i.dissemination_s:10.2f} s (weight sync in the trainer's data centre)",
        f"  longest response of a step       {i.tail_tokens:10.0f} tokens",
        f"  {'class':<14}{'gpu':<8}{'avail':>6}{'tp':>4}{'samples/s/dev':>15}{'price/h':>9}"
        f"{'samples/price':>15}{'pull_s':>9}",
    ]
    for c in i.classes:
        lines.append(f"  {c.name:<14}{c.gpu:<8}{c.available:>6}{c.tp:>4}{c.samples_per_s_per_device:>15.3f}"
                     f"{c.price_per_hour:>9.2f}{c.samples_per_cost:>15.1f}{c.pull_s:>9.2f}")
    pool = ", ".join(f"{v} x {k}" for k, v in prov.rollout.items()) or "none"
    lines += [
        f"provision: {pool} rollout device(s): R = {prov.rollout_samples_per_s:.2f} samples/s "
        f"(N / T_train = {i.samples_per_step / i.train_s:.2f}), T_gen = {prov.gen_s:.1f} s, "
        f"T_dis = {prov.dissemination_s:.2f} s",
        f"predicted step time {prov.step_s:.2f} s (bounded by the {prov.limit}), learner utilisation "
        f"{prov.learner_utilisation:.0%}, cost per step {prov.cost_per_step:.4f}, "
        f"per sample {prov.cost_per_sample:.3g}",
    ]
    if not prov.sustains_full_utilisation:
        why = ("the step's longest response outlasts staleness x T_train: a larger staleness bound lets "
               "generation run further ahead" if prov.limit == "tail"
               else "more rollout devices cost more per sample than the idle learner does")
        lines.append(f"note: this pool does not keep the learner fully busy ({why})")
    return "\n".join(lines)


def run_plan(workload_path: str, pipeline: str | None = None, trainer_gpus: int | None = None,
             json_path: str | None = None, trainer_class: str | None = None) -> str:
    from jigsaw_plugin.plan.capacity import plan_pipeline
    from jigsaw_plugin.workload import load_workload

    prov = plan_pipeline(load_workload(workload_path), pipeline, trainer_gpus, trainer_class)
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(prov.as_dict(), indent=2))
    return format_provision(prov)
