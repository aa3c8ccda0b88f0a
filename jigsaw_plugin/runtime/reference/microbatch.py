"""Training stages as sequences of micro-batch sub-stages (torch-free).

A stage's samples are split into micro-batches of ``micro_batch_size`` samples in a fixed
order (``MicroBatchPlan``). Between micro-batches the stage runner asks a *grant* callback
which devices it may use next (``GrantRequest`` -> a tuple of device ids; ``()`` pauses
the stage), so a scheduler can grow, shrink or pause a training stage at micro-batch
boundaries. Each micro-batch is computed on one device with one torch thread, whatever
the width, and ``update_actor`` sums the micro-batch gradients in index order: the update
does not depend on how the stage was resized (stage_runner.py, trainer.py).

- forward stages (``old_log_prob``, ``ref``): the batch in its order, cut every
  ``micro_batch_size`` samples; one group (no optimizer step inside the stage);
- ``update_actor``: the batch shuffled with a seeded permutation (seed, version), split
  into ``mini_batches`` mini-batches (one optimizer step each, as verl's
  ``ppo_mini_batch_size``), each cut into micro-batches.

``MicroBatchRecord`` is what the runner records per micro-batch: which devices were
granted, which one ran it, when and for how long, how long it waited for the grant.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jigsaw_plugin.errors import SpecError

__all__ = [
    "DEFAULT_MICRO_BATCH_SIZE",
    "DeviceGrant",
    "GrantRequest",
    "MicroBatch",
    "MicroBatchPlan",
    "MicroBatchRecord",
    "check_devices",
    "check_micro_batch_size",
    "forward_plan",
    "response_mask",
    "stage_devices_grant",
    "trained_tokens",
    "update_plan",
]

# Samples per micro-batch. 4 makes the default update (32 samples, 4 mini-batches of 8)
# two micro-batches per optimizer step, so a width-2 grant has two to run side by side.
DEFAULT_MICRO_BATCH_SIZE = 4


@dataclass(frozen=True)
class MicroBatch:
    """One sub-stage: ``samples`` (indices into the stage's batch), its position ``index``
    in the stage's order, and the mini-batch (optimizer step) it belongs to."""

    index: int
    mini_batch: int
    samples: tuple[int, ...]


@dataclass(frozen=True)
class MicroBatchPlan:
    """A stage's micro-batches in their fixed order, grouped by mini-batch."""

    micro_batch_size: int
    micro_batches: tuple[MicroBatch, ...]

    @property
    def mini_batches(self) -> int:
        return 1 + max((m.mini_batch for m in self.micro_batches), default=-1)

    def groups(self) -> tuple[tuple[MicroBatch, ...], ...]:
        """The micro-batches of each mini-batch, in order (an optimizer step after each)."""
        return tuple(tuple(m for m in self.micro_batches if m.mini_batch == k) for k in range(self.mini_batches))


@dataclass(frozen=True)
class GrantRequest:
    """What the stage asks before its next micro-batch(es): which devices may it use?"""

    pipeline: str
    step: int
    stage: str
    next_micro_batch: int  # index of the first micro-batch the answer will run
    remaining: int  # micro-batches of the stage not yet run
    total: int
    stage_devices: tuple[int, ...]  # what the stage was started on
    current: tuple[int, ...]  # the previous grant (() before the first)


@dataclass(frozen=True)
class MicroBatchRecord:
    """One executed micro-batch. Times are seconds since the stage started."""

    index: int
    mini_batch: int
    samples: int
    granted: tuple[int, ...]  # the devices of the grant it ran under (its width = len)
    device: int  # the device that computed it
    start_s: float
    end_s: float
    waited_s: float  # from asking for devices to being granted them (pauses included)
    pauses: int  # width-0 answers before the grant

    @property
    def width(self) -> int:
        return len(self.granted)

    @property
    def wall_s(self) -> float:
        return self.end_s - self.start_s


def check_micro_batch_size(value, field: str = "micro_batch_size") -> int | None:
    """A positive int, or None (no split: one micro-batch per mini-batch / stage)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < 1:
        raise SpecError(field, value, "a positive integer (samples per micro-batch) or None (no split)")
    return int(value)


def check_devices(value, field: str = "grant") -> tuple[int, ...]:
    """A grant's answer: distinct non-negative device ids; () pauses the stage."""
    allowed = "a tuple of distinct non-negative device ids (ints); () pauses the stage"
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise SpecError(field, value, allowed)
    out = tuple(value)
    if any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or int(d) < 0 for d in out) \
            or len(set(out)) != len(out):
        raise SpecError(field, value, allowed)
    return tuple(int(d) for d in out)


