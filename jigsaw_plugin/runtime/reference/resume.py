"""Restart a reference run from its last completed step, and count what it trained.

A driver that is killed (SIGKILL, OOM, a lost node) loses its trainers' state with its
process. ``StepCheckpoint`` is what it writes at the end of every step: the number of
completed steps, each trainer's full state (policy weights, AdamW moments, version) and
the step's *ledger*, one ``TrainedSample`` per sample the update trained. A restarted
driver loads it and goes on with the next step; an update that ran after the last
checkpoint died with the old trainer, so the model it resumes from trained every kept
step exactly once.

The checkpoint is committed by one ``os.replace`` of ``state.json`` (after the trainer
files and the ledger are on disk), so a kill while writing leaves the previous one.

``LedgerStageRunner`` is the reference stage runner that also keeps the ledger: the
length of every prompt and response at the moment ``update_actor`` trained it.
``SyncSkippingDeadEngines`` is its weight sync's engine list: an engine that died after
the rollout (while the step trained) is reported dead instead of failing the step; the
engine pool replaces it at the next lend and the new engine loads the latest weights.

torch is imported inside functions only.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from jigsaw_plugin.runtime.reference.stage_runner import ReferenceStageRunner

__all__ = ["LedgerStageRunner", "StepCheckpoint", "TrainedSample", "load_checkpoint", "restore_trainer",
           "save_checkpoint", "skip_dead_engines", "trainer_state", "wait_until_released"]

STATE_FILE = "state.json"


@dataclass(frozen=True)
class TrainedSample:
    """One sample as ``update_actor`` trained it (``index``: its place in the step's batch,
    which is the workload sampler's sample index)."""

    pipeline: str
    step: int
    index: int
    prompt_tokens: int
    response_tokens: int


@dataclass(frozen=True)
class StepCheckpoint:
    """Steps ``0 .. completed_steps - 1`` are trained and kept; ``trainers``: pipeline ->
    the file holding its trainer's state; ``ledger``: every sample of the kept steps."""

    completed_steps: int
    trainers: dict
    ledger: tuple


# ---- trainer state ---------------------------------------------------------------------------
def _state_bytes(trainer) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save({"model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict(),
                "version": int(trainer.version)}, buf)
    return buf.getvalue()


def _load_bytes(trainer, blob: bytes) -> int:
    import torch

    state = torch.load(io.BytesIO(blob), weights_only=True)
    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.version = int(state["version"])
    return trainer.version


async def trainer_state(trainer) -> bytes:
    """The full state of a ``ReferenceTrainer`` or of its Ray actor (``__ray_call__``)."""
    if hasattr(trainer, "__ray_call__"):
        return await trainer.__ray_call__.remote(_state_bytes)
    return _state_bytes(trainer)


async def restore_trainer(trainer, blob: bytes) -> int:
    """Load a state from :func:`trainer_state`; returns the trainer's version after it. The
    frozen reference copy is not in the state: it is the initial model, rebuilt the same."""
    if hasattr(trainer, "__ray_call__"):
        return await trainer.__ray_call__.remote(_load_bytes, blob)
    return _load_bytes(trainer, blob)


# ---- the checkpoint --------------------------------------------------------------------------
def save_checkpoint(folder, completed_steps: int, states: dict, ledger_rows) -> StepCheckpoint:
    """Write the trainer states of step ``completed_steps - 1`` and its ledger rows, then
    commit ``state.json`` atomically (a kill before the commit leaves the previous one)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    step = int(completed_steps) - 1
    files = {}
    for name, blob in states.items():
        path = folder / f"trainer-{name}-step{step}.pt"
        path.write_bytes(blob)
        files[name] = path.name
    (folder / f"ledger-step{step}.json").write_text(json.dumps([asdict(r) for r in ledger_rows]))
    tmp = folder / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps({"completed_steps": int(completed_steps), "trainers": files}))
    os.replace(tmp, folder / STATE_FILE)
    for old in folder.glob("trainer-*-step*.pt"):  # earlier states are no longer needed
        if old.name not in files.values():
            old.unlink(missing_ok=True)
    return load_checkpoint(folder)


def load_checkpoint(folder) -> StepCheckpoint | None:
    """The last committed checkpoint, or None (nothing completed yet). Ledger files of
    steps past it (written by a driver killed before its commit) are ignored."""
    path = Path(folder) / STATE_FILE
    if not path.exists():
        return None
    state = json.loads(path.read_text())
    n = int(state["completed_steps"])
    rows = []
    for step in range(n):
        rows += [TrainedSample(**r) for r in json.loads((Path(folder) / f"ledger-step{step}.json").read_text())]
    return StepCheckpoint(n, {k: str(Path(folder) / v) for k, v in state["trainers"].items()}, tuple(rows))


# ---- rejoining the coordinator ----------------------------------------------------------------
def wait_until_released(client, pipelines, timeout_s: float, poll_s: float = 0.25) -> float:
    """Block until the coordinator no longer knows ``pipelines`` (a killed driver's are
    released by its reaper after ``heartbeat_timeout_s``); returns the seconds waited.

    A restarted driver must not register its pipelines before that: it would send their
    heartbeats itself, so the dead driver's would never expire and its leases, held under
    the same pipeline names, would never come back."""
    import time

    t0 = time.monotonic()
    while set(pipelines) & set(client.info()["pipelines"]):
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"the coordinator still knows pipeline(s) {sorted(pipelines)} after {timeout_s} s; "
                               f"is another driver running them?")
        time.sleep(poll_s)
    return time.monotonic() - t0


# ---- the stage runner that keeps the ledger ---------------------------------------------------
class LedgerStageRunner(ReferenceStageRunner):
    """``ReferenceStageRunner`` that records every sample ``update_actor`` trained.

    ``step_of(step)``: the step number the ledger records for the runner's ``step`` (a
    driver that runs one step per executor run passes its global step counter)."""

    def __init__(self, *args, step_of=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.step_of = step_of or (lambda step: step)
        self.trained: list[TrainedSample] = []
        self._batches: dict[tuple, list] = {}

    async def run(self, pipeline, step: int, stage: str, devices=(), samples=None, grant=None) -> dict:
        name = getattr(pipeline, "name", pipeline)
        if samples is not None:
            self._batches[(name, int(step))] = [(len(s[0]), len(s[1])) for s in samples]
        metrics = await super().run(pipeline, step, stage, devices, samples, grant=grant)
        if stage == "update_actor":  # trained: the ledger gets the batch as it was trained
            g = int(self.step_of(step))
            self.trained += [TrainedSample(name, g, i, pl, rl)
                             for i, (pl, rl) in enumerate(self._batches.pop((name, int(step))))]
        return metrics


class _SkipIfDead:
    """An engine for the weight sync: a dead engine is marked dead, not an error."""

    def __init__(self, engine):
        self.engine = engine

    async def load_weights(self, state_dict, version=None):
        from jigsaw_plugin.runtime.emulated import EngineDead

        try:
            await self.engine.load_weights(state_dict, version)
        except EngineDead:
            if hasattr(self.engine, "mark_dead"):
                self.engine.mark_dead()


def skip_dead_engines(pipeline) -> list:
    """``ReferenceStageRunner(engines=...)``: the pipeline's live replica engines, each
    wrapped so that one that died since the rollout does not fail the weight sync."""
    out = []
    for rep in getattr(pipeline, "replicas", ()):
        router = getattr(rep, "router", None)
        if router is not None and rep.id in router.replicas():
            out.append(_SkipIfDead(router.engine(rep.id)))
    return out
