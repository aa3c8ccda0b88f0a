"""Build the ``SchedulerState`` a policy sees from an executor's bookkeeping.

Both executors go through ``build_state``. What it reads of a replica is the replica's
``observe(t)`` (a ``ReplicaObs``), ``request_rows(t)`` (observable per-request rows) and,
where it has one, its ``version`` (changes whenever its requests or their schedule
change); the executor's true lengths never reach it.

Remaining work is predicted through ``jigsaw_predict_remaining``, only when a policy first
reads a prediction or a request view of a pipeline, and incrementally (docs/predictor.md,
"Incremental predictions"):

* rows: a replica whose ``version`` has not changed since its rows were last read keeps
  them; its running requests advanced by the decode steps since, which the replica's own
  report gives (``kv_tokens`` grows by one token per running sequence per step), so only
  replicas whose request set changed are read again;
* predictions: each request keeps its predicted *final* length ``F`` (tokens so far plus
  the predicted remaining when last asked); its remaining is ``F - generated``, clipped to
  its budget, until the pipeline's predictions are stale (``RefreshPolicy``): a request
  the predictor has not seen, a history grown by a share, the pipeline's decoding having
  consumed a share of its predicted work, or a request that outlived its prediction. Then
  the whole pipeline is predicted again in one call (its GRPO siblings are evidence of
  each other, so a subset would not give the same answer).

``RefreshPolicy(exact=True)`` reads every row and asks the predictor every round: the
from-scratch build the incremental one is tested against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.scheduler.state import (
    DeviceView,
    LengthSummary,
    PipelineView,
    ReplicaView,
    RequestBatch,
    RequestView,
    SchedulerState,
    StepView,
)

__all__ = ["EXACT", "ReplicaObs", "RequestRow", "RefreshPolicy", "build_state", "prior_summary"]


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


@dataclass(frozen=True)
class RefreshPolicy:
    """When a pipeline's cached predictions are asked of the predictor again.

    history_fraction: the pipeline's length history grew by this share of its size (at
        least one record; the built-in predictor refits its model at 1/64).
    progress_fraction: the pipeline's requests decoded this share of the work predicted
        for them at the last call.
    exact: ask every round and read every replica's rows (the from-scratch build).
    """

    history_fraction: float = 1 / 64
    progress_fraction: float = 0.125
    exact: bool = False

    def __post_init__(self) -> None:
        for name in ("history_fraction", "progress_fraction"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v <= 1:
                raise SpecError(f"RefreshPolicy.{name}", v, "a number in [0, 1]")
        if not isinstance(self.exact, bool):
            raise SpecError("RefreshPolicy.exact", self.exact, "true or false")


EXACT = RefreshPolicy(exact=True)

# One observable request row: (RequestId, group, prompt_key, context_tokens, generated,
# max_tokens, in_flight_s, queued). A plain tuple: built for thousands of requests a round.
RequestRow = tuple

_EMPTY = np.zeros(0)


class _ReplicaRows:
    """One replica's rows as columns (running first), as of ``t``, with what the pipeline's
    last predictor call said of each: ``g0`` tokens so far then, ``final`` predicted length
    (nan: not asked yet), and this round's predicted remaining ``pred``."""

    __slots__ = ("version", "t", "kv", "running", "ids", "prompt_key", "group", "turn", "step", "context",
                 "max_tokens", "queued", "generated", "in_flight_s", "g0", "final", "pred")

    def __init__(self, rep, obs: ReplicaObs, t: float, old: "_ReplicaRows | None"):
        rows = rep.request_rows(t)
        n = len(rows)
        cols = list(zip(*rows)) if rows else [()] * 8
        self.version = getattr(rep, "version", None)
        self.t, self.kv, self.running = t, obs.kv_tokens, obs.running
        self.ids = cols[0]
        self.prompt_key = cols[2]
        self.group = np.fromiter(cols[1], dtype=np.int64, count=n)
        self.turn = np.fromiter((i.turn or 0 for i in cols[0]), dtype=np.int64, count=n)
        self.step = np.fromiter((i.step for i in cols[0]), dtype=np.int64, count=n)
        self.context = np.fromiter(cols[3], dtype=np.int64, count=n)
        self.max_tokens = np.fromiter(cols[5], dtype=np.int64, count=n)
        self.queued = np.fromiter(cols[7], dtype=bool, count=n)
        self.generated = np.fromiter(cols[4], dtype=float, count=n)
        self.in_flight_s = np.fromiter(cols[6], dtype=float, count=n)
        self.g0 = np.full(n, math.nan)
        self.final = np.full(n, math.nan)
        self.pred = _EMPTY
        if old is not None and len(old.ids) and n:
            # what the last predictor call said of the requests this replica still holds
            where = dict(zip(old.ids, range(len(old.ids))))
            idx = np.fromiter((where.get(i, -1) for i in self.ids), dtype=np.int64, count=n)
            hit = idx >= 0
            self.g0[hit] = old.g0[idx[hit]]
            self.final[hit] = old.final[idx[hit]]

    def advance(self, obs: ReplicaObs, t: float) -> None:
        """Same requests, same schedule, later: running ones decoded ``d`` more tokens each
        (the engine's KV use grew by ``d`` per running sequence); every one waited longer."""
        if t == self.t:
            return
        if self.running > 0:
            d = (obs.kv_tokens - self.kv) / self.running
            if d > 0:
                self.generated[~self.queued] += d
        self.in_flight_s += t - self.t
        self.t, self.kv = t, obs.kv_tokens

    def whole_generated(self) -> np.ndarray:
        """Tokens so far as the engine counts them (whole tokens)."""
        return np.floor(self.generated + 1e-9)

    def views(self, replica: int) -> tuple:
        return tuple(map(RequestView, self.ids, self.group.tolist(), self.prompt_key, self.context.tolist(),
                         self.whole_generated().astype(np.int64).tolist(), self.max_tokens.tolist(),
                         self.in_flight_s.tolist(), (replica,) * len(self.ids), self.queued.tolist(),
                         self.pred.tolist()))


