"""A rollout replica in the simulator: vLLM's continuous batching on the cost model's clock.

All running sequences of a replica advance one token per decode step, so the replica keeps
one progress counter ``p`` (tokens decoded per running sequence since it started) and each
running request finishes when ``p`` reaches its ``finish_p``. Between events the step time
is held constant (recomputed at every event and at most every ``SEGMENT_STEPS`` steps, so
the KV growth within a segment is priced). The KV cache is a hard limit: admission needs
room for the request's context, and when growth fills the cache the most recently admitted
request is preempted and later recomputed, as vLLM does.
"""

from __future__ import annotations

import heapq
import struct
from collections import deque
from operator import attrgetter

import numpy as np

from jigsaw_plugin.core.snapshot import ReplicaObs, RequestColumns
from jigsaw_plugin.costmodel import CostModel, ModelProfile
from jigsaw_plugin.costmodel.predictor import cuda_graph_batch
from jigsaw_plugin.costmodel.colocation import colocated_step_s
from jigsaw_plugin.ids import RequestId

__all__ = ["Request", "Replica", "SEGMENT_STEPS"]

SEGMENT_STEPS = 256
_PACK_FIXED = struct.Struct("=6q").pack  # six int64s in the machine's order (numpy's int64)
_EPS = 1e-6


class Request:
    """One generation turn of one sample (a rollout request as vLLM sees it)."""

    __slots__ = (
        "pipeline", "step", "sample", "turn", "rid", "id", "group", "budget", "context", "target", "done",
        "cached", "version", "replica", "held", "admit_p", "finish_p", "epoch", "submit_t",
        "turn_submit_t", "migrations", "pred_tokens", "fixed", "tool_t",
    )

    def __init__(self, pipeline, step, sample, turn, context, target, version, group=0, budget=None):
        self.pipeline = pipeline
        self.step = step
        self.sample = sample
        self.turn = turn
        self.id = RequestId(pipeline, step, sample, turn)
        self.rid = f"{pipeline}/{step}/{sample}"  # the trajectory: stable across turns (verl's sticky id)
        self.group = group  # GRPO group (prompt) within the step
        self.budget = target if budget is None else budget  # max tokens as configured (observable)
        self.context = context  # tokens before this turn's generation (prompt, earlier turns, observations)
        # the turn's true length: the simulated engine stops here; never part of a policy's state
        self.target = target
        self.done = 0  # tokens of this turn generated before the current admission
        self.cached = 0  # context tokens already in this replica's prefix cache
        self.version = version  # policy version of the weights that generated its first token
        self.replica = None
        self.held = 0
        self.admit_p = 0.0
        self.finish_p = 0.0
        self.epoch = 0  # bumped whenever the request leaves a replica's running set
        self.submit_t = 0.0
        self.turn_submit_t = 0.0
        self.tool_t = 0.0  # when the tool call before this turn started
        self.migrations = 0
        self.pred_tokens = 0.0  # the predictor's length at submission (skew-aware routing)
        # group, step, sample, turn, context, budget (set here, never changed) as six native
        # int64s: a replica's requests are taken as columns by joining these (one C pass,
        # ``_fixed_columns``), not by one pass over the requests per field
        self.fixed = _PACK_FIXED(self.group, step, sample, turn, context, self.budget)

    @property
    def remaining(self) -> int:
        return self.target - self.done


_ID, _DONE, _ADMIT_P, _TURN_SUBMIT_T, _FIXED = (attrgetter(a) for a in ("id", "done", "admit_p", "turn_submit_t",
                                                                        "fixed"))


def _fixed_columns(reqs: list) -> np.ndarray:
    """The requests' fixed fields as int64[6, n] (rows: group, step, sample, turn, context,
    budget; each row contiguous and writable, as ``np.fromiter`` gave them)."""
    return np.frombuffer(b"".join(map(_FIXED, reqs)), np.int64).reshape(len(reqs), 6).T.copy()