def _cut(samples, size: int | None, mini: int, start: int) -> list[MicroBatch]:
    size = size or len(samples)
    return [MicroBatch(start + j, mini, tuple(int(s) for s in samples[i: i + size]))
            for j, i in enumerate(range(0, len(samples), size))]


def _check_samples(n_samples) -> int:
    if isinstance(n_samples, bool) or not isinstance(n_samples, (int, np.integer)) or int(n_samples) < 1:
        raise SpecError("n_samples", n_samples, "a positive integer (the stage's batch size)")
    return int(n_samples)


def forward_plan(n_samples: int, micro_batch_size: int | None = DEFAULT_MICRO_BATCH_SIZE) -> MicroBatchPlan:
    """The batch in order, cut every ``micro_batch_size`` samples (forward-only stages)."""
    n = _check_samples(n_samples)
    size = check_micro_batch_size(micro_batch_size)
    return MicroBatchPlan(size or n, tuple(_cut(list(range(n)), size, 0, 0)))


def update_plan(n_samples: int, micro_batch_size: int | None = DEFAULT_MICRO_BATCH_SIZE, mini_batches: int = 1,
                seed: int = 0, version: int = 0) -> MicroBatchPlan:
    """``update_actor``'s plan: with more than one mini-batch, the batch shuffled by a
    permutation seeded with ``(seed, version)`` (verl's shuffle=True), split into
    ``mini_batches`` near-equal mini-batches (np.array_split), each cut into micro-batches."""
    n = _check_samples(n_samples)
    size = check_micro_batch_size(micro_batch_size)
    if isinstance(mini_batches, bool) or not isinstance(mini_batches, (int, np.integer)) or mini_batches < 1:
        raise SpecError("mini_batches", mini_batches, "a positive integer (optimizer steps per update)")
    order = np.arange(n)
    if mini_batches > 1:
        order = np.random.default_rng([int(seed), int(version)]).permutation(n)
    out: list[MicroBatch] = []
    for k, mini in enumerate(c for c in np.array_split(order, min(int(mini_batches), n)) if len(c)):
        out += _cut([int(i) for i in mini], size, k, len(out))
    return MicroBatchPlan(size or n, tuple(out))


def response_mask(item) -> list[int]:
    """A sample's response mask: its fourth element (1 = generated, 0 = tool observation),
    all 1 when absent."""
    n = len(item[1])
    if len(item) > 3 and item[3] is not None:
        mask = [1 if m else 0 for m in item[3]]
        if len(mask) != n:
            raise ValueError(f"response mask has {len(mask)} entries for {n} response tokens")
        return mask
    return [1] * n


def trained_tokens(batch, indices) -> int:
    """Response tokens trained on (mask 1) in ``batch[i]`` for ``i`` in ``indices``: the
    token-mean normaliser of a mini-batch's loss."""
    return sum(sum(response_mask(batch[i])) for i in indices)


def stage_devices_grant(request: GrantRequest) -> tuple[int, ...]:
    """The default grant: every micro-batch on the devices the stage was started on."""
    return request.stage_devices


class DeviceGrant:
    """A grant the scheduler side sets: ``grant.set((0, 1))`` grows the stage at its next
    micro-batch boundary, ``grant.set(())`` pauses it there. Pass it as the runner's
    ``grant``; it answers with the devices set last."""

    def __init__(self, devices=()):
        self.devices = check_devices(devices)
        self.asked: list[GrantRequest] = []

    def set(self, devices) -> None:
        self.devices = check_devices(devices)

    def __call__(self, request: GrantRequest) -> tuple[int, ...]:
        self.asked.append(request)
        return self.devices