def _batch(parts: list, replica_ids: list) -> RequestBatch:
    """The pipeline's rows as one ``RequestBatch`` (what the predictor reads)."""
    cat = np.concatenate
    sizes = [len(r.ids) for r in parts]
    return RequestBatch(
        ids=tuple(i for r in parts for i in r.ids),
        group=cat([r.group for r in parts]), turn=cat([r.turn for r in parts]), step=cat([r.step for r in parts]),
        generated=cat([r.whole_generated() for r in parts]).astype(np.int64),
        max_tokens=cat([r.max_tokens for r in parts]), context_tokens=cat([r.context for r in parts]),
        in_flight_s=cat([r.in_flight_s for r in parts]), replica=np.repeat(np.asarray(replica_ids, np.int64), sizes),
        queued=cat([r.queued for r in parts]), prompt_key=tuple(k for r in parts for k in r.prompt_key),
    )


class _PipelineCache:
    """What one pipeline's predictions were last built from (held by the executor across
    rounds, in ``ExecutorCore.request_cache``)."""

    def __init__(self):
        self.rows: dict[int, _ReplicaRows] = {}  # replica -> its rows
        self.history_count = -1
        self.work0 = 0.0  # predicted remaining tokens at the last call


class _PipelineRequests:
    """One pipeline's in-flight requests for one round, gathered and predicted together the
    first time a policy reads any of them (see the module docstring)."""

    def __init__(self, ex, p, t: float, cache: _PipelineCache, refresh: RefreshPolicy):
        self._ex, self._p, self._t, self._cache, self._refresh = ex, p, t, cache, refresh
        self._rows: dict[int, _ReplicaRows] | None = None
        self._step_s: dict[int, float] = {}
        self._obs: dict[int, ReplicaObs] = {}

    def observed(self, replica: int, obs: ReplicaObs) -> None:
        self._obs[replica] = obs
        self._step_s[replica] = obs.step_s

    def _gather(self) -> None:
        t0 = self._ex.clock()
        ex, p, t, cache, refresh = self._ex, self._p, self._t, self._cache, self._refresh
        rows: dict[int, _ReplicaRows] = {}
        for rep in p.replicas:
            obs = self._obs.get(rep.id) or rep.observe(t)
            r = cache.rows.get(rep.id)
            version = getattr(rep, "version", None)
            if refresh.exact or r is None or version is None or r.version != version or t < r.t:
                r = _ReplicaRows(rep, obs, t, None if refresh.exact else r)
            else:
                r.advance(obs, t)
            rows[rep.id] = r
        cache.rows = self._rows = rows
        parts = [r for r in rows.values() if len(r.ids)]
        if parts and (refresh.exact or self._stale(p, cache, parts)):
            batch = _batch(parts, [i for i, r in rows.items() if len(r.ids)])
            pred = ex.predict_remaining(p, batch, self._step_s)
            cache.history_count = p.history.count
            cache.work0 = float(pred.sum())
            at = 0
            for r in parts:
                k = len(r.ids)
                r.pred = pred[at:at + k]
                r.g0 = r.whole_generated()
                r.final = r.g0 + r.pred
                at += k
        else:
            for r in parts:
                # the cached final length, less what has been generated since (at least one
                # token while the budget lasts, as the predictor's own answers)
                g = r.whole_generated()
                budget = np.maximum(r.max_tokens - g, 0.0)
                pred = np.maximum(r.final - g, np.minimum(1.0, budget))
                r.pred = np.minimum(pred, budget, out=pred)
        ex.note_state_build((self._ex.clock() - t0) * 1e6)

    def _stale(self, p, cache: _PipelineCache, parts: list) -> bool:
        decoded = 0.0
        for r in parts:
            if np.isnan(r.final).any():
                return True  # a request the predictor has not seen
            g = r.whole_generated()
            if ((g >= r.final) & (g < r.max_tokens)).any():
                return True  # outlived its prediction with budget left
            decoded += float((g - r.g0).sum())
        if decoded > self._refresh.progress_fraction * max(cache.work0, 1.0):
            return True
        count = p.history.count
        return count >= cache.history_count + max(1, int(cache.history_count * self._refresh.history_fraction))

    def predicted(self, replica: int) -> np.ndarray:
        if self._rows is None:
            self._gather()
        r = self._rows.get(replica)
        return r.pred if r is not None and len(r.ids) else _EMPTY

    def views(self, replica: int) -> tuple:
        if self._rows is None:
            self._gather()
        r = self._rows.get(replica)
        if r is None or not len(r.ids):
            return ()
        t0 = self._ex.clock()
        out = r.views(replica)
        self._ex.note_state_build((self._ex.clock() - t0) * 1e6)
        return out


