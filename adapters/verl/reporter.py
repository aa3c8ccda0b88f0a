"""Turns verl's stage boundaries into jigsaw hook calls (no verl import).

One :class:`StageReporter` per trainer. It owns the clock (``t`` = seconds since the
reporter was made), the step counter (jigsaw steps count from 0; verl's ``global_steps``
from 1), and the plugin manager the hooks go to (an ``EventRecorder`` is always registered,
so the run's sub-stage graph can be built from ``reporter.recorder.events``).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterable

from jigsaw_plugin.events import EventRecorder
from jigsaw_plugin.manager import call, get_plugin_manager, register

__all__ = ["StageReporter", "batch_sizes"]


def batch_sizes(batch: Any, tokens_key: str = "seq_len") -> tuple[int, int]:
    """``(samples, tokens)`` of a verl ``KVBatchMeta`` (or anything with ``tags``).

    Padding rows that ``_balance_batch`` adds (``is_padding``) are not samples; tokens sum
    the tag ``tokens_key`` (``seq_len`` = prompt + response, ``response_len``, ``prompt_len``)
    that verl's agent loop writes for every trajectory.
    """
    tags: Iterable[dict] = getattr(batch, "tags", None) or []
    samples = tokens = 0
    for tag in tags:
        if tag.get("is_padding", False):
            continue
        samples += 1
        tokens += int(tag.get(tokens_key, 0) or 0)
    if samples == 0 and not tags:
        try:
            samples = len(batch)
        except TypeError:
            samples = 0
    return samples, tokens


class StageReporter:
    """Emits ``jigsaw_*`` hooks for one verl pipeline.

    :param pipeline: The pipeline's name.
    :param pm: A jigsaw plugin manager (default: a fresh one with entry-point plugins).
    :param clock: ``() -> seconds``; default ``time.perf_counter``.
    """

    def __init__(self, pipeline: str, pm=None, clock=time.perf_counter):
        self.pipeline = pipeline
        self.pm = pm if pm is not None else get_plugin_manager()
        self.recorder = EventRecorder(include_progress=False)
        register(self.pm, self.recorder)
        self._clock = clock
        self._t0 = clock()
        self.t0_wall = time.time() - (clock() - self._t0)  # wall-clock origin, for other processes
        self.step = -1  # jigsaw step index of the step in progress
        self.version = 0  # policy version last published to the rollout replicas
        self._open: dict[str, tuple] = {}
        self._callers: dict = {}  # hook name -> pluggy HookCaller, bound once

    def now(self) -> float:
        return self._clock() - self._t0

    def emit(self, hook: str, **kwargs) -> None:
        caller = self._callers.get(hook)
        if caller is None:  # first use (or historic): validated by manager.call
            call(self.pm, hook, **kwargs)
            if not getattr(self.pm.hook, hook).is_historic():
                self._callers[hook] = getattr(self.pm.hook, hook)
            return
        caller(**kwargs)

    # ---- lifecycle ------------------------------------------------------------------------
    def register_pipeline(self, spec: dict) -> None:
        self.emit("jigsaw_register_pipeline", pipeline=self.pipeline, spec={"name": self.pipeline, **spec})

    def pipeline_start(self) -> None:
        self.emit("jigsaw_pipeline_start", pipeline=self.pipeline, t=self.now())

    def pipeline_end(self) -> None:
        self.emit("jigsaw_pipeline_end", pipeline=self.pipeline, t=self.now())

    def step_start(self) -> int:
        self.step += 1
        self.emit("jigsaw_step_start", pipeline=self.pipeline, step=self.step, t=self.now())
        return self.step

    def step_end(self) -> None:
        self.emit("jigsaw_step_end", pipeline=self.pipeline, step=self.step, t=self.now())

    # ---- stages ---------------------------------------------------------------------------
    def stage_start(self, stage: str, devices=(), samples: int = 0, tokens: int = 0) -> None:
        devices = tuple(devices)
        self._open[stage] = devices
        self.emit("jigsaw_stage_start", pipeline=self.pipeline, step=self.step, stage=stage,
                  devices=devices, samples=int(samples), tokens=int(tokens), t=self.now())

    def stage_end(self, stage: str, samples: int = 0, tokens: int = 0, devices=None) -> None:
        opened = self._open.pop(stage, ())
        devices = tuple(devices) if devices is not None else opened
        self.emit("jigsaw_stage_end", pipeline=self.pipeline, step=self.step, stage=stage,
                  devices=devices, samples=int(samples), tokens=int(tokens), t=self.now())

    @contextmanager
    def stage(self, stage: str, devices=(), samples: int = 0, tokens: int = 0):
        """Start/end around a block; the end fires even if the block raises (devices free)."""
        self.stage_start(stage, devices, samples, tokens)
        try:
            yield
        finally:
            self.stage_end(stage, samples, tokens)

    @contextmanager
    def weight_sync(self, version: int, devices=(), nbytes: int = 0):
        """The ``weight_sync`` stage plus ``jigsaw_weight_sync_start``/``_end``."""
        devices = tuple(devices)
        self.stage_start("weight_sync", devices)
        self.emit("jigsaw_weight_sync_start", pipeline=self.pipeline, step=self.step, version=int(version),
                  devices=devices, bytes=int(nbytes), t=self.now())
        try:
            yield
        finally:
            self.version = int(version)
            self.emit("jigsaw_weight_sync_end", pipeline=self.pipeline, step=self.step, version=int(version),
                      devices=devices, t=self.now())
            self.stage_end("weight_sync")
