"""Run a stage's micro-batches on the devices a grant callback hands out (torch-free).

``MicroStageExecutor.run_plan`` walks a ``MicroBatchPlan`` mini-batch by mini-batch. At
each micro-batch boundary it asks the grant for devices (``GrantRequest``); the answer's
width ``w`` is how many of the mini-batch's next micro-batches run side by side, one per
granted device; then it asks again. An answer ``()`` pauses the stage: the pause is
recorded and the grant asked again every ``pause_poll_s`` (a grant may instead await until
it has devices: that time shows as ``waited_s``). A wave never crosses a mini-batch
boundary: the next mini-batch needs the weights of the optimizer step in between.

On CPU one device is one core: a local trainer's micro-batch on device ``d`` runs in a
worker thread of its own for ``d`` (pinned to core ``d`` with ``pin_devices``; torch with
one thread there, trainer.py), so two granted devices are two cores computing two
micro-batches at once. A Ray actor handle gets its calls as ObjectRefs (an actor runs them
in its own order; the result does not depend on it).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from jigsaw_plugin.runtime.cpu_affinity import cores_of
from jigsaw_plugin.runtime.reference.microbatch import (
    GrantRequest,
    MicroBatch,
    MicroBatchPlan,
    MicroBatchRecord,
    check_devices,
)

__all__ = ["MicroStageExecutor", "DEFAULT_PAUSE_POLL_S"]

DEFAULT_PAUSE_POLL_S = 0.005  # how often a paused stage asks its grant again


def _pin_calling_thread(device: int) -> None:
    if hasattr(os, "sched_setaffinity"):  # Linux: pid 0 is the calling thread
        os.sched_setaffinity(0, cores_of([device]))


async def _maybe_await(x):
    return await x if inspect.isawaitable(x) else x


class MicroStageExecutor:
    """Per-device workers and the grant loop of micro-batched stages."""

    def __init__(self, pin_devices: bool = False, pause_poll_s: float = DEFAULT_PAUSE_POLL_S):
        self.pin_devices = pin_devices
        self.pause_poll_s = float(pause_poll_s)
        self._workers: dict[int, ThreadPoolExecutor] = {}

    def _worker(self, device: int) -> ThreadPoolExecutor:
        if device not in self._workers:
            init = functools.partial(_pin_calling_thread, device) if self.pin_devices else None
            self._workers[device] = ThreadPoolExecutor(1, thread_name_prefix=f"jigsaw-dev{device}", initializer=init)
        return self._workers[device]

    async def call_on(self, device: int, trainer, method: str, *args):
        """``trainer.method(*args)`` on ``device``: a local trainer in that device's worker
        thread, a Ray actor method awaited as an ObjectRef."""
        fn = getattr(trainer, method)
        if hasattr(fn, "remote"):
            return await fn.remote(*args)
        return await asyncio.get_running_loop().run_in_executor(self._worker(device), functools.partial(fn, *args))

    async def _granted(self, grant, request: GrantRequest) -> tuple[tuple[int, ...], int]:
        pauses = 0
        while True:
            devices = check_devices(await _maybe_await(grant(request)), field="grant")
            if devices:
                return devices, pauses
            pauses += 1  # width 0: paused until the grant hands devices back
            await asyncio.sleep(self.pause_poll_s)

    async def run_plan(self, plan: MicroBatchPlan, grant, request: GrantRequest, compute, after_group=None,
                       t0: float | None = None) -> tuple[dict, list[MicroBatchRecord]]:
        """Run every micro-batch of ``plan``: ``await compute(micro_batch, device)`` on the
        granted devices, ``await after_group(group)`` after each mini-batch. Returns the
        results by micro-batch index and one record per micro-batch, in index order.
        ``request`` is the template of the grant's questions (pipeline, step, stage,
        stage devices); ``t0`` the stage's start (``perf_counter``)."""
        t0 = time.perf_counter() if t0 is None else t0
        total = len(plan.micro_batches)
        results: dict[int, object] = {}
        records: list[MicroBatchRecord] = []
        current: tuple[int, ...] = ()
        done = 0
        for group in plan.groups():
            pos = 0
            while pos < len(group):
                asked = time.perf_counter()
                ask = replace(request, next_micro_batch=group[pos].index, remaining=total - done, total=total,
                              current=current)
                current, pauses = await self._granted(grant, ask)
                waited = time.perf_counter() - asked
                wave = group[pos: pos + len(current)]

                async def one(m: MicroBatch, device: int, granted=current, pauses=pauses, waited=waited):
                    start = time.perf_counter()
                    results[m.index] = await compute(m, device)
                    return MicroBatchRecord(m.index, m.mini_batch, len(m.samples), granted, device,
                                            start - t0, time.perf_counter() - t0, waited, pauses)

                records += await asyncio.gather(*(one(m, d) for m, d in zip(wave, current)))
                pos += len(wave)
                done += len(wave)
            if after_group is not None:
                await after_group(group)
        return results, sorted(records, key=lambda r: r.index)

    def close(self) -> None:
        """Stop the per-device worker threads (idle ones; running calls finish first)."""
        for ex in self._workers.values():
            ex.shutdown(wait=False)
        self._workers.clear()
