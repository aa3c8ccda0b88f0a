"""Measure micro-batched training stages of the reference trainer on this machine.

    .venv-cpu/bin/python -m jigsaw_plugin.runtime.reference.bench_microbatch [--repeats 5] [--json out.json]

For the tiny Qwen2 and 32 samples (8 prompts x 4) of 16 prompt + 64 response tokens
(docs/reference_pipeline.md), with 4 mini-batches:

- per micro-batch size (None = one pass per mini-batch / stage, 8, 4, 2): the whole-stage
  calls (``old_log_prob``, ``update_actor``: micro-batches one after another, the runner
  without a grant) and the runner with a grant of width 1 and 2; the median stage wall
  time and the median wall time of one micro-batch (records), over ``repeats`` steps,
  every configuration one step per round so that all see the same background load; and
  the process CPU seconds of each stage (less sensitive to the load than wall time);
- whether the gradient of one micro-batch depends on torch's intra-op thread count (1 vs
  2 threads), bitwise.

Medians, because the 2-core machine is shared and noisy. Needs torch + transformers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

__all__ = ["main", "measure"]


def _batch(seed: int = 0, prompts: int = 8, samples: int = 4, prompt_len: int = 16, response_len: int = 64):
    from jigsaw_plugin.runtime.tiny_model import TINY_QWEN2

    rng = np.random.default_rng(seed)
    vocab = TINY_QWEN2["vocab_size"]
    out = []
    for g in range(prompts):
        prompt = [int(t) for t in rng.integers(0, vocab, prompt_len)]
        out += [(prompt, [int(t) for t in rng.integers(0, vocab, response_len)], g) for _ in range(samples)]
    return out


def _median(xs) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


class _RunnerConfig:
    """A trainer behind a runner with a constant grant of ``width`` devices."""

    def __init__(self, trainer, batch, width: int):
        from jigsaw_plugin.runtime.reference import ReferenceStageRunner

        devices = tuple(range(width))
        self.runner = ReferenceStageRunner(trainer, grant=lambda request: devices)
        self.batch, self.steps = batch, 0
        self.cpu: dict[str, list] = {"old_log_prob": [], "update_actor": []}

    def step(self) -> None:
        async def main():
            for stage in ("old_log_prob", "ref", "adv", "update_actor"):
                cpu = time.process_time()
                await self.runner.run("p", self.steps, stage, (0,), self.batch if stage == "old_log_prob" else None)
                if stage in self.cpu:
                    self.cpu[stage].append(time.process_time() - cpu)

        asyncio.run(main())
        self.steps += 1

    def result(self) -> dict:
        self.runner.close()
        out = {}
        for stage in ("old_log_prob", "update_actor"):
            recs = [r for r in self.runner.records if r.stage == stage]
            out[stage] = {"stage_s": _median([r.wall_s for r in recs]),
                          "micro_batch_s": _median([m.wall_s for r in recs for m in r.micro_batches]),
                          "micro_batches": len(recs[0].micro_batches), "cpu_s": _median(self.cpu[stage])}
        return out


class _WholeConfig:
    """The trainer's whole-stage calls (no grant): micro-batches one after another."""

    def __init__(self, trainer, batch):
        from jigsaw_plugin.runtime.reference import grpo_advantages, low_id_reward

        self.trainer, self.batch = trainer, batch
        self.adv = grpo_advantages(low_id_reward().batch(batch), [s[2] for s in batch])
        self.times: dict[str, list] = {"old_log_prob": [], "update_actor": []}
        self.cpu: dict[str, list] = {"old_log_prob": [], "update_actor": []}

    def _timed(self, stage: str, fn, *args):
        t0, cpu = time.perf_counter(), time.process_time()
        out = fn(*args)
        self.times[stage].append(time.perf_counter() - t0)
        self.cpu[stage].append(time.process_time() - cpu)
        return out

    def step(self) -> None:
        old = self._timed("old_log_prob", self.trainer.old_log_prob, self.batch)
        ref = self.trainer.ref_log_prob(self.batch)
        self._timed("update_actor", self.trainer.update_actor, self.batch, old, self.adv, ref)

    def result(self) -> dict:
        return {k: {"stage_s": _median(v), "cpu_s": _median(self.cpu[k])} for k, v in self.times.items()}


