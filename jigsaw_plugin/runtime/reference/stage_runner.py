"""``ReferenceStageRunner``: the training stages of ``LiveWorld`` run for real.

``LiveWorld(..., stage_runner=runner)`` calls, for every training-side stage a policy
starts, ::

    await runner.run(pipeline, step, stage, devices, samples)

with ``pipeline`` the ``PipelineRun`` (or just its name), ``samples`` the step's batch as
the rollout produced it: one ``(prompt_token_ids, response_token_ids, prompt_index[,
response_mask])`` per sample (trainer.py). The runner keeps the per-step tensors between
stages and executes, in verl's order (algorithms.py):

- ``old_log_prob``: the trainer's per-token log-probs of the batch (no grad);
- ``ref``: the same under the frozen reference copy;
- ``adv``: the rule reward of every sample (reward.py) and GRPO advantages (grpo.py), on
  the driver;
- ``update_actor``: one GRPO update (clipped ratio against the old log-probs, KL to the
  reference when the trainer has one);
- ``weight_sync``: ``state_dict_bf16()`` pushed into every live rollout engine of the
  pipeline that can take it: ``await engine.load_weights(state_dict, version)`` (the
  vLLM engine and its actor wrapper). An engine with only ``update_weights(version)``
  (the EMULATED engine: it has no weights) is told the version, and an engine with
  neither is left alone; either way the sync is recorded as not (fully) supported in
  ``runner.sync[pipeline]`` (``mode``: ``"weights"``, ``"version-only"`` or
  ``"unsupported"``) and in the stage's metrics. The latest weights stay available as
  ``runner.latest_weights(pipeline)`` so that an engine factory can load them into a
  replica launched after the sync (a fresh engine starts from the model folder).

PPO's ``values`` / ``update_critic`` stages have no reference implementation (there is no
critic): they raise ``NotImplementedError``.

**Micro-batches.** Given a ``grant`` (a callable ``GrantRequest -> devices``, awaited if it
returns an awaitable; microbatch.py), ``old_log_prob``, ``ref`` and ``update_actor`` run as
sequences of micro-batch sub-stages (the trainer's ``forward_plan`` / ``update_plan``):
before each wave of micro-batches the grant says which devices the stage may use, so a
scheduler can grow, shrink or pause the stage at micro-batch boundaries (micro_stage.py).
The update is bitwise the same whatever the grants (gradients summed in micro-batch index
order, one torch thread per micro-batch), and ``StageRecord.micro_batches`` says what ran
where and when. Without a grant a stage is one call of the trainer's whole-stage method on
the stage's devices, as before (``stage_devices_grant`` gives the same devices per
micro-batch with the per-micro-batch record).

A trainer is a ``ReferenceTrainer`` in this process (its calls run in a worker thread, so
the event loop keeps serving rollouts) or its Ray actor handle (``make_trainer_actor``;
calls are awaited as ``ObjectRef``s). ``trainers`` is one trainer, a dict pipeline name
-> trainer, or a callable name -> trainer.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from dataclasses import dataclass, field

import numpy as np

from jigsaw_plugin.runtime.reference.grpo import grpo_advantages
from jigsaw_plugin.runtime.reference.micro_stage import DEFAULT_PAUSE_POLL_S, MicroStageExecutor
from jigsaw_plugin.runtime.reference.microbatch import GrantRequest, MicroBatchRecord, trained_tokens
from jigsaw_plugin.runtime.reference.reward import low_id_reward

__all__ = ["ReferenceStageRunner", "StageRecord", "SUPPORTED_STAGES", "MICRO_BATCHED_STAGES"]

SUPPORTED_STAGES = ("old_log_prob", "ref", "adv", "update_actor", "weight_sync")
MICRO_BATCHED_STAGES = ("old_log_prob", "ref", "update_actor")  # what a grant can resize


@dataclass
class StageRecord:
    """One executed stage: what ran, on which devices, how long (wall seconds), metrics."""

    pipeline: str
    step: int
    stage: str
    devices: tuple
    samples: int
    tokens: int
    wall_s: float
    metrics: dict = field(default_factory=dict)
    micro_batches: tuple[MicroBatchRecord, ...] = ()  # with a grant: one per micro-batch, in index order


async def _call(obj, method: str, *args):
    """Call ``obj.method(*args)``: a Ray actor method is awaited as an ObjectRef; a local
    method runs in a worker thread (torch releases the GIL in its kernels)."""
    fn = getattr(obj, method)
    if hasattr(fn, "remote"):
        return await fn.remote(*args)
    return await asyncio.to_thread(fn, *args)


async def _maybe_await(x):
    return await x if inspect.isawaitable(x) else x


def _rows(x, idx: list[int]):
    """Rows ``idx`` of a tensor / array (or a list of rows); None stays None."""
    if x is None:
        return None
    return [x[i] for i in idx] if isinstance(x, (list, tuple)) else x[idx]


def _replica_engines(pipeline) -> list:
    """The live engines of a ``PipelineRun``'s replicas (LiveReplica: ``router``, ``id``)."""
    out = []
    for rep in getattr(pipeline, "replicas", ()):
        router = getattr(rep, "router", None)
        if router is not None and rep.id in router.engines:
            out.append(router.engines[rep.id])
    return out


