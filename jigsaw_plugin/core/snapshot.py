"""Build the ``SchedulerState`` a policy sees from an executor's bookkeeping.

Both executors go through ``build_state``. What it reads of a replica is the replica's
``observe(t)`` (a ``ReplicaObs``), its requests as columns (``request_columns(t)``, a
``RequestColumns``, where the replica keeps them so: the simulator's; else the
``request_rows(t)`` tuples, turned into columns here) and, where it has one, its
``version`` (changes whenever its requests or their schedule change); the executor's
true lengths never reach it.

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
from dataclasses import dataclass, replace
from itertools import accumulate, chain, compress
from operator import attrgetter

import numpy as np

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.scheduler.state import (
    LengthSummary,
    PipelineView,
    ReplicaView,
    RequestBatch,
    RequestView,
    SchedulerState,
    StepView,
)

__all__ = ["EXACT", "ReplicaObs", "RequestColumns", "RequestRow", "RefreshPolicy", "build_state", "note_finished",
           "prior_summary"]


@dataclass(frozen=True)
class ReplicaObs:
    """What an engine reports about itself."""

    running: int
    queued: int
    kv_tokens: float
    kv_capacity: float
    max_seqs: int
    step_s: float
    stall_s: float

    @classmethod
    def build(cls, running, queued, kv_tokens, kv_capacity, max_seqs, step_s, stall_s) -> "ReplicaObs":
        """The same as the constructor, in one dict update instead of a frozen
        ``__setattr__`` per field (every replica reports every round: 1,024 at 1024 GPUs)."""
        o = _new(cls)
        o.__dict__.update(running=running, queued=queued, kv_tokens=kv_tokens, kv_capacity=kv_capacity,
                          max_seqs=max_seqs, step_s=step_s, stall_s=stall_s)
        return o


_new = object.__new__


@dataclass(frozen=True)
class RefreshPolicy:
    """When a pipeline's cached predictions are asked of the predictor again.

    history_fraction: the pipeline's length history grew by this share of its size (at
        least one record; the built-in predictor refits its model at 1/64).
    progress_fraction: the pipeline's requests decoded this share of the work predicted
        for them at the last call.
    carry_min_rows, carry_drift: a replica of at least ``carry_min_rows`` requests whose
        request set changed keeps its rows (finished ones dropped, running ones advanced
        at its observed step time) until ``carry_drift`` of them changed; its predictions
        then feed its load figures, and its rows are read again before a predictor call
        or when a policy reads its request views.
    exact: ask every round and read every replica's rows (the from-scratch build).
    """

    history_fraction: float = 1 / 64
    progress_fraction: float = 0.125
    carry_min_rows: int = 64
    carry_drift: float = 0.125
    exact: bool = False

    def __post_init__(self) -> None:
        v = self.carry_min_rows
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SpecError("RefreshPolicy.carry_min_rows", v, "an integer >= 1")

        for name in ("history_fraction", "progress_fraction", "carry_drift"):
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
# the ufuncs' reduce: what ndarray.sum / max / min / any / all call (the same values, 1-D
# arrays here), without their Python wrappers (a round's gathers make hundreds of such calls)
_ADD, _MAX, _MIN = np.add.reduce, np.maximum.reduce, np.minimum.reduce
_ANY, _ALL = np.logical_or.reduce, np.logical_and.reduce


_TURN_BITS, _SAMPLE_BITS, _STEP_BITS = 12, 24, 27  # one int64 key per request turn


def _id_keys(ids) -> np.ndarray | None:
    """One int64 per request turn, (step, sample, turn) packed, to match rows by numpy
    (sorting, searching) instead of hashing ``RequestId``s one by one; None where a field
    does not fit its bits (then rows are matched by id)."""
    n = len(ids)
    step = np.fromiter(map(_STEP, ids), np.int64, n)
    sample = np.fromiter(map(_SAMPLE, ids), np.int64, n)
    turn = np.fromiter((t or 0 for t in map(_TURN, ids)), np.int64, n)
    return _pack_keys(step, sample, turn)


def _finished_keys(finished: dict) -> dict:
    """``_id_keys`` of each replica's finished request ids (replica -> ids), computed once
    for all of them and sliced: a round in a rollout tail has requests finished on most
    replicas of a pipeline, and each call's fixed cost was most of its time."""
    reps = [rep for rep, ids in finished.items() if ids]
    if not reps:
        return {}
    keys = _id_keys(list(chain.from_iterable(finished[rep] for rep in reps)))
    if keys is None:  # a field past its bits: each replica's alone (some may fit)
        return {rep: _id_keys(finished[rep]) for rep in reps}
    ends = list(accumulate(len(finished[rep]) for rep in reps))
    starts = [0] + ends[:-1]
    return {rep: keys[a:b] for rep, a, b in zip(reps, starts, ends)}


def _pack_keys(step: np.ndarray, sample: np.ndarray, turn: np.ndarray) -> np.ndarray | None:
    """``_id_keys`` of the columns (step, sample, turn); None where a field does not fit."""
    if len(step) and (_MIN(step) < 0 or _MIN(sample) < 0 or _MIN(turn) < 0 or _MAX(step) >= 1 << _STEP_BITS
                      or _MAX(sample) >= 1 << _SAMPLE_BITS or _MAX(turn) >= 1 << _TURN_BITS):
        return None
    return (step << (_SAMPLE_BITS + _TURN_BITS)) | (sample << _TURN_BITS) | turn