def _threads_change_the_gradient(model_dir, batch) -> bool:
    """Does one micro-batch's gradient differ (bitwise) between 1 and 2 torch threads?"""
    import torch

    from jigsaw_plugin.runtime.reference import ReferenceTrainer

    trainer = ReferenceTrainer(model_dir, seed=0, micro_batch_size=4)
    mb = batch[:4]
    old = trainer.old_log_prob(mb)
    grads = {}
    for n in (1, 2):
        torch.set_num_threads(n)
        trainer.micro_grad(0, mb, old, np.linspace(-1, 1, 4), None, 256, one_thread=False)
        grads[n] = trainer.take_gradient(0)
    torch.set_num_threads(1)
    return not all(torch.equal(a, b) for a, b in zip(grads[1], grads[2]))


def measure(model_dir, repeats: int = 5, micro_sizes=(None, 8, 4, 2)) -> dict:
    """Every configuration one step per round, ``repeats`` rounds (so that all of them see
    the same background load), medians per configuration."""
    import os

    from jigsaw_plugin.runtime.reference import ReferenceTrainer

    batch = _batch()
    configs = {}
    for size in micro_sizes:
        configs[(size, "whole_stage")] = _WholeConfig(ReferenceTrainer(model_dir, seed=0, micro_batch_size=size), batch)
        for width in (1, 2):
            configs[(size, f"width_{width}")] = _RunnerConfig(
                ReferenceTrainer(model_dir, seed=0, micro_batch_size=size), batch, width)
    load = [os.getloadavg()[0]]
    for _ in range(repeats):
        for config in configs.values():
            config.step()
        load.append(os.getloadavg()[0])
    rows = []
    for size in micro_sizes:
        rows.append(dict({"micro_batch_size": size},
                         **{kind: configs[(size, kind)].result() for kind in ("whole_stage", "width_1", "width_2")}))
    return {"batch": "32 samples (8 prompts x 4), 16 prompt + 64 response tokens, 4 mini-batches",
            "repeats": repeats, "rows": rows, "load_average_1min": [round(x, 2) for x in load],
            "threads_change_micro_batch_gradient": _threads_change_the_gradient(model_dir, batch)}


def _table(result: dict) -> str:
    lines = ["wall s (cpu s) of the stage; [wall ms of one micro-batch]",
             "micro | stage        | micro-batches | whole call    | width 1                  | width 2"]
    for row in result["rows"]:
        for stage in ("old_log_prob", "update_actor"):
            wh, w1, w2 = row["whole_stage"][stage], row["width_1"][stage], row["width_2"][stage]
            lines.append(f"{str(row['micro_batch_size']):>5} | {stage:<12} | {w1['micro_batches']:>13} "
                         f"| {wh['stage_s']:.3f} ({wh['cpu_s']:.3f}) "
                         f"| {w1['stage_s']:.3f} ({w1['cpu_s']:.3f}) [{w1['micro_batch_s'] * 1e3:.1f}] "
                         f"| {w2['stage_s']:.3f} ({w2['cpu_s']:.3f}) [{w2['micro_batch_s'] * 1e3:.1f}]")
    lines.append(f"1 vs 2 torch threads change a micro-batch gradient: {result['threads_change_micro_batch_gradient']}")
    lines.append(f"load average (1 min) during the rounds: {result['load_average_1min']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="steps per configuration (median)")
    ap.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats: got {args.repeats}; allowed: a positive integer")
    import torch

    from jigsaw_plugin.runtime.tiny_model import build_tiny_qwen2

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_qwen2(Path(tmp) / "tiny-qwen2-seed0", seed=0)
        result = measure(model_dir, repeats=args.repeats)
    print(_table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