class ReferenceStageRunner:
    """Runs the reference GRPO stages for ``LiveWorld`` (see the module docstring).

    ``reward``: ``reward.batch(samples) -> list[float]`` (default: reward.low_id_reward());
    ``engines``: optional callable ``pipeline -> engines`` overriding how the weight sync
    finds the pipeline's rollout engines (default: its live replicas' router engines);
    ``pin_devices``: before each stage, ``trainer.use_devices(devices)`` (one device = one
    core on CPU machines: the stage competes only for the cores the policy granted it);
    micro-batched, each device's worker thread is pinned to its core instead.
    ``grant``: run ``old_log_prob`` / ``ref`` / ``update_actor`` micro-batch by micro-batch
    on the devices it hands out (module docstring; ``run(..., grant=)`` per stage);
    ``pause_poll_s``: how often a paused stage asks again.
    """

    def __init__(self, trainers, reward=None, engines=None, pin_devices: bool = False, grant=None,
                 pause_poll_s: float = DEFAULT_PAUSE_POLL_S):
        self._trainers = trainers
        self.pin_devices = pin_devices  # CPU pools: run each stage on its granted cores only
        self.grant = grant
        self._micro = MicroStageExecutor(pin_devices=pin_devices, pause_poll_s=pause_poll_s)
        self.reward = reward if reward is not None else low_id_reward()
        self._engines = engines or _replica_engines
        self.records: list[StageRecord] = []
        self.sync: dict[str, dict] = {}  # pipeline -> last weight sync: mode, engines, version, note
        self.rewards: dict[tuple, list] = {}  # (pipeline, step) -> per-sample rewards
        self._state: dict[tuple, dict] = {}  # (pipeline, step) -> tensors between stages
        self._latest: dict[str, tuple] = {}  # pipeline -> (version, bf16 state dict)

    def resizable(self, pipeline, stage: str) -> bool:
        """Whether ``run(..., grant=)`` can resize this stage at micro-batch boundaries (the
        stage is micro-batched and the pipeline's trainer has the micro-batch methods)."""
        name = getattr(pipeline, "name", pipeline)
        needs = ("micro_grad",) if stage == "update_actor" else ("forward_plan", "micro_log_probs")
        return stage in MICRO_BATCHED_STAGES and all(hasattr(self.trainer(name), m) for m in needs)

    def trainer(self, name: str):
        t = self._trainers
        if isinstance(t, dict):
            return t[name]
        if callable(t) and not hasattr(t, "update_actor"):
            return t(name)
        return t

    def latest_weights(self, pipeline) -> tuple | None:
        """``(version, bf16 state dict)`` of the last weight sync of the pipeline, or None."""
        return self._latest.get(getattr(pipeline, "name", pipeline))

    def mean_reward(self, pipeline, step: int) -> float:
        return float(np.mean(self.rewards[(getattr(pipeline, "name", pipeline), step)]))

    def close(self) -> None:
        """Stop the per-device worker threads of micro-batched stages."""
        self._micro.close()

    async def run(self, pipeline, step: int, stage: str, devices=(), samples=None, grant=None) -> dict:
        """Execute one stage of one step; returns its metrics (also kept in ``records``).
        ``grant`` (default: the runner's): micro-batch by micro-batch on granted devices."""
        name = getattr(pipeline, "name", pipeline)
        key = (name, int(step))
        st = self._state.setdefault(key, {})
        if samples is not None:
            st["batch"] = list(samples)
        batch = st.get("batch")
        if batch is None and stage != "weight_sync":
            raise ValueError(f"{name} step {step}: stage {stage} needs the step's samples (none given)")
        trainer = self.trainer(name)
        grant = grant if grant is not None else self.grant
        micro = None
        if grant is not None and stage in MICRO_BATCHED_STAGES:
            if not hasattr(trainer, "micro_grad"):
                raise TypeError(f"{name}: a grant needs a trainer with micro-batch methods (micro_log_probs, "
                                f"micro_grad, optimizer_step: ReferenceTrainer); got {type(trainer).__name__}")
            micro = GrantRequest(name, int(step), stage, 0, 0, 0, tuple(int(d) for d in devices or ()), ())
        t0 = time.perf_counter()
        if devices and stage != "adv" and hasattr(trainer, "use_devices") and self.pin_devices and micro is None:
            await _call(trainer, "use_devices", tuple(devices))
        micro_records: list[MicroBatchRecord] = []
        if stage in ("old_log_prob", "ref") and micro is not None:
            st["old" if stage == "old_log_prob" else "ref"] = await self._forward_micro(
                trainer, batch, stage == "ref", grant, micro, t0, micro_records)
            metrics = {}
        elif stage == "old_log_prob":
            st["old"] = await _call(trainer, "old_log_prob", batch)
            metrics = {}
        elif stage == "ref":
            st["ref"] = await _call(trainer, "ref_log_prob", batch)
            metrics = {}
        elif stage == "adv":
            rewards = list(self.reward.batch(batch))
            st["adv"] = grpo_advantages(rewards, [item[2] for item in batch])
            self.rewards[key] = rewards
            metrics = {"reward_mean": float(np.mean(rewards)), "reward_std": float(np.std(rewards))}
        elif stage == "update_actor":
            if "old" not in st:  # a policy that skips old_log_prob: the batch is on-policy
                st["old"] = await _call(trainer, "old_log_prob", batch)
            if "adv" not in st:
                await self.run(pipeline, step, "adv", devices)
            if micro is not None:
                metrics = await self._update_micro(trainer, batch, st, grant, micro, t0, micro_records)
            else:
                metrics = await _call(trainer, "update_actor", batch, st["old"], st["adv"], st.get("ref"))
        elif stage == "weight_sync":
            metrics = await self._weight_sync(pipeline, name, trainer)
            self._state.pop(key, None)  # the step is done: drop its tensors
        elif stage in ("values", "update_critic"):
            raise NotImplementedError(f"{name}: stage {stage!r} needs a critic; the reference pipeline "
                                      f"trains GRPO-style algorithms only ({', '.join(SUPPORTED_STAGES)})")
        else:
            raise ValueError(f"{name}: unknown stage {stage!r}")
        wall = time.perf_counter() - t0
        tokens = sum(len(item[0]) + len(item[1]) for item in batch) if batch else 0
        rec = StageRecord(name, int(step), stage, tuple(devices or ()), len(batch or ()), tokens, wall, dict(metrics),
                          tuple(micro_records))
        self.records.append(rec)
        return rec.metrics

    async def _forward_micro(self, trainer, batch, reference: bool, grant, request, t0, records: list):
        """A forward stage micro-batch by micro-batch; [B, R] log-probs in batch order."""
        from jigsaw_plugin.runtime.reference.trainer import pad_and_stack

        plan = await _call(trainer, "forward_plan", len(batch))

        async def compute(m, device):
            return await self._micro.call_on(device, trainer, "micro_log_probs", [batch[i] for i in m.samples],
                                             reference)

        parts, recs = await self._micro.run_plan(plan, grant, request, compute, t0=t0)
        records += recs
        return pad_and_stack([parts[m.index] for m in plan.micro_batches])

    async def _update_micro(self, trainer, batch, st, grant, request, t0, records: list) -> dict:
        """``update_actor`` micro-batch by micro-batch: each micro-batch's gradient where it
        was granted, an optimizer step after each mini-batch (gradients summed in index
        order by the trainer), the trainer's metrics."""
        plan = await _call(trainer, "update_plan", len(batch))
        old, adv, ref = st["old"], st["adv"], st.get("ref")
        tokens = {k: trained_tokens(batch, [i for m in g for i in m.samples]) for k, g in enumerate(plan.groups())}
        norms: list[float] = []

        async def compute(m, device):
            idx = list(m.samples)
            return await self._micro.call_on(device, trainer, "micro_grad", m.index, [batch[i] for i in idx],
                                             _rows(old, idx), _rows(adv, idx), _rows(ref, idx),
                                             tokens[m.mini_batch])

        async def step(group):
            norms.append(await _call(trainer, "optimizer_step", [m.index for m in group]))

        stats, recs = await self._micro.run_plan(plan, grant, request, compute, step, t0=t0)
        records += recs
        return await _call(trainer, "finish_update", [stats[i] for i in sorted(stats)], norms, plan.mini_batches,
                           sum(tokens.values()), time.perf_counter() - t0)

    async def _weight_sync(self, pipeline, name: str, trainer) -> dict:
        weights = await _call(trainer, "state_dict_bf16")
        version = int(await _call(trainer, "get_version"))
        self._latest[name] = (version, weights)
        engines = list(self._engines(pipeline))
        modes = []
        for engine in engines:
            if hasattr(engine, "load_weights"):
                await _maybe_await(engine.load_weights(weights, version))
                modes.append("weights")
            elif hasattr(engine, "update_weights"):
                await _maybe_await(engine.update_weights(version))
                modes.append("version-only")
            else:
                modes.append("unsupported")
        if not engines:
            mode, note = "no-engines", "no live rollout engine at sync time; weights kept in latest_weights()"
        elif all(m == "weights" for m in modes):
            mode, note = "weights", f"bf16 weights loaded into {len(engines)} engine(s)"
        elif all(m == "version-only" for m in modes):
            mode, note = "version-only", "engines take a version number only (EMULATED: no weights to load)"
        else:
            mode = "unsupported" if "weights" not in modes else "partial"
            note = (f"engine types {sorted({type(e).__name__ for e in engines})} expose no load_weights: "
                    f"weight sync not supported; rollouts keep the old weights")
        self.sync[name] = {"mode": mode, "engines": len(engines), "version": version, "note": note,
                           "bytes": int(sum(getattr(v, "nbytes", 0) for v in weights.values()))}
        return dict(self.sync[name])