def _positions(keys: np.ndarray, order: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Index in ``keys`` (sorted by ``order``) of each of ``wanted``; -1 where absent."""
    if not len(keys) or not len(wanted):
        return np.full(len(wanted), -1, np.int64)
    ranked = keys[order]
    at = np.minimum(np.searchsorted(ranked, wanted), len(keys) - 1)
    return np.where(ranked[at] == wanted, order[at], -1)


_STEP, _SAMPLE, _TURN = attrgetter("step"), attrgetter("sample"), attrgetter("turn")


def _member(keys: np.ndarray, sorted_unique: np.ndarray) -> np.ndarray:
    """``np.isin(keys, sorted_unique)`` for a sorted, duplicate-free right side (what
    ``_sorted_unique`` returns): one binary search per key, not isin's general machinery, which
    cost tens of microseconds per replica (32 replicas a pipeline at 1024 GPUs)."""
    if not len(sorted_unique):
        return np.zeros(len(keys), bool)
    at = np.searchsorted(sorted_unique, keys)
    np.minimum(at, len(sorted_unique) - 1, out=at)
    return sorted_unique[at] == keys


def _nans(n: int) -> np.ndarray:
    """``np.full(n, nan)`` without its wrapper (several arrays a replica read)."""
    a = np.empty(n)
    a.fill(math.nan)
    return a


def _sorted_unique(a: np.ndarray) -> np.ndarray:
    """``np.unique`` of an int array: sorted, duplicates dropped. Not ``np.unique`` itself,
    whose first plain call imports ``numpy.ma`` (10-40 ms, in whichever decide round came
    first) and which checks for a masked array on every call."""
    a = np.sort(a)
    if len(a) > 1:
        a = a[np.concatenate(([True], a[1:] != a[:-1]))]
    return a


def _nansum(a: np.ndarray) -> float:
    """``np.nansum`` of a float array, consumed in place (the same sum: NaN set to 0, then
    the same pairwise ``np.add.reduce``), without its copy and dispatch."""
    a[np.isnan(a)] = 0.0
    return float(_ADD(a))


@dataclass(frozen=True, slots=True)
class RequestColumns:
    """One replica's observable requests as columns, running first then queued (the order
    of ``request_rows``): what the state build reads of a replica that keeps its requests
    so, instead of a tuple per request. Arrays hold one entry per request; ``step``,
    ``sample`` and ``turn`` are the ids' fields (turn 0 where the id has none)."""

    ids: tuple  # RequestId per request
    group: np.ndarray  # int64: GRPO group within its step
    step: np.ndarray  # int64
    sample: np.ndarray  # int64
    turn: np.ndarray  # int64
    context: np.ndarray  # int64: tokens before this turn's generation
    generated: np.ndarray  # float64: whole tokens of this turn so far
    max_tokens: np.ndarray  # int64: this turn's budget as configured
    in_flight_s: np.ndarray  # float64: since this turn was submitted
    queued: np.ndarray  # bool: waiting for a batch slot
    prompt_key: tuple  # str or None per request

    def __post_init__(self) -> None:
        n = len(self.ids)
        for name in ("group", "step", "sample", "turn", "context", "generated", "max_tokens", "in_flight_s",
                     "queued", "prompt_key"):
            if len(getattr(self, name)) != n:
                raise SpecError(f"RequestColumns.{name}", f"length {len(getattr(self, name))}",
                                f"one entry per request ({n})")

    @classmethod
    def from_rows(cls, rows) -> "RequestColumns":
        """From ``RequestRow`` tuples (an executor that reports its requests one by one)."""
        n = len(rows)
        cols = list(zip(*rows)) if rows else [()] * 8
        ids = tuple(cols[0])
        return cls(ids, np.fromiter(cols[1], np.int64, n), np.fromiter(map(_STEP, ids), np.int64, n),
                   np.fromiter(map(_SAMPLE, ids), np.int64, n),
                   np.fromiter((x or 0 for x in map(_TURN, ids)), np.int64, n), np.fromiter(cols[3], np.int64, n),
                   np.fromiter(cols[4], float, n), np.fromiter(cols[5], np.int64, n),
                   np.fromiter(cols[6], float, n), np.fromiter(cols[7], bool, n), tuple(cols[2]))


def _columns(rep, t: float) -> RequestColumns:
    """``rep``'s requests now, as columns (its own where it keeps them so)."""
    read = getattr(rep, "request_columns", None)
    return read(t) if read is not None else RequestColumns.from_rows(rep.request_rows(t))


def _columns_of(reps: list, t: float) -> tuple[RequestColumns, list] | None:
    """The requests of several replicas now as one set of columns (theirs one after
    another) and each one's row count: the replicas' class's ``request_columns_of`` where
    it has one (the simulator's), else their ``request_rows`` joined and turned into
    columns once (a live engine's); None where they mix kinds (then each is read alone)."""
    kind = type(reps[0])
    if any(type(r) is not kind for r in reps):
        return None
    read = getattr(kind, "request_columns_of", None)
    if read is not None:
        return read(reps, t)
    if getattr(kind, "request_columns", None) is not None:
        return None
    rows: list = []
    sizes = []
    for rep in reps:
        mine = rep.request_rows(t)
        rows += mine
        sizes.append(len(mine))
    return RequestColumns.from_rows(rows), sizes


