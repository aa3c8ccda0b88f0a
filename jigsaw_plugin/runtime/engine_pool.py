"""A pre-started pool of vLLM engine actors: one per (pipeline, device).

Starting a vLLM engine takes 20-60 s on these machines, far longer than a rollout step, so
a replica launch cannot start one. The pool starts every engine a pipeline could be
given up front (OpenRLHF's answer too: engines are provisioned at start and switched on
and off); a policy's ``LaunchReplica`` on a device then *wakes* that pipeline's engine
there. An idle engine holds its memory but no core (vLLM's engine loop blocks when it has
no request), so parking it is the CPU stand-in for vLLM's sleep mode, which the CPU
backend lacks.

Weights: a parked engine misses the weight syncs of its pipeline. ``PooledEngine`` loads
the pipeline's latest weights (from the stage runner) before its first request after a
wake-up, so no rollout ever runs on stale weights; the load is inside the measured run.

On CPU, device k is core k (cpu_affinity.py): the engine's processes are pinned there.
"""

from __future__ import annotations

import asyncio
import os

from jigsaw_plugin.runtime.engines.vllm_engine import ActorEngine, engine_actor_class

__all__ = ["EnginePool", "PooledEngine"]


class PooledEngine:
    """One pool engine lent to a replica: the router's engine interface, weights current."""

    backend = "vllm"

    def __init__(self, engine: ActorEngine, pipeline: str, weights_of, state: dict, on_generate=None):
        self.engine, self.pipeline = engine, pipeline
        self._weights_of = weights_of  # pipeline -> (version, state dict) | None
        self._state = state  # shared per (pipeline, device) across lends: the loaded version
        self._lock = asyncio.Lock()
        # on_generate(request_id, version): the weight version each segment is generated with
        self._on_generate = on_generate

    @property
    def version(self) -> int:
        """The weight version this engine holds."""
        return int(self._state["version"])

    async def _current(self) -> None:
        latest = self._weights_of(self.pipeline)
        if latest is None or latest[0] <= self._state["version"]:
            return
        async with self._lock:
            latest = self._weights_of(self.pipeline)
            if latest[0] > self._state["version"]:
                await self.engine.load_weights(latest[1], latest[0])
                self._state["version"] = latest[0]

    async def generate(self, request_id, prompt_token_ids, max_tokens, *, on_progress=None, **sampling):
        await self._current()
        if self._on_generate is not None:
            self._on_generate(request_id, self.version)
        return await self.engine.generate(request_id, prompt_token_ids, max_tokens, **sampling)

    async def abort(self, request_id, *, missing_ok=True):
        return await self.engine.abort(request_id, missing_ok=missing_ok)

    async def load_weights(self, state_dict, version=None):
        await self.engine.load_weights(state_dict, version)
        if version is not None:
            self._state["version"] = int(version)

    def mark_dead(self) -> None:
        """The engine died (LiveWorld saw EngineDead): the pool replaces it at the next lend."""
        self._state["dead"] = True


class EnginePool:
    """Engine actors keyed by (pipeline, device), started once and reused across runs."""

    def __init__(self, engine_kwargs: dict | None = None, pin: bool = True):
        self.engine_kwargs = dict(engine_kwargs or {})
        self.pin = pin
        self.engines: dict[tuple, ActorEngine] = {}
        self.models: dict[tuple, str] = {}
        self.state: dict[tuple, dict] = {}

    async def ensure(self, pipeline: str, model_path, devices) -> None:
        """Start (in parallel) the engines of ``pipeline`` on ``devices`` not running yet."""

        async def start(key):
            await self.engines[key].start()
            # one short request: the first one pays one-off costs no run should be charged
            await self.engines[key].generate(f"warm-up-{key[0]}-{key[1]}", [1, 2, 3, 4], 8)

        new = []
        for d in devices:
            key = (pipeline, int(d))
            if key in self.engines and self.models[key] == str(model_path):
                continue
            self.engines[key], self.models[key] = self._new_actor(model_path, d), str(model_path)
            self.state[key] = {"version": 0}
            new.append(key)
        await asyncio.gather(*(start(k) for k in new))

    async def reset(self, pipeline: str, weights) -> None:
        """Load a run's initial weights (version 0) into every engine of the pipeline."""
        keys = [k for k in self.engines if k[0] == pipeline]
        await asyncio.gather(*(self.engines[k].load_weights(weights, 0) for k in keys))
        for k in keys:
            self.state[k]["version"] = 0

    async def preempt(self, pipeline: str, device: int) -> None:
        """The device is preempted: its engine stops (vLLM's processes, then the actor;
        in a thread: it blocks) and the device has no engine until ``replace``."""
        key = (pipeline, int(device))
        self.state[key]["dead"] = True
        await asyncio.to_thread(self.engines.pop(key).shutdown)

    async def replace(self, pipeline: str, device: int, pull) -> int:
        """The replacement of a preempted device: a fresh engine actor there, started, its
        weights loaded by ``await pull(engine)`` (which returns the version it loaded: the
        parameter server's latest, runtime/preemption_ray.py); returns that version."""
        key = (pipeline, int(device))
        restarts = self.state.get(key, {}).get("restarts", 0) + 1
        engine = self._new_actor(self.models[key], int(device))
        await engine.start()
        await engine.generate(f"warm-up-{key[0]}-{key[1]}-r{restarts}", [1, 2, 3, 4], 8)
        version = int(await pull(engine))
        self.engines[key] = engine
        self.state[key] = {"version": version, "restarts": restarts}
        return version

    def lend(self, pipeline: str, devices, weights_of, on_generate=None) -> PooledEngine:
        """The engine of ``pipeline`` on the replica's first device (TP 1 on CPU). A dead
        one is replaced by a fresh actor, which starts (and loads the latest weights) on
        its first request."""
        key = (pipeline, int(devices[0]))
        if key not in self.engines:  # never started, or preempted and not replaced yet
            raise KeyError(f"no pooled engine for pipeline {pipeline!r} on device {devices[0]}; "
                           f"pool: {sorted(self.engines)}")
        if self.state[key].get("dead"):
            self.engines[key] = self._new_actor(self.models[key], key[1])
            self.state[key] = {"version": -1, "restarts": self.state[key].get("restarts", 0) + 1}
        return PooledEngine(self.engines[key], pipeline, weights_of, self.state[key], on_generate)

    def _new_actor(self, model_path, device: int) -> ActorEngine:
        kwargs = dict(self.engine_kwargs)
        if self.pin:
            kwargs["pin_devices"] = (int(device),)
            kwargs.setdefault("omp_threads_bind", str(int(device) % (os.cpu_count() or 1)))
        # No Ray CPU or device claim: the policy accounts for devices, pinning enforces them.
        handle = engine_actor_class().options(num_cpus=0, max_concurrency=1000).remote(str(model_path), kwargs)
        return ActorEngine(handle)

    def shutdown(self) -> None:
        for engine in self.engines.values():
            engine.shutdown()
        self.engines.clear()
