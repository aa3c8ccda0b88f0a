"""One real run under preemptions: the reference GRPO pipeline on pooled vLLM engines and a
trainer actor, with a ``PreemptionDriver`` losing the spot devices (issue 16, item 5).

``run_case(case, pool, model_dir)`` (Ray initialised by the caller, the pool's engines
started with the digest extension: ``make_pool``) builds the workload of ``case``: one
GRPO pipeline on two one-core devices, device 0 of an on-demand class, device 1 of a
``spot`` class preemptible at ``case.rate_per_hour`` per device-hour and replaced after
``case.replace_s`` (device time, both scaled by ``case.time_scale``). It runs the workload
through ``LiveExecutor`` with the recovery pieces of runtime/preemption_recovery.py and
returns a ``PreemptionRunResult``: throughput, every preemption and replacement, what the
replacements pulled, what the migration path kept, the ledger checks (every sample of
every step trained once at its full length) and the staleness of every trained sample.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from jigsaw_plugin.runtime.preemption import PreemptionDriver, preemptible_devices

__all__ = ["PreemptionCase", "PreemptionRunResult", "make_pool", "preemption_workload", "run_case"]

SPOT_DEVICE = 1  # the spot class's one device (device 0 is on demand)


@dataclass(frozen=True, slots=True)
class PreemptionCase:
    """One run: the spot class's rate (per device-hour, device time), the recovery, the
    time scale (device seconds per wall second) and the workload's size."""

    label: str
    rate_per_hour: float = 0.0
    recovery: str = "migrate"
    time_scale: float = 30.0
    replace_s: float = 120.0
    steps: int = 3
    prompts_per_step: int = 4
    samples_per_prompt: int = 4
    response_len: tuple = (96, 256)
    policy: str = "verl-sync"
    seed: int = 0


@dataclass(frozen=True)
class PreemptionRunResult:
    case: PreemptionCase
    wall_s: float  # the executor's run: first step's start to the last step's end
    samples: int  # trained and kept (the checkpoint's ledger)
    samples_per_s: float
    preemptions: tuple  # PreemptionRecord
    replacements: tuple  # ReplacementRecord
    pulls: tuple  # PullCheck per replacement engine
    trainer_restores: tuple  # (pipeline, version)
    stage_reruns: tuple  # StageRerun
    migrated: tuple  # generated tokens each resumed request kept (router "migrated" events)
    restarted: tuple  # tokens each restarted request dropped (router "restarted" events)
    samples_lost: int
    samples_duplicated: int
    wrong_length: int
    staleness_bound: int
    staleness: dict  # staleness -> trained samples
    trainer_version: int
    steps: int
    segments: int  # rollout segments generated (a resumed request has more than one)
    checkpoints: str = ""  # the folder of the trainers' StepCheckpoints (one subfolder per pipeline)
    notes: tuple = field(default_factory=tuple)


def preemption_workload(case: PreemptionCase) -> dict:
    lo, hi = case.response_len
    spot = {"rate_per_hour": float(case.rate_per_hour), "replace_s": float(case.replace_s)}
    return {
        "version": 1,
        "cluster": {"classes": [
            {"name": "ondemand", "gpu": "cpu", "count": 1, "gpus_per_node": 2},
            {"name": "spot", "gpu": "cpu", "count": 1, "gpus_per_node": 2, "preemptible": spot}]},
        "pipelines": [{
            "name": "p0", "model": "tiny-qwen2", "algorithm": "grpo", "mode": "sync",
            "prompts_per_step": case.prompts_per_step, "samples_per_prompt": case.samples_per_prompt,
            "max_response_len": int(hi), "prompt_len": {"dist": "const", "value": 16},
            "response_len": {"dist": "uniform", "low": int(lo), "high": int(hi)},
            "reward": {"kind": "rule", "latency_s": {"dist": "const", "value": 0.0}},
            "steps": case.steps,
        }],
    }


def make_pool():
    """An ``EnginePool`` whose engines record the digests of every weight load."""
    from jigsaw_plugin.runtime.engine_pool import EnginePool
    from jigsaw_plugin.runtime.preemption_weights import EXTENSION

    return EnginePool({"worker_extension_cls": EXTENSION}, pin=True)


def _expected(live) -> dict:
    """(pipeline, step, sample) -> (prompt tokens, full response tokens) of the run."""
    out = {}
    for p in live.order:
        for step, s in p.steps.items():
            smp = s.samples
            for i in range(len(smp.prompt_len)):
                off, turns = int(smp.turn_offset[i]), int(smp.turns[i])
                resp = int(sum(smp.gen_tokens[off:off + turns])) + int(sum(smp.observation_len[off:off + turns - 1]))
                out[(p.name, int(step), i)] = (int(smp.prompt_len[i]), resp)
    return out


