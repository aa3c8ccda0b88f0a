"""Decisions: what a policy may ask of the simulator or the Ray runtime.

A policy returns a list of these; the executor (``sim.World`` or ``runtime.Coordinator``)
validates and carries them out, and refuses one that breaks an invariant (a device already
busy, a step started before its weights exist, a sample staler than the bound), or that
names no pipeline of the run or a device outside the pool (``PolicyViolation``). A
malformed decision is refused when built (``SpecError`` naming the field): devices that
are not distinct device ids (held as a tuple of ints), requests to migrate that are not
request ids (held as trajectory id strings).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.ids import RequestId

__all__ = [
    "StartGen",
    "LaunchReplica",
    "RetireReplica",
    "Migrate",
    "RunStage",
    "ResizeStage",
    "AdmissionLimit",
    "Decision",
]


@dataclass(frozen=True, slots=True)
class StartGen:
    """Release step ``step``'s prompts of ``pipeline`` for generation.

    ``width``: the rollout width a policy chose for this step from the times of the
    pipeline's earlier steps (jigsaw's ``width_trials``), recorded on the step for the
    policy's later rounds (``StepView.width``) and, once the step is trained, beside its
    time (``PipelineView.step_widths``): what a policy learns from its own steps lives in
    the state, not in the policy. The executor launches nothing by it. ``keep_width``: the
    step keeps that width through its rollout (a trial), whatever later rounds project."""

    pipeline: str
    step: int
    width: int | None = None
    keep_width: bool = False

    def __post_init__(self):
        w = self.width
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
            raise SpecError("StartGen.width", w, "a rollout width (an integer >= 1) or None")
        if not isinstance(self.keep_width, bool):
            raise SpecError("StartGen.keep_width", self.keep_width, "true or false")
        if self.keep_width and w is None:
            raise SpecError("StartGen.keep_width", self.keep_width, "false unless width is set")


@dataclass(frozen=True, slots=True)
class LaunchReplica:
    """Start a rollout replica of ``pipeline`` on ``devices`` (len == rollout tp).

    ``rebalance``: take over requests still queued (not admitted, so nothing to recompute)
    at the pipeline's most loaded replicas until the new replica holds the average load,
    then those still queued at any replica (ones an engine preempted), up to that load.
    ``spread``: as ``rebalance``, and running requests too where the queued ones do not
    reach the average: each resumes here with the tokens it has (abort + resume, a
    re-prefill), the fewest generated first (the cheapest to re-prefill): how a crowded
    rollout spreads onto devices no one else wants.
    ``absorb``: replica ids whose requests all migrate to the new replica (abort + resume),
    after which they are retired: how a rollout tail is re-sharded onto a wider replica.
    ``colocate_with``: the id of another pipeline's rollout replica whose devices (exactly
    ``devices``) the new replica shares (docs/colocation.md); the KV room the two weights
    leave is split once, at launch: ``kv_share`` of it to the new replica, the rest to the
    host. Only executors that declare co-location (``SchedulerState.colocation``) take it.
    ``max_seqs``: the replica's batch limit from its start (vLLM's ``max_num_seqs``, at most
    the engine's configured one; None: that one), as ``AdmissionLimit`` sets it later. Only
    executors that declare admission limits (``SchedulerState.admission_limits``) take it.
    """

    pipeline: str
    devices: tuple
    rebalance: bool = False
    absorb: tuple = ()
    colocate_with: int | None = None
    kv_share: float = 0.0
    spread: bool = False
    max_seqs: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "devices", _devices("LaunchReplica.devices", self.devices, empty=False))
        _check_max_seqs("LaunchReplica.max_seqs", self.max_seqs)
        if not isinstance(self.spread, bool):
            raise SpecError("LaunchReplica.spread", self.spread, "true or false")
        if self.spread and (self.absorb or self.colocate_with is not None):
            raise SpecError("LaunchReplica.spread", self.spread,
                            "false when the replica absorbs replicas or is co-located (it takes their requests)")
        if self.colocate_with is None:
            if self.kv_share != 0.0:
                raise SpecError("LaunchReplica.kv_share", self.kv_share, "0.0 unless colocate_with is set")
            return
        if isinstance(self.colocate_with, bool) or not isinstance(self.colocate_with, int):
            raise SpecError("LaunchReplica.colocate_with", self.colocate_with, "a replica id (int) or None")
        share = self.kv_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 < share < 1.0:
            raise SpecError("LaunchReplica.kv_share", share,
                            "a fraction strictly between 0 and 1 of the KV room the two replicas share")


@dataclass(frozen=True, slots=True)
class RetireReplica:
    """Stop routing to ``replica``; its devices are freed once it is empty."""

    replica: int


@dataclass(frozen=True, slots=True)
class Migrate:
    """Move requests from ``src`` to ``dst`` by abort + resume with the generated prefix.

    ``requests``: the trajectories to move, or empty for all of ``src``'s. Each is a
    ``RequestId`` (of a turn or of its trajectory: a trajectory has one turn in flight) or
    a trajectory id string ``"<pipeline>/<step>/<sample>"``; they are held as trajectory id
    strings, what every executor matches a request's trajectory against (a ``RequestId``
    given as such used to match nothing, and the move did nothing).
    """

    src: int
    dst: int
    requests: tuple = ()

    def __post_init__(self):
        wanted = self.requests
        if not isinstance(wanted, (tuple, list)):
            raise SpecError("Migrate.requests", wanted,
                            "a tuple of request ids (RequestId or '<pipeline>/<step>/<sample>'), or () for all")
        out = []
        for r in wanted:
            if isinstance(r, RequestId):
                out.append(str(r.trajectory))
            elif isinstance(r, str) and r:
                out.append(r)
            else:
                raise SpecError("Migrate.requests", r, "a RequestId or a trajectory id '<pipeline>/<step>/<sample>'")
        object.__setattr__(self, "requests", tuple(out))


@dataclass(frozen=True, slots=True)
class RunStage:
    """Run a training-side stage of ``pipeline``'s step ``step`` as a gang on ``devices``.

    ``colocated`` tells a weight sync that the rollout replicas share the trainer's devices
    (resharded in place) rather than receiving a broadcast.

    ``early``: a forward pass (log-prob, reference, values) over the trajectories of step
    ``step`` that have finished so far, while the rest still generate (an early pass; the
    stage's own pass later reads only what no early pass covered), reading at most
    ``tokens`` of them (0: all). Only for executors whose state says ``early_passes``
    (docs/simulator.md, "Early forward passes").

    ``alongside``: run the stage on its own gang while the pipeline's next stage runs on
    another (``algorithms.ALONGSIDE``: the log-prob pass beside the reference pass, the
    critic's update beside the actor's, as OpenRLHF runs them); the stages after the pair
    wait for both. Only for executors whose state
    says ``concurrent_stages``.
    """

    pipeline: str
    step: int
    stage: str
    devices: tuple
    colocated: bool = True
    early: bool = False
    tokens: int = 0
    alongside: bool = False

    def __post_init__(self):
        object.__setattr__(self, "devices", _devices("RunStage.devices", self.devices, empty=True))
        if not isinstance(self.alongside, bool):
            raise SpecError("RunStage.alongside", self.alongside, "true or false")
        if self.alongside and self.early:
            raise SpecError("RunStage.alongside", self.alongside, "false for an early pass (RunStage.early)")


@dataclass(frozen=True, slots=True)
class ResizeStage:
    """Grow, shrink or pause a running training stage at its next micro-batch boundary.

    A training stage runs as a sequence of micro-batch sub-stages; from the next boundary
    on it runs on ``devices`` (an empty tuple pauses it until another ``ResizeStage`` gives
    it devices). Devices it gains are claimed now and join at the boundary; devices it
    loses are freed at the boundary, so an owner gets a lent device back within one
    micro-batch. Gradients accumulate across micro-batches, so the update does not
    depend on the widths (the reference trainer tests this on real tensors).

    ``rest``: the running stage is an early pass (``RunStage.early``) of a step whose batch
    is complete, and the stage's own pass is next: from its next boundary the pass goes on
    as the stage's own pass, reading every token no early pass has read, on ``devices``;
    its fixed cost is paid once, and no new gang waits for it to end (the micro-batches it
    ran count as read). Only for executors whose state says ``early_passes``.
    """

    pipeline: str
    step: int
    stage: str
    devices: tuple
    rest: bool = False

    def __post_init__(self):
        object.__setattr__(self, "devices", _devices("ResizeStage.devices", self.devices, empty=True))
        if not isinstance(self.rest, bool):
            raise SpecError("ResizeStage.rest", self.rest, "true or false")


@dataclass(frozen=True, slots=True)
class AdmissionLimit:
    """From now on ``replica`` admits a waiting request only while it runs fewer than
    ``max_seqs`` sequences (None: the engine's configured ``max_num_seqs`` again).

    A lower limit preempts nothing: the replica stops admitting until enough of its running
    sequences end. Why: an engine admits whatever its KV cache holds *now*; sequences that
    then grow past the cache are preempted and recomputed from scratch (vLLM), which at long
    contexts costs a large share of the rollout. A policy that predicts how long the running
    sequences will grow can hold new ones back instead (docs/simulator.md, "Admission
    limits"). A live host carries it out at its request router (it holds requests back
    rather than sending them to the engine). Only executors that declare admission limits
    (``SchedulerState.admission_limits``) take it.
    """

    replica: int
    max_seqs: int | None

    def __post_init__(self):
        if isinstance(self.replica, bool) or not isinstance(self.replica, int):
            raise SpecError("AdmissionLimit.replica", self.replica, "a replica id (int)")
        _check_max_seqs("AdmissionLimit.max_seqs", self.max_seqs)


def _devices(name: str, value, empty: bool) -> tuple:
    """``value`` as a tuple of device ids: a tuple, list or range of non-negative integers
    (numpy's too), each at most once, and at least one unless ``empty``."""
    allowed = "a tuple of device ids (integers >= 0), each at most once" + ("" if empty else ", at least one")
    if not isinstance(value, (tuple, list, range)):
        raise SpecError(name, value, allowed)
    out = []
    for x in value:
        if isinstance(x, bool):
            raise SpecError(name, value, allowed)
        try:
            x = operator.index(x)
        except TypeError:
            raise SpecError(name, value, allowed) from None
        if x < 0:
            raise SpecError(name, value, allowed)
        out.append(x)
    if len(set(out)) != len(out) or not (out or empty):
        raise SpecError(name, value, allowed)
    return tuple(out)


def _check_max_seqs(name: str, v) -> None:
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
        raise SpecError(name, v, "an integer >= 1, or None for the engine's configured max_num_seqs")


Decision = StartGen | LaunchReplica | RetireReplica | Migrate | RunStage | ResizeStage | AdmissionLimit