class _ReplicaRows:
    """One replica's rows as columns (running first), as read at ``t_read`` and carried to
    ``t``, with what the pipeline's last predictor call said of each: ``g0`` tokens so far
    then, ``final`` predicted length (nan: not asked yet).

    Rounds that change nothing touch no array: running rows all decode at one rate, so
    decoding adds to one scalar (``_shift``: tokens per running row not yet added to
    ``_gen``), and the replica's predicted work and longest remaining are kept as sums and
    maxima at a reference point (``_agg``), moved by the tokens decoded since. The arrays
    (``generated``, ``pred``) are brought up to date only when a predictor call, a
    policy's request views or a change of the rows needs them. Scalars: ``unseen`` (a row
    without a prediction), ``decoded`` (tokens generated since the last predictor call)."""

    __slots__ = ("version", "t", "t_read", "kv", "running", "ids", "key", "_order", "prompt_key", "group", "gkey", "turn",
                 "step", "context", "max_tokens", "queued", "running_mask", "_gen", "_shift", "_decoded_run",
                 "in_flight_read", "g0", "final", "final_eff", "_pred", "_agg", "alive", "carried", "drift",
                 "unseen", "fresh", "decoded", "n_decoding", "_index")

    def __init__(self, rep, obs: ReplicaObs, t: float, old: "_ReplicaRows | None"):
        cols = _columns(rep, t)
        n = len(cols.ids)
        self.version = getattr(rep, "version", None)
        self.t = self.t_read = t
        self.kv, self.running = obs.kv_tokens, obs.running
        self.ids = cols.ids
        self.prompt_key = cols.prompt_key
        self.step = cols.step
        self.turn = cols.turn
        self.key = _pack_keys(cols.step, cols.sample, cols.turn)
        self._order = None  # argsort of key, when first searched
        self.group = cols.group
        self.gkey = (self.step << 32) | self.group  # its GRPO group within the pipeline
        self.context = cols.context
        self.max_tokens = cols.max_tokens
        self.queued = cols.queued
        self.running_mask = ~self.queued
        self.n_decoding = int(_ADD(self.running_mask))
        self._gen = cols.generated.astype(float)  # a copy: advanced in place
        self._shift = 0.0  # decoded per running row since ``_gen`` was brought up to date
        self._decoded_run = 0.0  # decoded per running row since read (monotone)
        self.in_flight_read = cols.in_flight_s
        self.g0 = _nans(n)
        self.final = _nans(n)
        self._pred = None  # this round's predicted remaining, when brought up to date
        self._agg = None
        self.alive = None  # all rows (a carried replica marks the finished ones)
        self.carried = False  # carried across a version change (rows not read since)
        self.drift = 0  # requests that finished, arrived or left since the rows were read
        self._index = None
        if old is not None and len(old.ids) and n:
            # what the last predictor call said of the requests this replica still holds
            if self.key is not None and old.key is not None:
                idx = _positions(old.key, old.order(), self.key)
            else:
                where = dict(zip(old.ids, range(len(old.ids))))
                idx = np.fromiter((where.get(i, -1) for i in self.ids), dtype=np.int64, count=n)
            hit = idx >= 0
            self.g0[hit] = old.g0[idx[hit]]
            self.final[hit] = old.final[idx[hit]]
        unasked = np.isnan(self.final)
        self.unseen = bool(_ANY(unasked))
        self.fresh = self.unseen and bool(_ALL(unasked))  # no row asked before
        self.decoded = _nansum(self._gen - self.g0) if n and not self.fresh else 0.0
        self._final_changed()

    def adopt(self, keys: np.ndarray, order: np.ndarray, g0: np.ndarray, final: np.ndarray) -> None:
        """Take the last predictions of requests that moved here from another replica
        (``keys`` of the rows they left, sorted by ``order``; their ``g0`` and ``final``):
        a migrated request keeps its prediction instead of being asked again."""
        want = np.isnan(self.final).nonzero()[0]
        at = _positions(keys, order, self.key[want])
        hit = at >= 0
        if not _ANY(hit):
            return
        want, at = want[hit], at[hit]
        self.g0[want], self.final[want] = g0[at], final[at]
        self.unseen = bool(_ANY(np.isnan(self.final)))
        self.fresh = False
        self.decoded = _nansum(self.generated - self.g0)
        self._final_changed()

    def order(self) -> np.ndarray:
        if self._order is None:
            self._order = self.key.argsort(kind="stable")
        return self._order

    @property
    def generated(self) -> np.ndarray:
        """Tokens so far (fractional: running rows advance by the engine's KV growth)."""
        if self._shift:
            np.add(self._gen, self._shift, out=self._gen, where=self.running_mask)
            self._shift = 0.0
        return self._gen

    def _final_changed(self) -> None:
        # a row predicted to run to its budget cannot outlive its prediction
        self.final_eff = np.where(self.final >= self.max_tokens, np.inf, self.final)
        if self.alive is not None:
            self.final_eff[~self.alive] = np.inf
        self._pred, self._agg = None, None

    def predicted_now(self, pred: np.ndarray) -> None:
        """The predictor answered for these rows as they are now."""
        self.g0 = self.generated.copy()
        self.final = self.g0 + pred
        self.unseen, self.fresh, self.decoded = False, False, 0.0
        self._final_changed()
        self._pred = pred

    def predicted_rows(self, rows: np.ndarray, pred: np.ndarray) -> None:
        """The predictor answered for the rows ``rows`` (a mask) as they are now."""
        g = self.generated
        now = g[rows]
        self.g0[rows] = now
        self.final[rows] = now + pred
        final = self.final if self.alive is None else self.final[self.alive]
        self.unseen = bool(_ANY(np.isnan(final)))
        self.fresh = False
        self.decoded = _nansum(g - self.g0)
        self._final_changed()

    def unseen_groups(self) -> np.ndarray:
        """Group keys of its live rows the predictor has not seen."""
        rows = np.isnan(self.final)
        if self.alive is not None:
            rows &= self.alive
        return self.gkey[rows]

    def _decode(self, d: float, t: float) -> None:
        if d > 0 and self.n_decoding:
            self._shift += d
            self._decoded_run += d
            self.decoded += d * self.n_decoding
            self._pred = None
        self.t = t

    def advance(self, obs: ReplicaObs, t: float) -> None:
        """Same requests, same schedule, later: running ones decoded ``d`` more tokens each
        (the engine's KV use grew by ``d`` per running sequence)."""
        if t == self.t:
            return
        d = (obs.kv_tokens - self.kv) / self.running if self.running > 0 else 0.0
        if d > 0 and self.n_decoding:  # ``_decode``, inline: 1,000 replicas a round at 1024 GPUs
            self._shift += d
            self._decoded_run += d
            self.decoded += d * self.n_decoding
            self._pred = None
        self.t = t
        self.kv = obs.kv_tokens

    def carry(self, obs: ReplicaObs, t: float, version, gone: np.ndarray, policy: "RefreshPolicy") -> bool:
        """The replica's requests changed (``version``) but few did: keep the rows without
        reading them, drop the ones that finished (the executor reports each), advance the
        running ones at the engine's observed step time. False: read them again (small
        replica, or more than ``policy.carry_drift`` of its rows changed since read).
        ``gone``: its rows that finished (``rows_of``)."""
        n = len(self.ids)
        if n < policy.carry_min_rows or t < self.t:
            return False
        if len(gone):
            if self.alive is None:
                self.alive = np.ones(n, dtype=bool)
            gone = gone[self.alive[gone]]
        if len(gone):
            self.generated  # noqa: B018 - bring running rows up to date before the mask changes
            self.alive[gone] = False
            self.running_mask[gone] = False
            self.final_eff[gone] = np.inf
            self.n_decoding = int(_ADD(self.running_mask))
            self.drift += len(gone)
            self._pred, self._agg = None, None
        live = n if self.alive is None else int(_ADD(self.alive))
        if self.drift + abs(obs.running + obs.queued - live) > policy.carry_drift * n:
            return False
        self._decode((t - self.t) / obs.step_s if obs.step_s > 0 else 0.0, t)
        self.kv, self.running, self.version, self.carried = obs.kv_tokens, obs.running, version, True
        return True

    def rows_of(self, finished: list, keys: np.ndarray | None) -> np.ndarray:
        """Row indices of the request ids ``finished`` (``keys``: their ``_id_keys``) it holds."""
        if not finished or not len(self.ids):
            return np.zeros(0, np.int64)
        if self.key is not None and keys is not None:
            at = _positions(self.key, self.order(), keys)
            return at[at >= 0]
        if self._index is None:
            self._index = dict(zip(self.ids, range(len(self.ids))))
        index = self._index
        return np.asarray([index[i] for i in finished if i in index], np.int64)

    def whole_generated(self) -> np.ndarray:
        """Tokens so far as the engine counts them (whole tokens)."""
        return np.floor(self.generated + 1e-9)

    def in_flight_s(self) -> np.ndarray:
        return self.in_flight_read + (self.t - self.t_read)

    def _aggregate(self) -> tuple:
        """(decoded per running row then, queued work, longest queued, running work,
        longest running, least slack of a running row to its predicted final, running
        rows, least slack of a queued row), from the arrays as they are now."""
        g = self.generated
        pred = self.pred
        alive = self.alive
        run = self.running_mask
        waiting = self.queued if alive is None else self.queued & alive
        q, r = pred[waiting], pred[run]
        slack = self.final_eff - g  # one subtraction, then each side's rows (the same values)
        nq, nr = len(q), len(r)
        # the ufuncs' reduce: what ndarray.sum / max / min call, without their Python wrappers
        # (this runs for every replica whose rows or predictions changed, many a round)
        return (self._decoded_run, float(_ADD(q)), float(_MAX(q)) if nq else 0.0, float(_ADD(r)),
                float(_MAX(r)) if nr else 0.0, float(_MIN(slack[run])) if nr else math.inf, nr,
                float(_MIN(slack[waiting])) if nq else math.inf)

    def _slack(self) -> tuple[float, tuple]:
        """(least slack of a running row to its predicted final now, the aggregates)."""
        if self._agg is None:
            self._agg = self._aggregate()
        agg = self._agg
        return agg[5] - (self._decoded_run - agg[0]), agg

    def aggregate(self) -> None:
        """Compute its aggregates now where they are not kept (read, carried or predicted
        since): a replica that only advanced keeps them (1,024 a round at 1024 GPUs)."""
        if self._agg is None:
            self._agg = self._aggregate()

    def outlived(self) -> bool:
        """A row generated past its predicted final length with budget left."""
        if not len(self.ids):
            return False
        slack, agg = self._slack()
        return min(slack, agg[7]) <= 0.0

    def outlived_and_work(self) -> tuple[bool, float | None]:
        """(``outlived()``, its predicted work as ``work_and_left`` gives it where that needs
        no ``pred``, else None) from one look at the aggregates: the staleness check asks
        both of every replica of a pipeline (32 a pipeline at 1024 GPUs, every round)."""
        agg = self._agg  # ``_slack``, inline: every replica of a gathered pipeline, every round
        if agg is None:
            agg = self._agg = self._aggregate()
        slack = agg[5] - (self._decoded_run - agg[0])
        if min(slack, agg[7]) <= 0.0:
            return True, None
        if agg[6] and slack < 1.0:
            return False, None  # within a token of its final: ``work_and_left_of``
        return False, agg[1] + agg[3] - agg[6] * (self._decoded_run - agg[0])

    def work_and_left(self) -> tuple[float, float] | None:
        """(predicted tokens still to generate, predicted longest remaining): the sums and
        maxima of ``pred`` without building it, while every running row is at least a
        token short of its predicted final (where the clip at one token cannot bind);
        None when one is not (then ``work_and_left_of``)."""
        if not len(self.ids):
            return 0.0, 0.0
        slack, agg = self._slack()
        if agg[6] and slack < 1.0:
            return None  # read ``pred`` (see ``work_and_left_of``)
        moved = self._decoded_run - agg[0]
        return agg[1] + agg[3] - agg[6] * moved, max(agg[2], agg[4] - moved if agg[6] else 0.0)

    def work_and_left_of(self) -> tuple[float, float]:
        """``work_and_left`` from the ``pred`` array (a row within a token of its final)."""
        pred = self.pred
        return float(_ADD(pred)), float(_MAX(pred))

    @property
    def pred(self) -> np.ndarray:
        """Predicted remaining from the cached final length, less what has been generated
        since (at least one token while the budget lasts, as the predictor's own answers;
        none for a carried row that finished). ``final`` never exceeds the budget."""
        if self._pred is None:
            g = self.generated
            pred = np.subtract(self.final, g)
            np.maximum(pred, np.minimum(1.0, self.max_tokens - g), out=pred)
            if self.alive is not None:
                pred[~self.alive] = 0.0
            self._pred = pred
        return self._pred

    def kv_columns(self) -> tuple[np.ndarray, np.ndarray, int]:
        """``views``' KV tokens held (context + whole tokens generated), predicted remaining
        tokens and running count, as arrays, without a view per request."""
        return (np.add(self.context, self.whole_generated(), dtype=float), np.array(self.pred, dtype=float),
                int(_ADD(~self.queued)))

    def views(self, replica: int) -> tuple:
        return tuple(map(RequestView, self.ids, self.group.tolist(), self.prompt_key, self.context.tolist(),
                         self.whole_generated().astype(np.int64).tolist(), self.max_tokens.tolist(),
                         self.in_flight_s().tolist(), (replica,) * len(self.ids), self.queued.tolist(),
                         self.pred.tolist()))


