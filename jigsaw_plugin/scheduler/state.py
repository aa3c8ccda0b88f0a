"""What a scheduling policy sees: typed, frozen views of what a live system observes.

Each executor (the simulator, the live runtime) builds a ``SchedulerState`` before every
decide round and hands it to ``jigsaw_schedule``; a policy receives nothing else. The views
hold observations only: tokens generated so far, time in flight, loads, KV use, the
history of finished work. A request's final length is not among them: its remaining work
is a *prediction* (``RequestView.predicted_remaining``), answered through the
``jigsaw_predict_remaining`` hook from the pipeline's history (``predict/``).

Request-level views are built lazily (a decide round that never looks at requests does
not pay for them); they are read during the round they were built for.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any, Mapping, NamedTuple

import numpy as np

from jigsaw_plugin.algorithms import waits_for_alongside
from jigsaw_plugin.costmodel.predictor import spans_extra_nodes
from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.ids import RequestId

__all__ = [
    "RequestBatch",
    "RequestView",
    "ReplicaView",
    "LengthSummary",
    "StepView",
    "RunningStageView",
    "PipelineView",
    "DeviceTask",
    "DeviceView",
    "DeviceClassView",
    "PreemptionsSeen",
    "SchedulerState",
]


class RequestView(NamedTuple):
    """One in-flight generation turn, as its engine and router observe it.

    Immutable and typed like the frozen dataclasses here, but a ``NamedTuple``: the state
    build makes hundreds a decide round (a rollout tail's requests, read by the policy),
    and a tuple is built in C (0.2 us against a frozen dataclass's 0.8 us, whose
    ``__init__`` sets each field through ``object.__setattr__``)."""

    id: RequestId  # pipeline, step, sample, turn
    group: int  # GRPO group: samples of one prompt share it
    prompt_key: str | None  # stable across epochs where the host knows the prompt
    context_tokens: int  # prompt + earlier turns + observations: what a move re-prefills
    generated: int  # tokens of this turn generated so far
    max_tokens: int  # this turn's budget as the user configured it (spec max_response_len - used)
    in_flight_s: float  # since this turn was submitted
    replica: int | None
    queued: bool  # waiting for a batch slot (not admitted)
    predicted_remaining: float  # tokens, from the length predictor (never the true figure)

    @property
    def turn(self) -> int:
        return self.id.turn or 0

    @property
    def kv_tokens(self) -> int:
        return self.context_tokens + self.generated


@dataclass(frozen=True)
class RequestBatch:
    """In-flight requests of one pipeline as columns (what ``jigsaw_predict_remaining``
    receives): a predictor works on the arrays; iterating yields ``RequestView``s whose
    ``predicted_remaining`` is not filled in (nan)."""

    ids: tuple[RequestId, ...]
    group: Any  # np.ndarray[int]
    turn: Any  # np.ndarray[int]
    step: Any  # np.ndarray[int]
    generated: Any  # np.ndarray[int]
    max_tokens: Any  # np.ndarray[int]
    context_tokens: Any  # np.ndarray[int]
    in_flight_s: Any  # np.ndarray[float]
    replica: Any  # np.ndarray[int] (-1: none)
    queued: Any  # np.ndarray[bool]
    prompt_key: tuple[str | None, ...]

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> RequestView:
        return self.view(i, float("nan"))

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def view(self, i: int, predicted_remaining: float) -> RequestView:
        rep = int(self.replica[i])
        return RequestView(self.ids[i], int(self.group[i]), self.prompt_key[i], int(self.context_tokens[i]),
                           int(self.generated[i]), int(self.max_tokens[i]), float(self.in_flight_s[i]),
                           None if rep < 0 else rep, bool(self.queued[i]), predicted_remaining)


class _Derived:
    """A ``ReplicaView`` figure derived from its fields, computed on its first read and then
    kept in the view's own dict: a non-data descriptor, so that every later read is a plain
    attribute read (a policy reads ``load`` and ``tp`` hundreds of times a round)."""

    __slots__ = ("fn", "name")

    def __init__(self, fn):
        self.fn = fn

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, view, owner=None):
        if view is None:
            return self
        value = view.__dict__[self.name] = self.fn(view)
        return value


class _KeptPrediction:
    """A ``ReplicaView`` figure (``index`` 0: predicted work, 1: predicted longest
    remaining) read once from ``_work_and_left`` and then kept in the view's own dict, both
    figures at once: a non-data descriptor, so that every later read is a plain attribute
    read (a policy reads these hundreds of times a round; as ``functools.cached_property``
    without its lock)."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __get__(self, view, owner=None):
        if view is None:
            return self
        both = view._work_and_left()
        view.__dict__.update(predicted_work_tokens=both[0], predicted_tokens_left=both[1])
        return both[self.index]


@dataclass(frozen=True)
class ReplicaView:
    """One rollout engine: its load and memory as the engine reports them."""

    id: int
    pipeline: str
    devices: tuple[int, ...]
    running: int  # sequences in the decode batch
    queued: int  # requests waiting for a slot
    kv_tokens: float  # KV cache in use (tokens)
    kv_capacity: float  # KV cache size (tokens)
    max_seqs: int  # its batch limit now (vLLM max_num_seqs, or an AdmissionLimit below it)
    retiring: bool
    step_s: float  # the current decode step time (observed tokens/s of the batch)
    stall_s: float  # prefill or weight load still ahead of decoding
    # the executor's lazy source of its pipeline's requests and their predictions, each
    # method given the replica's id: ``views(id) -> tuple[RequestView]``, ``predicted(id) ->
    # np.ndarray`` (remaining tokens), optionally ``work_and_left(id) -> (sum, max)`` of the
    # latter without building it, ``kv_columns(id)`` and ``observe(ids)`` (one source per
    # pipeline and round, shared by its replicas' views: no object per replica)
    _source: Any = field(repr=False, compare=False, default=None)

    @classmethod
    def build(cls, id, pipeline, devices, running, queued, kv_tokens, kv_capacity, max_seqs, retiring, step_s,
              stall_s, source) -> "ReplicaView":
        """The same view as the constructor, built in one dict update instead of a frozen
        ``__setattr__`` per field (an executor builds every replica's view every round).
        ``tp`` and ``load`` are set here too: a policy reads every view's load each round
        (``_retire_drained``), and a plain entry costs less than the descriptor's first read."""
        v = _new(cls)
        v.__dict__.update(id=id, pipeline=pipeline, devices=devices, running=running, queued=queued,
                          kv_tokens=kv_tokens, kv_capacity=kv_capacity, max_seqs=max_seqs, retiring=retiring,
                          step_s=step_s, stall_s=stall_s, _source=source, tp=len(devices), load=running + queued)
        return v

    #: Its tensor-parallel width (devices).
    tp = _Derived(lambda v: len(v.devices))
    #: Requests it holds, running and queued.
    load = _Derived(lambda v: v.running + v.queued)

    @cached_property
    def requests(self) -> tuple[RequestView, ...]:
        """Its requests, running then queued (built on first use)."""
        return tuple(self._source.views(self.id)) if self._source is not None else ()

    def kv_columns(self) -> tuple[np.ndarray, np.ndarray, int]:
        """Its requests' KV tokens held now (context + generated) and predicted remaining
        tokens, running then queued, as arrays, and how many run: ``requests``' figures
        without a view per request (admission limits read every queued replica's, every
        round: a 72B PPO step's 2,048 requests queued on a few replicas)."""
        src = self._source
        if src is not None and hasattr(src, "kv_columns"):
            return src.kv_columns(self.id)
        views = self.requests
        return (np.fromiter((q.kv_tokens for q in views), float, len(views)),
                np.fromiter((q.predicted_remaining for q in views), float, len(views)),
                sum(1 for q in views if not q.queued))

    @staticmethod
    def read_together(views) -> None:
        """A hint before a policy reads the requests of several replicas (``kv_columns``,
        ``requests``): a source that can read a pipeline's replicas together
        (``observe(ids)``) does so now, one read and one predictor call per pipeline
        instead of one per replica. Where rows are carried from an earlier read, those read
        together are predicted with each other's fresh rows as evidence."""
        by: dict[str, tuple] = {}
        for v in views:
            src = v._source
            if src is not None and hasattr(src, "observe"):
                by.setdefault(v.pipeline, (src, []))[1].append(v.id)
        for src, ids in by.values():
            src.observe(ids)

    def _work_and_left(self) -> tuple[float, float]:
        """(work, longest), asked of the source once (it keeps both as running sums where
        it can) and kept in the view's own dict: not a ``functools.cached_property``, whose
        first read takes a lock in Python 3.11 (a policy reads 800 of them a round at 1024
        GPUs)."""
        got = self.__dict__.get("_work_left")
        if got is None:
            src = self._source
            if src is None:
                got = (0.0, 0.0)
            elif hasattr(src, "work_and_left"):
                got = src.work_and_left(self.id)
            else:
                pred = src.predicted(self.id)
                got = (float(pred.sum()), float(pred.max())) if len(pred) else (0.0, 0.0)
            self.__dict__["_work_left"] = got
        return got

    #: Decode steps until the predicted longest request ends.
    predicted_tokens_left = _KeptPrediction(1)
    #: Predicted tokens still to generate by all of its requests.
    predicted_work_tokens = _KeptPrediction(0)

    def predicted_drain_s(self) -> float:
        """Projected time until it is empty: the longer of its predicted longest request and
        its predicted work at the current batch, at the current step time."""
        running = self.running
        if running + self.queued == 0:
            return 0.0
        work, left = self._work_and_left()
        return self.stall_s + max(left, work / max(1, running)) * self.step_s


@dataclass(frozen=True, slots=True)
class LengthSummary:
    """Means over a pipeline's finished trajectories (before any finished: a prior built
    from the user's ``max_response_len``, marked by ``observed == 0``)."""

    observed: int  # finished trajectories behind the means
    prompt_tokens: float
    generated_tokens: float  # per trajectory, all turns
    context_tokens: float  # prompt + generated + observations
    turns: float
    longest_generated: float  # the longest trajectory seen (prior: the budget)
    tool_s: float = 0.0  # mean latency of the tool calls returned so far (0.0 before any)
    # mean latency of the rewards computed so far, each from its trajectory's last token
    # (0.0 before any was timed)
    reward_s: float = 0.0


@dataclass(frozen=True, slots=True)
class StepView:
    """One started step of a pipeline: progress of its samples and stages."""

    step: int
    samples: int
    gen_done: int  # trajectories whose generation ended
    rewarded: int
    tokens: int  # prompt + generated tokens of the finished trajectories (what training reads)
    gen_start_t: float
    stage_start_t: Mapping[str, float]  # stages started so far
    stage_end_t: Mapping[str, float]  # stages ended so far
    min_version: int  # oldest policy version that generated any of its tokens
    # what early passes may read (RunStage.early): tokens of the trajectories finished so far,
    # and per forward stage the tokens its early passes have read
    finished_tokens: int = 0
    covered: Mapping[str, int] = field(default_factory=dict)
    gen_end_t: float | None = None  # when its last trajectory's generation ended (None: not yet)
    width: int | None = None  # the rollout width its StartGen chose (``StartGen.width``), if one
    keep_width: bool = False  # ... kept through its rollout (``StartGen.keep_width``)


@dataclass(frozen=True, slots=True)
class RunningStageView:
    """A training-side stage running micro-batch by micro-batch (what ``ResizeStage`` acts on)."""

    step: int
    stage: str
    devices: tuple[int, ...]  # what it runs on now
    resize_to: tuple[int, ...] | None  # a ResizeStage not applied yet (at the next boundary)
    micro_batches_left: int  # the one in progress included
    micro_batches: int
    boundary_t: float  # when the micro-batch in progress ends
    resizable: bool  # whether this executor can grow, shrink or pause it
    rest: bool = False  # an early pass asked to go on as the stage's own pass (ResizeStage.rest)


@dataclass(frozen=True)
class PipelineView:
    """One pipeline: where its step is, its versions, and what it has finished before."""

    name: str
    index: int
    spec: Any  # the pipeline's user configuration (workload.PipelineSpec); policies read
    # its scalar settings (mode, staleness, samples_per_step, max_response_len, steps,
    # rollout_tp), never its length distributions, which a live host does not have
    model: Any  # costmodel.ModelProfile
    stages: tuple[str, ...]  # training-side stages in order
    static_devices: tuple[int, ...]
    gen_next: int  # next step whose generation has not started
    train_next: int
    stage_next: int  # index into ``stages`` of train_next's next stage
    stage_running: bool
    version: int
    rollout_version: int
    done: bool
    generating: bool
    pending: int  # requests waiting for a replica
    replicas: tuple[ReplicaView, ...]  # live replicas, retiring ones included
    steps: Mapping[int, StepView]
    history: Any  # predict.LengthHistory (read-only here): finished lengths of earlier work
    lengths: LengthSummary
    # measured durations of finished stages, and under "reward" each step's wait from its
    # last trajectory's generation to its last reward (a sandbox running tests, a reward model)
    stage_history_s: Mapping[str, tuple[float, ...]]
    running_stage_end_t: float | None  # predicted end of the stage running now
    running_stage: RunningStageView | None = None  # its micro-batch progress, where observable
    early_stage: str | None = None  # the stage whose early pass runs now (RunStage.early)
    alongside_stage: str | None = None  # the stage running alongside the sequence (RunStage.alongside)
    alongside_end_t: float | None = None  # its predicted end
    # (width, seconds) of each trained step whose StartGen chose a width, oldest first: from
    # its generation's start to its last stage's end before the weight sync
    step_widths: tuple[tuple[int, float], ...] = ()
    # the executor's lazy source of ``requests_changed`` (``changed() -> bool``)
    _requests: Any = field(repr=False, compare=False, default=None)

    @classmethod
    def build(cls, **values) -> "PipelineView":
        """The same view as the constructor (every field given by name), in one dict
        update instead of a frozen ``__setattr__`` per field."""
        if values.keys() != _PIPELINE_FIELDS:
            raise SpecError("PipelineView.build", sorted(values.keys() ^ _PIPELINE_FIELDS),
                            "every field of PipelineView, by name")
        v = _new(cls)
        v.__dict__.update(values)
        return v

    @property
    def requests_changed(self) -> bool:
        """Its engines' request counts (running, queued; replicas come and go) or its
        finished trajectories changed since its requests were last read (a policy's first
        read of a prediction or a request view of it reads them); True until first read, and
        where the executor does not say. Computed when asked: most rounds no policy asks."""
        src = self._requests
        return True if src is None else src.changed()

    @property
    def total_steps(self) -> int:
        return self.spec.steps

    @property
    def next_stage(self) -> str | None:
        """The next training-side stage, if its batch is ready and nothing runs."""
        if self.done or self.stage_running:
            return None
        s = self.steps.get(self.train_next)
        if s is None or s.rewarded < s.samples:
            return None
        stage = self.stages[self.stage_next]
        return None if waits_for_alongside(stage, self.alongside_stage) else stage

    def load(self) -> int:
        return sum(r.load for r in self.replicas) + self.pending


_new = object.__new__
_PIPELINE_FIELDS = frozenset(f.name for f in fields(PipelineView))


@dataclass(frozen=True, slots=True)
class DeviceTask:
    """What a device is doing: a rollout replica or a training stage."""

    kind: str  # "replica" | "stage"
    pipeline: str
    replica: int | None = None
    stage: str | None = None


@dataclass(frozen=True, slots=True)
class DeviceView:
    id: int
    node: int
    task: DeviceTask | None
    resident: tuple[str, ...]  # pipelines whose rollout weights are resident (LRU order)
    train_resident: str | None  # the pipeline whose training state is resident


@dataclass(frozen=True)
class DeviceClassView:
    """One class of the pool as provisioned (the spec's ``cluster.classes``): a replica on its
    devices is priced with its own cost model, not the first class's."""

    index: int
    name: str
    gpu: str  # profile name
    devices: range  # its device ids (classes are laid out class by class)
    cost: Any  # costmodel.CostModel of its GPU profile (speed and memory)
    price_per_hour: float | None  # per device-hour; None: not given
    preemptible: bool  # spot: may be preempted
    link: Any  # workload.LinkSpec to the trainer site, or None (in the trainer's data centre)
    spec: Any = field(repr=False, compare=False, default=None)  # workload.DeviceClassSpec

    @property
    def memory_gb(self) -> float:
        return self.cost.hw.memory_gb


@dataclass(frozen=True, slots=True)
class PreemptionsSeen:
    """What the pool has seen of one device class's preemptions so far: a live system sees
    a node leave and its replacement join, never when the next one leaves. Rates are
    estimated from this history (``scheduler.estimates.restart_risk``)."""

    cls: int  # index into ``SchedulerState.classes``
    count: int  # devices of the class lost so far
    exposed_s: float  # device-seconds its devices were in the pool so far
    down_s: float  # device-seconds they were down so far (downs still open count up to now)

    @property
    def rate_per_s(self) -> float:
        """Preemptions per device-second in the pool so far (0 before the first)."""
        return self.count / self.exposed_s if self.count and self.exposed_s > 0 else 0.0

    @property
    def mean_down_s(self) -> float:
        """Mean time a lost device stayed down so far (a down still open counts what it
        has been down: an underestimate until its replacement joins)."""
        return self.down_s / self.count if self.count else 0.0


@dataclass(frozen=True)
class SchedulerState:
    """Everything a policy may read in one decide round."""

    t: float
    gpus: int
    gpus_per_node: int  # the largest node's size (the widest tensor-parallel group on one node)
    devices: tuple[DeviceView, ...]
    free: frozenset[int]
    order: tuple[PipelineView, ...]
    cost: Any  # costmodel.CostModel: pure pricing functions
    max_num_seqs: int  # the engines' batch limit (vLLM max_num_seqs)
    memo: Any = None  # what the policy declared at setup (Policy.setup); read-only
    classes: tuple[DeviceClassView, ...] = ()  # the pool's device classes (empty: one class, ``cost``)
    colocation: bool = False  # the executor can run two pipelines' rollout replicas on one device group
    early_passes: bool = False  # the executor can run forward passes over finished trajectories early
    reshard_in_place: bool = False  # a LaunchReplica may take the devices of the replicas it absorbs
    concurrent_stages: bool = False  # a stage may run alongside the next (RunStage.alongside)
    admission_limits: bool = False  # a replica's batch limit may be set (AdmissionLimit, LaunchReplica.max_seqs)
    # node -> its size as provisioned (``DeviceView.node`` numbers the nodes; empty: every
    # node holds ``gpus_per_node``); nodes of a pool's device classes may differ in size
    node_sizes: tuple[int, ...] = ()
    # per class that has lost a device so far (empty: no preemption seen, or an executor
    # without preemptions)
    preemptions: tuple[PreemptionsSeen, ...] = ()

    def node_size(self, node: int) -> int:
        """How many devices node ``node`` holds as provisioned (a whole node is that many)."""
        return self.node_sizes[node] if node < len(self.node_sizes) else max(1, self.gpus_per_node)

    def device_class(self, d: int) -> DeviceClassView | None:
        """The class of device ``d`` (None where the executor reports no classes)."""
        for c in self.classes:
            if d in c.devices:
                return c
        return None

    def cost_of(self, devices) -> Any:
        """The cost model a replica on ``devices`` runs at: their class's (of several, the
        one with the least memory a device, whose KV cache bounds the replica, as the
        simulator's ``DeviceClasses.cost_for``), ``cost`` on a pool of one class."""
        if len(self.classes) <= 1 or not devices:
            return self.cost
        held = [c for c in self.classes if any(d in c.devices for d in devices)]
        return min(held, key=lambda c: c.memory_gb).cost if held else self.cost

    def class_costs(self) -> tuple:
        """Every class's cost model (``cost`` alone on a pool of one class)."""
        return tuple(c.cost for c in self.classes) if len(self.classes) > 1 else (self.cost,)

    def cross_node(self, devices) -> bool:
        """A replica on ``devices`` spans more nodes than its width needs, so its all-reduces
        cross the node NICs (``spans_extra_nodes``; ``CostModel.decode_step_s``'s
        ``cross_node``), as the executor prices its steps: against the size of the nodes
        it is on (a class's own; a tp4 over two nodes of 2 spans no more than it needs).
        Answered once a round per device set: tail pricing asks it of each destination for
        every tail it prices."""
        got = self._cross.get(devices)
        if got is None:
            nodes = self._device_nodes
            got = len(devices) > 1 and spans_extra_nodes(
                devices, max(self.node_size(nodes[d]) for d in devices), nodes)
            self._cross[devices] = got
        return got

    @cached_property
    def _device_nodes(self) -> tuple[int, ...]:
        return tuple(d.node for d in self.devices)

    @cached_property
    def _cross(self) -> dict:
        return {}  # device set -> cross_node's answer, for this round

    @cached_property
    def pipelines(self) -> Mapping[str, PipelineView]:
        return {p.name: p for p in self.order}

    @cached_property
    def replicas(self) -> Mapping[int, ReplicaView]:
        return {r.id: r for p in self.order for r in p.replicas}