class Replica:
    """One vLLM engine of ``tp`` devices serving one pipeline."""

    def __init__(self, rid: int, pipeline: str, devices: tuple, model: ModelProfile,
                 cost: CostModel, other_bytes: float = 0.0, ready_t: float = 0.0, pricer=None):
        self.id = rid
        self.pipeline = pipeline
        self.devices = devices
        self.tp = len(devices)
        self.model = model
        self.cost = cost
        self._pricer = pricer  # core.Pricer (jigsaw_predict_duration); None: the cost model directly
        self.cap = cost.kv_capacity_tokens(model, self.tp, other_bytes)
        if self.cap <= 0:
            raise ValueError(
                f"replica of {model.name} on {self.tp} device(s) has no room for a KV cache: "
                f"weights do not fit; raise rollout_tp"
            )
        self.max_seqs = cost.f.max_num_seqs
        self.queue: deque[Request] = deque()
        self._heap: list = []  # (finish_p, seq, epoch, request)
        self._order: list = []  # admission order, for preemption (lazy deletion)
        self._seq = 0
        self.n = 0  # running sequences
        self._base = 0.0  # sum(held - admit_p) over running; kv = base + n * p
        self.p = 0.0
        self.t_sync = ready_t
        self.busy_until = ready_t  # prefill (and context switch) stalls decode until then
        self.step_s = 0.0
        self.tick_epoch = 0
        self.retiring = False
        self.busy_s = 0.0  # device-seconds / tp the replica had work in progress
        self.inflight = 0  # requests routed here and not yet finished (verl's in-flight count)
        self.predicted_work = 0.0  # predicted tokens of the requests routed here (skew-aware routing)
        self.switch_s = 0.0
        self.start_t = ready_t
        # seconds (per device) spent decoding in each regime and prefilling, since launch:
        # the executor's record of where a rollout's device time goes (``World.rollout_time``)
        self.decode_memory_bound_s = 0.0
        self.decode_compute_bound_s = 0.0
        self.prefill_s = 0.0
        # sequences preempted because the KV cache overflowed, and the tokens (context and
        # tokens so far) each must prefill again: what a live vLLM counts as num_preemptions
        self.kv_preemptions = 0
        self.kv_recompute_tokens = 0
        self.empty_s = 0.0  # held with no request: its trajectories in tool calls, or the step ending elsewhere
        # ... and of the decode seconds above, those of the engine's host-side step work (the
        # GPU idle meanwhile) and of the tensor-parallel all-reduces (``DecodeStepParts``);
        # None once a plugin priced a step (its parts are not known)
        self.decode_host_s: float | None = 0.0
        self.decode_allreduce_s: float | None = 0.0
        self._step_host_s = self._step_allreduce_s = 0.0  # the parts of ``step_s``
        self._prefill_until = ready_t  # when the last prefill admitted ends
        self._memory_bound = False  # the regime of the step ``step_s`` prices
        self._roofline = cost.decode_roofline(model)  # CostModel.decode_memory_bound's terms
        self._graph_max = cost.f.cuda_graph_max_batch
        # the replica of another pipeline sharing these devices (co-location), or None: while
        # both have sequences admitted, each step is priced with the other's GPU work added
        self.partner: Replica | None = None

    def time_split(self) -> tuple:
        """(memory-bound decode, compute-bound decode, prefill, empty, host-side step work,
        all-reduces) seconds per device up to ``t_sync``: a prefill still running then (its
        requests moved away, the replica closed) counts only its part so far; the last two
        are parts of the decode (None where a plugin priced a step)."""
        ahead = max(0.0, self._prefill_until - max(self.t_sync, self.start_t + self.switch_s))
        return (self.decode_memory_bound_s, self.decode_compute_bound_s, self.prefill_s - ahead, self.empty_s,
                self.decode_host_s, self.decode_allreduce_s)

    def resize_cache(self, other_bytes: float) -> None:
        """Re-size the KV cache with ``other_bytes`` per device taken by others (a co-located
        replica's weights and KV share); growth beyond it is preempted as usual."""
        cap = self.cost.kv_capacity_tokens(self.model, self.tp, other_bytes)
        if cap <= 0:
            raise ValueError(f"replica {self.id} of {self.model.name} has no KV room left with {other_bytes:.0f} "
                             f"bytes per device taken")
        self.cap = cap

    def alone_step_s(self) -> float:
        """Its decode step as if it ran alone, at the current batch (0 when not decoding)."""
        return self._decode_s(self.n, self.kv_tokens) if self.n > 0 else 0.0

    def _decode_s(self, batch: int, kv: float) -> float:
        if self._pricer is None:
            return self.cost.decode_step_s(self.model, self.tp, batch, kv)
        return self._pricer.decode_step_s(self.pipeline, self.devices, batch, kv)

    def _decode_parts(self, batch: int, kv: float):
        if self._pricer is None:
            return self.cost.decode_step_parts(self.model, self.tp, batch, kv)
        return self._pricer.decode_step_parts(self.pipeline, self.devices, batch, kv)

    def _prefill_s(self, tokens: float) -> float:
        if self._pricer is None:
            return self.cost.prefill_s(self.model, self.tp, tokens)
        return self._pricer.prefill_s(self.pipeline, self.devices, tokens)

    # ---- state ------------------------------------------------------------------------
    @property
    def kv_tokens(self) -> float:
        return self._base + self.n * self.p

    @property
    def load(self) -> int:
        return self.n + len(self.queue)

    # ---- what the engine reports (core.snapshot) ----------------------------------------
    @property
    def version(self) -> int:
        """Changes whenever its requests or their schedule change (predictions may be reused
        while it does not, at the same time)."""
        return self.tick_epoch

    def observe(self, t: float):
        # every replica reports every round (1,024 at 1024 GPUs): the KV figure once, the
        # sync only where time moved
        if t > self.t_sync:
            self.sync(t)
        n = self.n
        kv = self.kv_tokens
        step = self.step_s or self._decode_s(max(1, n), kv)
        return ReplicaObs.build(n, len(self.queue), kv, float(self.cap), self.max_seqs, step,
                                max(0.0, self.busy_until - t))

    def request_rows(self, t: float) -> list:
        """Observable rows of its requests (running, then queued): tokens so far, never the target."""
        self.sync(t)
        p = self.p
        rows = [(r.id, r.group, None, r.context, r.done + int(p - r.admit_p), r.budget, t - r.turn_submit_t, False)
                for r in self.running()]
        rows += [(r.id, r.group, None, r.context, r.done, r.budget, t - r.turn_submit_t, True) for r in self.queue]
        return rows

    def true_remaining(self) -> list[int]:
        """The tokens each request it holds still generates this turn (running, then queued),
        from the sampled lengths: the simulator's truth, for scoring predictions
        (``benchmarks/drain_accuracy.py``); never in a policy's state. At the last sync."""
        p = self.p
        return ([r.target - (r.done + int(p - r.admit_p)) for r in self.running()]
                + [r.target - r.done for r in self.queue])

    def request_columns(self, t: float):
        """``request_rows`` as columns (``core.snapshot.RequestColumns``), in the same order,
        read attribute by attribute in C loops rather than a tuple per request: the state
        build reads whole replicas at step boundaries (thousands of requests a round)."""
        self.sync(t)
        run = self.running()
        reqs = run + list(self.queue)
        n, k = len(reqs), len(run)
        generated = np.fromiter(map(_DONE, reqs), float, n)
        # r.done + int(p - r.admit_p) for a running request (int() truncates, as np.trunc)
        generated[:k] += np.trunc(self.p - np.fromiter(map(_ADMIT_P, run), float, k))
        queued = np.zeros(n, bool)
        queued[k:] = True
        group, step, sample, turn, context, budget = _fixed_columns(reqs)
        return RequestColumns(tuple(map(_ID, reqs)), group, step, sample, turn, context, generated, budget,
                              t - np.fromiter(map(_TURN_SUBMIT_T, reqs), float, n), queued, (None,) * n)

    @staticmethod
    def request_columns_of(replicas: list, t: float) -> tuple:
        """``request_columns`` of several replicas as one set of columns, the replicas'
        rows one after another in the order given, and each one's row count: one C loop
        per field for all of them (a step boundary reads every replica of a pipeline; a
        numpy call's fixed cost, paid per replica, was most of such a read). The values and
        their order are those of the replicas' own ``request_columns``."""
        reqs: list = []
        run_all: list = []
        sizes, runs, ps = [], [], []
        for rep in replicas:
            rep.sync(t)
            run = rep.running()
            reqs += run
            reqs += rep.queue
            run_all += run
            sizes.append(len(run) + len(rep.queue))
            runs.append(len(run))
            ps.append(rep.p)
        n, k = len(reqs), len(run_all)
        queued = np.ones(n, bool)
        at = 0
        for size, r in zip(sizes, runs):
            queued[at:at + r] = False
            at += size
        generated = np.fromiter(map(_DONE, reqs), float, n)
        # as request_columns: r.done + int(p - r.admit_p) for a running request, each
        # replica's own p (the same float operations, element by element)
        generated[~queued] += np.trunc(np.repeat(np.asarray(ps, float), runs)
                                       - np.fromiter(map(_ADMIT_P, run_all), float, k))
        group, step, sample, turn, context, budget = _fixed_columns(reqs)
        cols = RequestColumns(tuple(map(_ID, reqs)), group, step, sample, turn, context, generated, budget,
                              t - np.fromiter(map(_TURN_SUBMIT_T, reqs), float, n), queued, (None,) * n)
        return cols, sizes

    def running(self) -> list[Request]:
        return [r for (_, _, e, r) in self._heap if r.epoch == e and r.replica is self]

    # ---- time -------------------------------------------------------------------------
    def sync(self, t: float) -> None:
        """Advance decode progress to time ``t``."""
        if t <= self.t_sync:
            return
        start = max(self.t_sync, self.busy_until)
        # the context switch is counted once, by World._close (switch_s): not again here
        # when requests queue while it runs
        busy_from = max(self.t_sync, self.start_t + self.switch_s)
        if (self.n > 0 or self.queue) and t > busy_from:
            self.busy_s += t - busy_from
        elif not self.n and not self.queue and t > max(busy_from, self.busy_until):
            # not while a prefill it already counted (of requests moved away since) runs on
            self.empty_s += t - max(busy_from, self.busy_until)
        if self.n > 0 and t > start and self.step_s > 0:
            steps = (t - start) / self.step_s
            self.p += steps
            if self._memory_bound:
                self.decode_memory_bound_s += t - start
            else:
                self.decode_compute_bound_s += t - start
            if self.decode_host_s is not None:
                self.decode_host_s += steps * self._step_host_s
                self.decode_allreduce_s += steps * self._step_allreduce_s
        self.t_sync = t

    def _top(self):
        h = self._heap
        while h:
            fp, _, e, r = h[0]
            if r.epoch == e and r.replica is self:
                return fp
            heapq.heappop(h)
        return None

    def next_event_t(self) -> float | None:
        """When this replica next needs attention (a finish, a full cache, a segment end)."""
        fp = self._top()
        if fp is None:
            return None
        steps = max(fp - self.p, 0.0)
        kv = self.kv_tokens
        if self.n > 0:
            room = (self.cap - kv) / self.n
            if room < steps:
                steps = max(room, 1.0)
        steps = min(steps, SEGMENT_STEPS)
        kv_mid = kv + self.n * steps / 2
        parts = self._decode_parts(self.n, kv_mid)
        if parts is None:  # priced by a plugin: the total alone
            self.step_s = self._decode_s(self.n, kv_mid)
            self.decode_host_s = self.decode_allreduce_s = None
        else:
            self.step_s = parts.total_s
            self._step_host_s, self._step_allreduce_s = parts.host_s, parts.allreduce_s
        # CostModel.decode_memory_bound, inlined: it runs at every event of every replica
        weights, per_kv, per_seq = self._roofline
        self._memory_bound = weights + kv_mid * per_kv >= per_seq * cuda_graph_batch(self.n, self._graph_max)
        if self.partner is not None and self.partner.n > 0:
            alone, other = self.step_s, self.partner.alone_step_s()
            ov = self.cost.f.decode_step_overhead_s
            self.step_s = colocated_step_s(alone, other, ov)
            # its host-side work runs under the partner's GPU work: only what sticks out of
            # both engines' GPU work leaves the devices idle
            self._step_host_s = max(0.0, min(self._step_host_s,
                                             self.step_s - (alone - self._step_host_s) - max(0.0, other - ov)))
        return max(self.t_sync, self.busy_until) + steps * self.step_s

    # ---- requests ---------------------------------------------------------------------
    def enqueue(self, r: Request, t: float) -> None:
        r.replica = self
        self.queue.append(r)
        self.inflight += 1
        self.predicted_work += r.pred_tokens

    def admit(self, t: float) -> None:
        """Admit queued requests while sequences and KV room allow (FCFS, as vLLM)."""
        prefill = 0.0
        while self.queue and self.n < self.max_seqs:
            r = self.queue[0]
            need = r.context + r.done
            if self.n > 0 and self.kv_tokens + need > self.cap:
                break
            self.queue.popleft()
            prefill += need - min(r.cached, need)
            r.cached = need
            r.held = need
            r.admit_p = self.p
            r.finish_p = self.p + r.remaining
            r.epoch += 1
            self._seq += 1
            heapq.heappush(self._heap, (r.finish_p, self._seq, r.epoch, r))
            self._order.append((r.epoch, r))
            self.n += 1
            self._base += need - self.p
        if prefill > 0:
            took = self._prefill_s(prefill)
            self.prefill_s += took
            self.busy_until = self._prefill_until = max(self.busy_until, t) + took

    def _remove(self, r: Request) -> None:
        self.n -= 1
        self._base -= r.held - r.admit_p
        r.epoch += 1

    def pop_finished(self) -> list[Request]:
        out = []
        h = self._heap
        while h:
            fp, _, e, r = h[0]
            if r.epoch != e or r.replica is not self:
                heapq.heappop(h)
                continue
            if fp > self.p + _EPS:
                break
            heapq.heappop(h)
            self.predicted_work -= r.pred_tokens
            r.done = r.target
            self._remove(r)
            self.inflight -= 1
            out.append(r)
        if self.n == 0:
            self._order.clear()
        return out

    def preempt_overflow(self) -> int:
        """Preempt (recompute later) the newest requests while the cache is over capacity."""
        count = 0
        while self.n > 1 and self.kv_tokens > self.cap + _EPS:
            e, r = self._order.pop()
            if r.epoch != e or r.replica is not self:
                continue
            gained = int(self.p - r.admit_p)
            r.done += gained
            r.cached = 0
            self._remove(r)
            self.queue.appendleft(r)
            count += 1
            self.kv_recompute_tokens += r.context + r.done
        self.kv_preemptions += count
        return count

    def take(self, r: Request) -> None:
        """Remove a request (running or queued) for migration; keeps its generated prefix."""
        self.predicted_work -= r.pred_tokens
        if r in self.queue:
            self.queue.remove(r)
        else:
            r.done += int(self.p - r.admit_p)
            self._remove(r)
        self.inflight -= 1
        r.cached = 0
        r.replica = None

    def take_all(self) -> list[Request]:
        out = list(self.queue) + self.running()
        for r in out:
            self.take(r)
        return out

    def interrupt(self, t: float) -> None:
        """New weights arrived mid-generation: running requests keep their tokens and
        continue under the new weights after recomputing their KV (AReaL)."""
        running = sorted(self.running(), key=lambda r: r.admit_p)
        for r in reversed(running):
            self.take(r)
            r.replica = self
            self.inflight += 1
            self.predicted_work += r.pred_tokens
            self.queue.appendleft(r)
        self.admit(t)