def _read_many(reps: list, obs: list, olds: list, t: float) -> list:
    """``_ReplicaRows(rep, o, t, old)`` of each of ``reps`` (with its report ``o`` and its
    last rows ``old``), read together: the replicas' requests as one set of columns
    (``_columns_of``) and the keys, the last predictions of the requests each replica
    still holds, and the masks computed once over all of them, each replica's rows
    then slices of those. The same rows as reading them one by one (tested): a step
    boundary reads every replica of a pipeline, and per replica the fixed cost of some
    30 numpy calls (about 25 us, 60-100 us under a shared machine's load) was most of it."""
    if len(reps) < 2:
        return [_ReplicaRows(rep, o, t, old) for rep, o, old in zip(reps, obs, olds)]
    got = _columns_of(reps, t)
    key = None if got is None else _pack_keys(got[0].step, got[0].sample, got[0].turn)
    if key is None or any(old is not None and old.key is None and len(old.ids) for old in olds):
        # mixed kinds of replica, or an id field past its bits: each keyed on its own
        return [_ReplicaRows(rep, o, t, old) for rep, o, old in zip(reps, obs, olds)]
    cols, sizes = got
    n_all = len(cols.ids)
    ends = list(accumulate(sizes))
    starts = [0] + ends[:-1]
    g0 = _nans(n_all)
    final = _nans(n_all)
    mine = [(j, old) for j, old in enumerate(olds) if old is not None and len(old.ids) and sizes[j]]
    if mine:
        # the last predictions of the requests a replica still holds, from its own rows
        # only: keys ranked over the old and new rows, then (rank, replica) searched
        n_rep = len(reps)
        old_key = np.concatenate([old.key for _, old in mine])
        both = np.concatenate((old_key, key))
        order = both.argsort(kind="stable")
        ranked = both[order]
        rank = np.empty(len(both), np.int64)
        rank[order] = np.cumsum(np.concatenate(([False], ranked[1:] != ranked[:-1])))
        tag = np.concatenate((np.asarray([j for j, _ in mine], np.int64).repeat([len(old.ids) for _, old in mine]),
                              np.arange(n_rep, dtype=np.int64).repeat(sizes)))
        comb = rank * n_rep + tag
        m = len(old_key)
        old_comb = comb[:m]
        idx = _positions(old_comb, old_comb.argsort(kind="stable"), comb[m:])
        hit = (idx >= 0).nonzero()[0]
        if len(hit):
            at = idx[hit]
            g0[hit] = np.concatenate([old.g0 for _, old in mine])[at]
            final[hit] = np.concatenate([old.final for _, old in mine])[at]
    gen = cols.generated.astype(float)  # a copy: advanced in place
    nan_count = np.concatenate(([0], np.cumsum(np.isnan(final))))
    queued = cols.queued
    running_mask = ~queued
    run_count = np.concatenate(([0], np.cumsum(running_mask)))
    unseen_n = (nan_count[ends] - nan_count[starts]).tolist()
    decoding_n = (run_count[ends] - run_count[starts]).tolist()
    diff = gen - g0
    diff[np.isnan(diff)] = 0.0  # each replica's slice summed as _nansum sums its own
    final_eff = np.where(final >= cols.max_tokens, np.inf, final)
    gkey = (cols.step << 32) | cols.group
    ids, prompt_key = cols.ids, cols.prompt_key
    out = []
    new = _ReplicaRows.__new__
    for rep, o, a, b, unseen, decoding in zip(reps, obs, starts, ends, unseen_n, decoding_n):
        r = new(_ReplicaRows)
        r.version = getattr(rep, "version", None)
        r.t = r.t_read = t
        r.kv, r.running = o.kv_tokens, o.running
        r.ids, r.prompt_key = ids[a:b], prompt_key[a:b]
        r.step, r.turn, r.key, r.group, r.gkey = cols.step[a:b], cols.turn[a:b], key[a:b], cols.group[a:b], gkey[a:b]
        r.context, r.max_tokens, r.queued = cols.context[a:b], cols.max_tokens[a:b], queued[a:b]
        r.running_mask, r.n_decoding = running_mask[a:b], decoding
        r._gen, r._shift, r._decoded_run = gen[a:b], 0.0, 0.0
        r.in_flight_read = cols.in_flight_s[a:b]
        r.g0, r.final, r.final_eff = g0[a:b], final[a:b], final_eff[a:b]
        r._order = r._pred = r._agg = r.alive = r._index = None
        r.carried, r.drift = False, 0
        r.unseen = unseen > 0
        r.fresh = r.unseen and unseen == b - a
        r.decoded = float(_ADD(diff[a:b])) if b > a and not r.fresh else 0.0
        out.append(r)
    return out