async def run_case(case: PreemptionCase, pool, model_dir, preempt=None, workdir=None) -> PreemptionRunResult:
    """Run ``case`` on ``pool`` (started engines are reused; see the module docstring).
    ``preempt(driver, live)``: a coroutine run beside the executor *instead of* the
    driver's seeded times (a test's preemption at a chosen moment: ``driver.preempt_now``)."""
    import ray

    from jigsaw_plugin.runtime.live import LiveExecutor
    from jigsaw_plugin.runtime.preemption_recovery import (
        PreemptibleStageRunner,
        RayPreemptionTarget,
        StalenessLog,
        TrainerKeeper,
        WeightServer,
    )
    from jigsaw_plugin.runtime.reference import ReferenceTrainer
    from jigsaw_plugin.runtime.reference.resume import LedgerStageRunner, load_checkpoint, skip_dead_engines
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.workload import parse_workload

    wl = parse_workload(preemption_workload(case))
    names = [p.name for p in wl.pipelines]
    devices = range(wl.cluster.gpus)
    for name in names:
        await pool.ensure(name, model_dir, devices)
    trainer_cls = ray.remote(ReferenceTrainer).options(num_cpus=0, runtime_env={
        "env_vars": {"OMP_WAIT_POLICY": "PASSIVE"}})  # as ray_bench: no spinning next to the engines
    # a fresh folder: a checkpoint left by an earlier run would be restored (and refused)
    if workdir is not None:
        Path(workdir).mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="jigsaw-preempt-", dir=workdir))
    keeper = TrainerKeeper(lambda name: trainer_cls.remote(str(model_dir), seed=case.seed), names, folder)
    weights = WeightServer(names)
    staleness = StalenessLog()
    events: list[tuple] = []
    try:
        for name in names:  # every engine starts on the trainer's weights, published as version 0
            w0 = await keeper(name).state_dict_bf16.remote()
            await pool.reset(name, w0)
            await weights.publish(name, 0, w0)
        inner = LedgerStageRunner(keeper, pin_devices=True, engines=skip_dead_engines)
        runner = PreemptibleStageRunner(inner, keeper, weights, staleness)
        live = LiveExecutor(
            wl, get_policy(case.policy),
            lambda p, devs: pool.lend(p.name, devs, runner.latest_weights, on_generate=staleness.on_generate),
            case.seed, stage_runner=runner,
            sampling={"greedy": False, "temperature": 1.0, "sampling_seed": case.seed})
        live.router_listeners.append(lambda pipeline, name, **kw: events.append((name, kw)))
        target = RayPreemptionTarget(live, pool, keeper, weights, names)
        driver = PreemptionDriver(preemptible_devices(wl.cluster, case.time_scale), target, case.seed, case.recovery,
                                  done=lambda: all(p.done for p in live.order))
        side = asyncio.ensure_future(preempt(driver, live) if preempt is not None else driver.run())
        t0 = time.perf_counter()
        run = asyncio.ensure_future(live.run())
        try:
            # a preemption or replacement that fails ends the run with its error (not a stalled run)
            await asyncio.wait({run, side}, return_when=asyncio.FIRST_COMPLETED)
            if side.done() and side.exception() is not None:
                run.cancel()
                raise side.exception()
            await run
        finally:
            wall = time.perf_counter() - t0
            driver.stop()
            if not side.done():
                await side  # a replacement under way still joins (the pool stays whole for the next run)
        version = int(await keeper(names[0]).get_version.remote())
        inner.close()
    finally:
        keeper.close()
        weights.close()

    ledger = []
    for name in names:
        ck = load_checkpoint(folder / name)
        ledger += list(ck.ledger) if ck is not None else []
    expected = _expected(live)
    seen = Counter((r.pipeline, r.step, r.index) for r in ledger)
    wrong = sum(1 for r in ledger if expected.get((r.pipeline, r.step, r.index)) != (r.prompt_tokens, r.response_tokens))
    return PreemptionRunResult(
        case=case, wall_s=wall, samples=len(seen), samples_per_s=len(seen) / wall,
        preemptions=tuple(driver.preemptions), replacements=tuple(driver.replacements), pulls=tuple(target.pulls),
        trainer_restores=tuple(keeper.restores), stage_reruns=tuple(runner.reruns),
        migrated=tuple(kw["generated_tokens"] for n, kw in events if n == "migrated"),
        restarted=tuple(kw["dropped_tokens"] for n, kw in events if n == "restarted"),
        samples_lost=sum(1 for k in expected if k not in seen),
        samples_duplicated=sum(c - 1 for c in seen.values() if c > 1),
        wrong_length=wrong,
        staleness_bound=min(p.staleness for p in wl.pipelines),
        staleness=dict(sorted(Counter(row[3] for row in staleness.trained).items())),
        trainer_version=version, steps=case.steps, segments=staleness.segments, checkpoints=str(folder),
        notes=(f"time scale {case.time_scale:g}: one wall second stands for {case.time_scale:g} device seconds",),
    )
