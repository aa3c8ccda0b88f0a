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
from jigsaw_plugin.runtime.reference.reward import low_id_reward

__all__ = ["ReferenceStageRunner", "StageRecord", "SUPPORTED_STAGES"]

SUPPORTED_STAGES = ("old_log_prob", "ref", "adv", "update_actor", "weight_sync")


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


async def _call(obj, method: str, *args):
    """Call ``obj.method(*args)``: a Ray actor method is awaited as an ObjectRef; a local
    method runs in a worker thread (torch releases the GIL in its kernels)."""
    fn = getattr(obj, method)
    if hasattr(fn, "remote"):
        return await fn.remote(*args)
    return await asyncio.to_thread(fn, *args)


async def _maybe_await(x):
    return await x if inspect.isawaitable(x) else x


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
    core on CPU machines: the stage competes only for the cores the policy granted it).
    """

    def __init__(self, trainers, reward=None, engines=None, pin_devices: bool = False):
        self._trainers = trainers
        self.pin_devices = pin_devices  # CPU pools: run each stage on its granted cores only
        self.reward = reward if reward is not None else low_id_reward()
        self._engines = engines or _replica_engines
        self.records: list[StageRecord] = []
        self.sync: dict[str, dict] = {}  # pipeline -> last weight sync: mode, engines, version, note
        self.rewards: dict[tuple, list] = {}  # (pipeline, step) -> per-sample rewards
        self._state: dict[tuple, dict] = {}  # (pipeline, step) -> tensors between stages
        self._latest: dict[str, tuple] = {}  # pipeline -> (version, bf16 state dict)

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

    async def run(self, pipeline, step: int, stage: str, devices=(), samples=None) -> dict:
        """Execute one stage of one step; returns its metrics (also kept in ``records``)."""
        name = getattr(pipeline, "name", pipeline)
        key = (name, int(step))
        st = self._state.setdefault(key, {})
        if samples is not None:
            st["batch"] = list(samples)
        batch = st.get("batch")
        if batch is None and stage != "weight_sync":
            raise ValueError(f"{name} step {step}: stage {stage} needs the step's samples (none given)")
        trainer = self.trainer(name)
        t0 = time.perf_counter()
        if devices and stage != "adv" and hasattr(trainer, "use_devices") and self.pin_devices:
            await _call(trainer, "use_devices", tuple(devices))
        if stage == "old_log_prob":
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
        rec = StageRecord(name, int(step), stage, tuple(devices or ()), len(batch or ()), tokens, wall, dict(metrics))
        self.records.append(rec)
        return rec.metrics

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