def _batch(parts: list, replica_ids: list, rows: list | None = None) -> RequestBatch:
    """The pipeline's rows as one ``RequestBatch`` (what the predictor reads); ``rows``:
    a mask per part (those rows only). Each column is joined over the parts first and
    then worked on once (tokens so far, time in flight, the masks), not part by part:
    the same values, a few numpy calls per column instead of a few per replica."""
    cat = np.concatenate
    sizes = [len(r.ids) for r in parts]
    generated = np.floor(cat([r.generated for r in parts]) + 1e-9).astype(np.int64)  # whole tokens
    in_flight = cat([r.in_flight_read for r in parts]) + np.array([r.t - r.t_read for r in parts]).repeat(sizes)
    columns = [cat([r.group for r in parts]), cat([r.turn for r in parts]), cat([r.step for r in parts]), generated,
               cat([r.max_tokens for r in parts]), cat([r.context for r in parts]), in_flight,
               np.asarray(replica_ids, np.int64).repeat(sizes), cat([r.queued for r in parts])]
    if rows is None:
        ids = tuple(chain.from_iterable(r.ids for r in parts))
        keys = tuple(chain.from_iterable(r.prompt_key for r in parts))
    else:
        ids = tuple(chain.from_iterable(compress(r.ids, m) for r, m in zip(parts, rows)))
        keys = tuple(chain.from_iterable(compress(r.prompt_key, m) for r, m in zip(parts, rows)))
        pick = cat(rows)
        columns = [c[pick] for c in columns]
    group, turn, step, generated, max_tokens, context, in_flight, replica, queued = columns
    return RequestBatch(ids=ids, group=group, turn=turn, step=step, generated=generated, max_tokens=max_tokens,
                        context_tokens=context, in_flight_s=in_flight, replica=replica, queued=queued,
                        prompt_key=keys)


