"""Measure micro-batched training stages of the reference trainer on this machine.

    .venv-cpu/bin/python -m jigsaw_plugin.runtime.reference.bench_microbatch [--repeats 5] [--json out.json]

For the tiny Qwen2 and 32 samples (8 prompts x 4) of 16 prompt + 64 response tokens
(docs/reference_pipeline.md), with 4 mini-batches:

- per micro-batch size (None = one pass per mini-batch / stage, 8, 4, 2): the whole-stage
  calls (``old_log_prob``, ``update_actor``: micro-batches one after another, the runner
  without a grant) and the runner with a grant of width 1 and 2; the median stage wall
  time and the median wall time of one micro-batch (records), over ``repeats`` steps;
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


def _runner_stages(trainer, batch, grant, repeats: int) -> dict:
    from jigsaw_plugin.runtime.reference import ReferenceStageRunner

    runner = ReferenceStageRunner(trainer, grant=grant)

    async def main():
        for k in range(repeats):
            for stage in ("old_log_prob", "ref", "adv", "update_actor"):
                await runner.run("p", k, stage, (0,), batch if stage == "old_log_prob" else None)

    try:
        asyncio.run(main())
    finally:
        runner.close()
    out = {}
    for stage in ("old_log_prob", "update_actor"):
        recs = [r for r in runner.records if r.stage == stage]
        out[stage] = {"stage_s": _median([r.wall_s for r in recs]),
                      "micro_batch_s": _median([m.wall_s for r in recs for m in r.micro_batches]),
                      "micro_batches": len(recs[0].micro_batches)}
    return out


def _whole_stages(trainer, batch, repeats: int) -> dict:
    from jigsaw_plugin.runtime.reference import grpo_advantages, low_id_reward

    adv = grpo_advantages(low_id_reward().batch(batch), [s[2] for s in batch])
    old_s, upd_s = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        old = trainer.old_log_prob(batch)
        old_s.append(time.perf_counter() - t0)
        ref = trainer.ref_log_prob(batch)
        t0 = time.perf_counter()
        trainer.update_actor(batch, old, adv, ref)
        upd_s.append(time.perf_counter() - t0)
    return {"old_log_prob": {"stage_s": _median(old_s)}, "update_actor": {"stage_s": _median(upd_s)}}


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
    from jigsaw_plugin.runtime.reference import ReferenceTrainer

    batch = _batch()
    rows = []
    for size in micro_sizes:
        row = {"micro_batch_size": size,
               "whole_stage": _whole_stages(ReferenceTrainer(model_dir, seed=0, micro_batch_size=size), batch,
                                            repeats)}
        for width in (1, 2):
            devices = tuple(range(width))
            row[f"width_{width}"] = _runner_stages(ReferenceTrainer(model_dir, seed=0, micro_batch_size=size),
                                                   batch, lambda request, d=devices: d, repeats)
        rows.append(row)
    return {"batch": "32 samples (8 prompts x 4), 16 prompt + 64 response tokens, 4 mini-batches",
            "repeats": repeats, "rows": rows,
            "threads_change_micro_batch_gradient": _threads_change_the_gradient(model_dir, batch)}


def _table(result: dict) -> str:
    lines = ["micro | stage        | whole call | width 1 stage (per micro) | width 2 stage (per micro) | micro-batches"]
    for row in result["rows"]:
        for stage in ("old_log_prob", "update_actor"):
            w1, w2 = row["width_1"][stage], row["width_2"][stage]
            lines.append(f"{str(row['micro_batch_size']):>5} | {stage:<12} | {row['whole_stage'][stage]['stage_s']:.3f} s"
                         f"    | {w1['stage_s']:.3f} s ({w1['micro_batch_s'] * 1e3:.1f} ms)"
                         f"       | {w2['stage_s']:.3f} s ({w2['micro_batch_s'] * 1e3:.1f} ms)"
                         f"       | {w1['micro_batches']}")
    lines.append(f"1 vs 2 torch threads change a micro-batch gradient: {result['threads_change_micro_batch_gradient']}")
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