class _ReplicaSource:
    __slots__ = ("_reqs", "_id")

    def __init__(self, reqs: _PipelineRequests, replica: int):
        self._reqs, self._id = reqs, replica

    def predicted(self) -> np.ndarray:
        return self._reqs.predicted(self._id)

    def views(self) -> tuple:
        return self._reqs.views(self._id)


def _requests_of(ex, p, t: float, refresh: RefreshPolicy, caches: dict) -> _PipelineRequests:
    """This round's gatherer for ``p``; the same one while nothing it reads has changed
    (same time, same replicas at the same version, same history): the rounds of one
    decide-and-apply loop, or pipelines a decision did not touch."""
    versions = tuple((rep.id, getattr(rep, "version", None)) for rep in p.replicas)
    key = (t, versions, p.history.count)
    cached = caches.get(p.name)
    if cached is None or not isinstance(cached[2], _PipelineCache):
        cached = (None, None, _PipelineCache())
    elif cached[0] == key and not refresh.exact and None not in (v for _, v in versions):
        return cached[1]
    reqs = _PipelineRequests(ex, p, t, cached[2], refresh)
    caches[p.name] = (key, reqs, cached[2])
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


def _pipeline_view(ex, p, t: float, refresh: RefreshPolicy, caches: dict) -> PipelineView:
    reqs = _requests_of(ex, p, t, refresh, caches)
    replicas = []
    for rep in p.replicas:
        o = rep.observe(t)
        reqs.observed(rep.id, o)
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
    )


def build_state(ex, memo=None, refresh: RefreshPolicy | None = None, caches: dict | None = None) -> SchedulerState:
    """The state of executor ``ex`` now (``ex`` is an ``ExecutorCore``). ``refresh``: when
    predictions are asked again (default: the executor's ``prediction_refresh``);
    ``caches``: pipeline -> what its predictions were built from (default: the executor's
    ``request_cache``; ``{}`` with ``EXACT``: a from-scratch build that leaves it alone)."""
    refresh = refresh or getattr(ex, "prediction_refresh", None) or RefreshPolicy()
    caches = ex.request_cache if caches is None else caches
    t = ex.t
    return SchedulerState(
        t=t, gpus=ex.gpus, gpus_per_node=ex.gpus_per_node, devices=ex.device_views(),
        free=frozenset(ex.free), order=tuple(_pipeline_view(ex, p, t, refresh, caches) for p in ex.order),
        cost=ex.cost, max_num_seqs=ex.cost.f.max_num_seqs, memo=memo,
    )