def _adopt_moved(before: dict, rows: dict) -> None:
    """Requests the predictor has not seen on their replica that it saw on another (a
    migration) keep that prediction: looked up in the rows of replicas that were read
    again or are gone (``before``: the last gather's rows, ``rows``: this one's)."""
    new = [r for r in rows.values() if r.unseen and r.key is not None]
    if not new:
        return
    left = [r for i, r in before.items()
            if rows.get(i) is not r and len(r.ids) and r.key is not None and not r.fresh]
    if not left:
        return
    keys = np.concatenate([r.key for r in left])
    g0 = np.concatenate([r.g0 for r in left])
    final = np.concatenate([r.final for r in left])
    asked = ~np.isnan(final)
    keys, g0, final = keys[asked], g0[asked], final[asked]
    order = keys.argsort(kind="stable")
    for r in new:
        r.adopt(keys, order, g0, final)


class _PipelineCache:
    """What one pipeline's predictions were last built from, and its length summary (held
    by the executor across rounds, in ``ExecutorCore.request_cache``)."""

    def __init__(self):
        self.rows: dict[int, _ReplicaRows] = {}  # replica -> its rows
        self.history_count = -1
        self.work0 = 0.0  # predicted remaining tokens at the last call
        self.finished: dict = {}  # replica (None: not said) -> request ids finished since the last gather
        self.n_finished = 0
        self.changed_groups: list = []  # group keys with a request finished since last asked
        self.rows_total = 0  # rows held at the last gather
        self.lengths: tuple | None = None  # (observed lengths, their count, the summary made of them)
        self.counts: tuple | None = None  # its engines' (replica, running, queued) and its history count when last gathered


def note_finished(caches: dict, pipeline: str, request_id, replica: int | None = None) -> None:
    """The executor's report that a request's turn ended on ``replica`` (None: not said;
    then every replica's rows are searched for it): carried rows drop it, and its GRPO
    group is asked again with the pipeline's next predictor call."""
    entry = caches.get(pipeline)
    if entry is None or not entry[2].rows:
        return  # nothing carried to drop it from
    cache = entry[2]
    cache.finished.setdefault(replica, []).append(request_id)
    cache.n_finished += 1
    if cache.n_finished > cache.rows_total:  # not read for long: read again, keep memory flat
        cache.rows, cache.finished, cache.n_finished, cache.changed_groups = {}, {}, 0, []


