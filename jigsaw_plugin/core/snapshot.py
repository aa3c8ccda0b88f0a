"""Build the ``SchedulerState`` a policy sees from an executor's bookkeeping.

Both executors go through ``build_state``. What it reads of a replica is the replica's
``observe(t)`` (a ``ReplicaObs``) and ``request_rows(t)`` (observable per-request rows);
the executor's true lengths never reach it. Remaining work is predicted through
``jigsaw_predict_remaining``, once per pipeline and round (reused across rounds while
nothing it reads has changed), and only when a policy first reads a prediction or a
request view of that pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jigsaw_plugin.scheduler.state import (
    DeviceView,
    LengthSummary,
    PipelineView,
    ReplicaView,
    RequestBatch,
    SchedulerState,
    StepView,
)

__all__ = ["ReplicaObs", "RequestRow", "build_state", "prior_summary"]


@dataclass(frozen=True, slots=True)
class ReplicaObs:
    """What an engine reports about itself."""

    running: int
    queued: int
    kv_tokens: float
    kv_capacity: float
    max_seqs: int
    step_s: float
    stall_s: float


# One observable request row: (RequestId, group, prompt_key, context_tokens, generated,
# max_tokens, in_flight_s, queued). A plain tuple: built for thousands of requests a round.
RequestRow = tuple

_EMPTY = np.zeros(0)


def _batch(rows: list, replicas: list) -> RequestBatch:
    cols = list(zip(*rows)) if rows else [()] * 8
    n = len(rows)
    return RequestBatch(
        ids=tuple(cols[0]),
        group=np.fromiter(cols[1], dtype=np.int64, count=n),
        turn=np.fromiter((i.turn or 0 for i in cols[0]), dtype=np.int64, count=n),
        step=np.fromiter((i.step for i in cols[0]), dtype=np.int64, count=n),
        generated=np.fromiter(cols[4], dtype=np.int64, count=n),
        max_tokens=np.fromiter(cols[5], dtype=np.int64, count=n),
        context_tokens=np.fromiter(cols[3], dtype=np.int64, count=n),
        in_flight_s=np.fromiter(cols[6], dtype=float, count=n),
        replica=np.fromiter(replicas, dtype=np.int64, count=n),
        queued=np.fromiter(cols[7], dtype=bool, count=n),
        prompt_key=tuple(cols[2]),
    )


class _PipelineRequests:
    """One pipeline's in-flight requests for one round, gathered and predicted together (one
    ``jigsaw_predict_remaining`` call) the first time a policy reads any of them."""

    def __init__(self, ex, p, t: float):
        self._ex, self._p, self._t = ex, p, t
        self._batch = self._pred = None
        self._slices: dict[int, slice] = {}
        self._step_s: dict[int, float] = {}

    def step_s(self, replica: int, step_s: float) -> None:
        self._step_s[replica] = step_s

    def _gather(self) -> None:
        rows, reps = [], []
        for rep in self._p.replicas:
            start = len(rows)
            rows.extend(rep.request_rows(self._t))
            self._slices[rep.id] = slice(start, len(rows))
            reps.extend([rep.id] * (len(rows) - start))
        self._batch = _batch(rows, reps)
        self._pred = self._ex.predict_remaining(self._p, self._batch, self._step_s)

    def predicted(self, replica: int) -> np.ndarray:
        if self._batch is None:
            self._gather()
        sl = self._slices.get(replica)
        return self._pred[sl] if sl is not None else _EMPTY

    def views(self, replica: int) -> tuple:
        if self._batch is None:
            self._gather()
        sl = self._slices.get(replica)
        if sl is None:
            return ()
        return tuple(self._batch.view(i, float(self._pred[i])) for i in range(sl.start, sl.stop))


class _ReplicaSource:
    __slots__ = ("_reqs", "_id")

    def __init__(self, reqs: _PipelineRequests, replica: int):
        self._reqs, self._id = reqs, replica

    def predicted(self) -> np.ndarray:
        return self._reqs.predicted(self._id)

    def views(self) -> tuple:
        return self._reqs.views(self._id)


def _requests_of(ex, p, t: float) -> _PipelineRequests:
    """This round's gatherer for ``p``; reused while nothing the prediction reads has changed
    (same time, same replicas at the same version, same history): the rounds of one
    decide-and-apply loop, or pipelines a decision did not touch."""
    versions = tuple((rep.id, getattr(rep, "version", None)) for rep in p.replicas)
    key = (t, versions, p.history.count)
    cached = ex.request_cache.get(p.name)
    if cached is not None and cached[0] == key and None not in (v for _, v in versions):
        return cached[1]
    reqs = _PipelineRequests(ex, p, t)
    ex.request_cache[p.name] = (key, reqs)
    return reqs


def prior_summary(spec) -> LengthSummary:
    """Before anything finished: a quarter of the response budget, one turn (a prior, not
    the workload's distribution, which a live host does not have)."""
    gen = spec.max_response_len / 4
    return LengthSummary(0, 0.0, gen, gen, 1.0, float(spec.max_response_len))


def _lengths(p) -> LengthSummary:
    o = p.observed
    if not o.count:
        return prior_summary(p.spec)
    return LengthSummary(o.count, o.mean("prompt", 0), o.mean("generated", 0), o.mean("context", 0),
                         o.mean("turns", 1), float(o.longest))


def _step_view(s) -> StepView:
    return StepView(
        step=s.step, samples=s.n, gen_done=s.n_gen_done, rewarded=s.n_rewarded,
        tokens=s.tokens if s.gen_end_t is not None else 0,
        gen_start_t=s.gen_start_t or 0.0,
        stage_start_t={k: a for k, (a, _) in s.stage_t.items()},
        stage_end_t={k: b for k, (_, b) in s.stage_t.items() if b is not None and k in s.stages_done},
        min_version=s.min_version if s.min_version is not None else 0,
    )


def _pipeline_view(ex, p, t: float) -> PipelineView:
    reqs = _requests_of(ex, p, t)
    replicas = []
    for rep in p.replicas:
        o = rep.observe(t)
        reqs.step_s(rep.id, o.step_s)
        replicas.append(ReplicaView(rep.id, p.name, rep.devices, o.running, o.queued, o.kv_tokens, o.kv_capacity,
                                    o.max_seqs, rep.retiring, o.step_s, o.stall_s, _ReplicaSource(reqs, rep.id)))
    running_end = None
    if p.stage_running and not p.done:
        running_end = ex.running_stage_end_t(p)
    return PipelineView(
        name=p.name, index=p.index, spec=p.spec, model=p.model, stages=p.stages,
        static_devices=p.static_devices, gen_next=p.gen_next, train_next=p.train_next,
        stage_next=p.stage_next, stage_running=p.stage_running, version=p.version,
        rollout_version=p.rollout_version, done=p.done, generating=p.generating, pending=len(p.pending),
        replicas=tuple(replicas), steps={k: _step_view(s) for k, s in p.steps.items() if k >= p.train_next},
        history=p.history, lengths=_lengths(p),
        stage_history_s={k: tuple(v) for k, v in p.stage_history.items()},
        running_stage_end_t=running_end,
        running_stage=ex.running_stage_view(p) if running_end is not None else None,
    )


def build_state(ex, memo=None) -> SchedulerState:
    """The state of executor ``ex`` now (``ex`` is an ``ExecutorCore``)."""
    t = ex.t
    return SchedulerState(
        t=t, gpus=ex.gpus, gpus_per_node=ex.gpus_per_node, devices=ex.device_views(),
        free=frozenset(ex.free), order=tuple(_pipeline_view(ex, p, t) for p in ex.order),
        cost=ex.cost, max_num_seqs=ex.cost.f.max_num_seqs, memo=memo,
    )