class _PipelineRequests:
    """One pipeline's in-flight requests for one round, gathered and predicted together the
    first time a policy reads any of them (see the module docstring)."""

    def __init__(self, ex, p, t: float, cache: _PipelineCache, refresh: RefreshPolicy):
        self._ex, self._p, self._t, self._cache, self._refresh = ex, p, t, cache, refresh
        self._rows: dict[int, _ReplicaRows] | None = None
        self._obs: dict[int, ReplicaObs] = {}

    def observed(self, obs: dict) -> None:
        """This round's reports of the pipeline's replicas (replica -> ``ReplicaObs``)."""
        self._obs = obs

    def _counts(self) -> tuple:
        """What its engines report of its requests, and its finished trajectories."""
        return tuple((i, o.running, o.queued) for i, o in self._obs.items()), self._p.history.count

    def changed(self) -> bool:
        """``PipelineView.requests_changed``: its counts now differ from those its requests
        were last read at (a gather keeps them)."""
        return self._counts() != self._cache.counts

    def _step_s(self) -> dict[int, float]:
        """Replica -> its decode step time (what the predictions are scored in), read only
        for a predictor call, not every round."""
        return {i: o.step_s for i, o in self._obs.items()}

    def _gather(self) -> None:
        t0 = self._ex.clock()
        p, t, cache, refresh = self._p, self._t, self._cache, self._refresh
        rows: dict[int, _ReplicaRows] = {}
        finished, cache.finished, cache.n_finished = cache.finished, {}, 0
        keys = _finished_keys(finished)
        unplaced = finished.pop(None, [])  # finished on a replica the executor did not say
        unplaced_keys = keys.get(None)
        reads: list = []  # (replica, its report, its last rows): read together below
        for rep in p.replicas:
            obs = self._obs.get(rep.id) or rep.observe(t)
            r = cache.rows.get(rep.id)
            gone = ()
            if r is not None:
                mine = finished.get(rep.id)
                if mine:
                    gone = r.rows_of(mine, keys[rep.id])
                if unplaced:
                    more = r.rows_of(unplaced, unplaced_keys)
                    gone = np.concatenate((gone, more)) if len(gone) else more
            if len(gone):  # their siblings' evidence changed: asked again with the next call
                cache.changed_groups.append(r.gkey[gone])
            version = getattr(rep, "version", None)
            if refresh.exact or r is None or version is None or t < r.t:
                reads.append((rep, obs, r))
            elif r.version == version:
                r.advance(obs, t)
            elif not r.carry(obs, t, version, gone, refresh):
                reads.append((rep, obs, r))
            rows[rep.id] = r  # a replica read below keeps its place in the pipeline's order
        if reads:
            olds = [None] * len(reads) if refresh.exact else [r for _, _, r in reads]
            for (rep, _, _), r in zip(reads, _read_many([x for x, _, _ in reads], [o for _, o, _ in reads], olds, t)):
                rows[rep.id] = r
        if not refresh.exact:
            _adopt_moved(cache.rows, rows)
        cache.rows = self._rows = rows
        cache.counts = self._counts()
        parts = [r for r in rows.values() if len(r.ids)]
        cache.rows_total = sum(len(r.ids) for r in parts)
        if parts:
            due, unseen = (True, False) if refresh.exact else self._stale(p, cache, parts)
            if due or all(r.fresh for r in parts):  # stale, or nothing asked yet (a new step)
                self._predict_all()
            elif unseen:
                self._predict_groups()
            for r in self._rows.values():
                if len(r.ids):
                    r.aggregate()  # here rather than at the policy's first read
        self._ex.note_state_build((self._ex.clock() - t0) * 1e6)

    def _predict_all(self) -> None:
        """One predictor call for the whole pipeline: every live row, carried rows as they
        were carried (within ``carry_drift`` of a read)."""
        p, cache = self._p, self._cache
        ids = [i for i, r in self._rows.items() if len(r.ids)]
        parts = [self._rows[i] for i in ids]
        if not parts:
            return
        if all(r.alive is None for r in parts):
            pred = self._ex.predict_remaining(p, _batch(parts, ids), self._step_s())
            at = 0
            for r in parts:
                k = len(r.ids)
                r.predicted_now(pred[at:at + k])
                at += k
        else:
            rows = [np.ones(len(r.ids), bool) if r.alive is None else r.alive.copy() for r in parts]
            pred = self._ex.predict_remaining(p, _batch(parts, ids, rows), self._step_s())
            at = 0
            for r, m in zip(parts, rows):
                k = int(_ADD(m))
                r.predicted_rows(m, pred[at:at + k])
                at += k
        cache.changed_groups = []
        cache.history_count = p.history.count
        cache.work0 = float(_ADD(pred))

    def _predict_groups(self) -> None:
        """One predictor call for the GRPO groups holding a request it has not seen (a new
        turn, a migrated request) or one that finished since they were asked, with their
        live siblings on every replica (the evidence of each other), rows as they are: the
        rest keep their predictions."""
        ids = [i for i, r in self._rows.items() if len(r.ids)]
        parts = [self._rows[i] for i in ids]
        cache = self._cache
        dirty = _sorted_unique(np.concatenate([r.unseen_groups() for r in parts if r.unseen] + cache.changed_groups))
        cache.changed_groups = []
        # the rows to ask, over all replicas at once (one search, one count per replica),
        # then each replica's share as a view of the one mask
        sizes = [len(r.ids) for r in parts]
        member = _member(np.concatenate([r.gkey for r in parts]), dirty)
        if any(r.alive is not None for r in parts):
            member &= np.concatenate([np.ones(n, bool) if r.alive is None else r.alive for r, n in zip(parts, sizes)])
        starts = list(accumulate([0] + sizes[:-1]))
        counts = np.add.reduceat(member, starts, dtype=np.int64).tolist()
        picked = [(i, r, member[a:a + n], k) for i, r, a, n, k in zip(ids, parts, starts, sizes, counts)
                  if k or r.unseen]
        asked = [(i, r, m) for i, r, m, k in picked if k]
        if not asked:
            for _, r, rows, _ in picked:
                r.predicted_rows(rows, _EMPTY)
            return
        pred = self._ex.predict_remaining(self._p, _batch([r for _, r, _ in asked], [i for i, _, _ in asked],
                                                          [m for _, _, m in asked]), self._step_s())
        at = 0
        for _, r, rows, k in picked:
            r.predicted_rows(rows, pred[at:at + k])
            at += k
        if at == sum(len(r.ids) if r.alive is None else int(_ADD(r.alive)) for r in parts):
            # every live row asked: as a whole-pipeline call (a new step)
            self._cache.history_count = self._p.history.count
            self._cache.work0 = float(_ADD(pred))

    def _stale(self, p, cache: _PipelineCache, parts: list) -> tuple[bool, bool]:
        """(due: the whole pipeline is asked again, by an outlived row, progress or
        history, see ``RefreshPolicy``; unseen: a request the predictor has not seen,
        whose groups alone are asked)."""
        unseen = any(r.unseen for r in parts)
        count = p.history.count
        if count >= cache.history_count + max(1, int(cache.history_count * self._refresh.history_fraction)):
            return True, unseen
        # decoded since asked against the work predicted now: a rollout tail, whose work
        # shrank since the last whole-pipeline call, is asked again as often as its size says
        decoded = sum(r.decoded for r in parts)
        share = self._refresh.progress_fraction
        if decoded > share * max(cache.work0, 1.0):
            # due by progress against the larger figure, so against the smaller too: the
            # replicas' aggregates (an outlived row, the work now) need not be computed
            # for an answer that is already known (they are, after the call)
            return True, unseen
        # rows not yet asked have nothing to outlive; an outlived row makes it due, else the
        # work predicted now (its rows' predicted tokens still to generate, summed in the
        # replicas' order) decides
        work = []
        for r in parts:
            if not r.unseen:
                outlived, w = r.outlived_and_work()
                if outlived:
                    return True, unseen
                work.append((r, w))
        total = 0.0
        for r, w in work:
            total += w if w is not None else r.work_and_left_of()[0]
        return decoded > share * max(min(cache.work0, total), 1.0), unseen

    def _replica_rows(self, replica: int) -> "_ReplicaRows | None":
        if self._rows is None:
            self._gather()
        r = self._rows.get(replica)
        return r if r is not None and len(r.ids) else None

    def predicted(self, replica: int) -> np.ndarray:
        r = self._replica_rows(replica)
        if r is None:
            return _EMPTY
        t0 = self._ex.clock()
        out = r.pred
        self._ex.note_state_build((self._ex.clock() - t0) * 1e6)
        return out

    def work_and_left(self, replica: int) -> tuple[float, float]:
        rows = self._rows  # ``_replica_rows``, inline: a policy reads 800 a round at 1024 GPUs
        if rows is None:
            self._gather()
            rows = self._rows
        r = rows.get(replica)
        if r is None or not len(r.ids):
            return 0.0, 0.0
        out = r.work_and_left()  # a few float operations: counted with the policy's time
        if out is None:
            t0 = self._ex.clock()
            out = r.work_and_left_of()
            self._ex.note_state_build((self._ex.clock() - t0) * 1e6)
        return out

    def views(self, replica: int) -> tuple:
        return self._observed(replica, lambda r: r.views(replica), ())

    def kv_columns(self, replica: int) -> tuple[np.ndarray, np.ndarray, int]:
        return self._observed(replica, _ReplicaRows.kv_columns, (_EMPTY, _EMPTY, 0))

    def observe(self, replicas) -> None:
        """Read again, together, the carried rows of ``replicas`` (ids) that a policy is
        about to read as observations (``_observed``), and ask the predictor once for the
        requests it has not seen among them: one ``_read_many`` and one predictor call
        per pipeline, not one of each per replica (admission limits read every queued
        replica's columns each round)."""
        if self._rows is None:
            self._gather()
        t0 = self._ex.clock()
        want = set(replicas)
        stale = [(rep, r) for rep in self._p.replicas
                 if rep.id in want and (r := self._rows.get(rep.id)) is not None and len(r.ids) and r.carried]
        if stale:
            reps = [rep for rep, _ in stale]
            obs = [self._obs.get(rep.id) or rep.observe(self._t) for rep in reps]
            read = _read_many(reps, obs, [r for _, r in stale], self._t)
            for rep, r in zip(reps, read):
                self._rows[rep.id] = self._cache.rows[rep.id] = r
            if any(r.unseen for r in read):
                self._predict_groups()  # requests the predictor has not seen
        self._ex.note_state_build((self._ex.clock() - t0) * 1e6)

    def _observed(self, replica: int, read, empty):
        """``read(rows)`` of the replica's rows as observed now (views are observations: a
        carried row is read again first), or ``empty`` where it holds no request."""
        if self._rows is None:
            self._gather()
        r = self._rows.get(replica)
        if r is None or not len(r.ids):
            return empty
        if r.carried:
            self.observe((replica,))
            r = self._rows[replica]
        t0 = self._ex.clock()
        out = read(r)
        self._ex.note_state_build((self._ex.clock() - t0) * 1e6)
        return out


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


def _lengths(p, cache: "_PipelineCache") -> LengthSummary:
    """The pipeline's ``LengthSummary``; the one ``cache`` holds while no trajectory has
    finished, no tool call returned and no reward was computed since it was made (the means
    change only then)."""
    o = p.observed
    kept = cache.lengths
    seen = (o.count, o.tools, o.rewards)
    if kept is not None and kept[0] is o and kept[1] == seen:
        return kept[2]
    if not o.count:
        summary = replace(prior_summary(p.spec), tool_s=o.tool_mean_s(), reward_s=o.reward_mean_s())
    else:
        summary = LengthSummary(o.count, o.mean("prompt", 0), o.mean("generated", 0), o.mean("context", 0),
                                o.mean("turns", 1), float(o.longest), o.tool_mean_s(), o.reward_mean_s())
    cache.lengths = (o, seen, summary)
    return summary


def _step_view(s) -> StepView:
    return StepView(
        step=s.step, samples=s.n, gen_done=s.n_gen_done, rewarded=s.n_rewarded,
        tokens=s.tokens if s.gen_end_t is not None else 0,
        gen_start_t=s.gen_start_t or 0.0,
        stage_start_t={k: a for k, (a, _) in s.stage_t.items()},
        stage_end_t={k: b for k, (_, b) in s.stage_t.items() if b is not None and k in s.stages_done},
        min_version=s.min_version if s.min_version is not None else 0,
        finished_tokens=s.finished_tokens, covered=dict(s.covered) if s.covered else {},
        gen_end_t=s.gen_end_t, width=s.width, keep_width=s.keep_width,
    )


def _pipeline_view(ex, p, t: float, refresh: RefreshPolicy, caches: dict) -> PipelineView:
    reqs = _requests_of(ex, p, t, refresh, caches)
    obs: dict = {}
    replicas = []
    name, new, view = p.name, _new, ReplicaView
    # ``ReplicaView.build``, inlined: every replica reports every round (1,024 at 1024 GPUs),
    # and its view shares the pipeline's source (the view's id picks its rows)
    for rep in p.replicas:
        o = obs[rep.id] = rep.observe(t)
        v = new(view)
        running, queued, devices = o.running, o.queued, rep.devices
        v.__dict__.update(id=rep.id, pipeline=name, devices=devices, running=running, queued=queued,
                          kv_tokens=o.kv_tokens, kv_capacity=o.kv_capacity, max_seqs=o.max_seqs,
                          retiring=rep.retiring, step_s=o.step_s, stall_s=o.stall_s, _source=reqs,
                          tp=len(devices), load=running + queued)
        replicas.append(v)
    reqs.observed(obs)
    running_end = None
    if p.stage_running and not p.done:
        running_end = ex.running_stage_end_t(p)
    return PipelineView.build(
        name=p.name, index=p.index, spec=p.spec, model=p.model, stages=p.stages,
        static_devices=p.static_devices, gen_next=p.gen_next, train_next=p.train_next,
        stage_next=p.stage_next, stage_running=p.stage_running, version=p.version,
        rollout_version=p.rollout_version, done=p.done, generating=p.generating, pending=len(p.pending),
        replicas=tuple(replicas), steps={k: _step_view(s) for k, s in p.steps.items() if k >= p.train_next},
        history=p.history, lengths=_lengths(p, caches[p.name][2]),
        stage_history_s={k: tuple(v) for k, v in p.stage_history.items()},
        running_stage_end_t=running_end,
        running_stage=ex.running_stage_view(p) if running_end is not None else None,
        early_stage=p.early, alongside_stage=p.alongside,
        alongside_end_t=ex.alongside_end_t(p) if p.alongside is not None else None,
        step_widths=tuple(p.step_widths), _requests=reqs,
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
        t=t, gpus=ex.gpus, gpus_per_node=ex.largest_node, node_sizes=ex.node_sizes, devices=ex.device_views(),
        free=frozenset(ex.free), order=tuple(_pipeline_view(ex, p, t, refresh, caches) for p in ex.order),
        cost=ex.cost, max_num_seqs=ex.cost.f.max_num_seqs, memo=memo,
        classes=ex.device_classes.views() if getattr(ex, "device_classes", None) is not None else (),
        early_passes=ex.supports_early_passes, colocation=ex.supports_colocation,
        reshard_in_place=ex.supports_reshard_in_place, concurrent_stages=ex.supports_concurrent_stages,
        admission_limits=ex.supports_admission_limits, preemptions=ex.preemptions_seen(),
    )
