"""Co-location: two pipelines' rollout replicas on one device group, the KV room split.

A rollout tail decodes a few long requests at a small batch: each step reads all the
weights for a handful of tokens, and the device is otherwise unused. Another pipeline's
tail replica can share those devices: both weights resident, the KV room they leave split
once at launch, the two engines' steps interleaved on the GPU. The devices the moved tail
held are freed for other work. The cost model prices that (``costmodel/colocation.py``:
``colocated_step_s``, ``split_kv``); this module proposes it where it pays (``plan_colocations``, pure); the policy
wires it in with ``colocate_tails``. The derivation is in docs/colocation.md.

Pure: no host framework, no clock; reads a ``SchedulerState`` and returns decisions.
"""

from __future__ import annotations

from dataclasses import dataclass

from jigsaw_plugin.algorithms import runs_on_gang
from jigsaw_plugin.costmodel.colocation import KvSplit, colocated_step_s, split_kv  # noqa: F401  (re-exported)
from jigsaw_plugin.scheduler.decisions import LaunchReplica, Migrate

__all__ = ["colocated_step_s", "split_kv", "KvSplit", "Colocation", "plan_colocations", "colocate_tails",
           "colocated_pairs"]

# a replica's share of the KV room never goes below this (a split must leave the host room
# to grow and the guest room to admit)
_MIN_SHARE = 0.05
# predicted KV need must fit in this fraction of a cache (the rest absorbs the predictor's error)
_KV_MARGIN = 0.9


@dataclass(frozen=True, slots=True)
class Colocation:
    """A proposal: launch a replica of ``pipeline`` on ``host``'s devices, move ``src``'s
    requests there (abort + resume) and retire ``src``. Seconds and device-seconds as priced."""

    pipeline: str
    src: int
    host: int
    devices: tuple
    kv_share: float
    freed_device_s: float  # src's devices, free from now instead of after its predicted drain
    cost_device_s: float  # the host devices held longer: the pair's stretched decode
    guest_end_s: float  # the moved requests' predicted end
    host_end_s: float  # the host's predicted end, stretched

    def decision(self) -> LaunchReplica:
        return LaunchReplica(self.pipeline, self.devices, absorb=(self.src,), colocate_with=self.host,
                             kv_share=self.kv_share)


def colocated_pairs(state) -> dict:
    """replica id -> the id of the replica sharing its devices (both directions)."""
    by_devices: dict[tuple, list] = {}
    for r in state.replicas.values():
        by_devices.setdefault(tuple(sorted(r.devices)), []).append(r.id)
    pairs = {}
    for ids in by_devices.values():
        if len(ids) == 2:
            pairs[ids[0]], pairs[ids[1]] = ids[1], ids[0]
    return pairs


def _wants_devices(state, but: set) -> bool:
    """Some pipeline other than ``but`` has work that free devices would run now: a ready
    training stage, requests waiting for a replica, or a running stage that can grow."""
    for p in state.order:
        if p.done or p.name in but:
            continue
        stage = p.next_stage
        if runs_on_gang(stage):
            return True
        if p.pending > 0 or any(r.queued for r in p.replicas):
            return True
        rs = p.running_stage
        if rs is not None and rs.resizable and rs.micro_batches_left >= 2:
            return True
    return False


def _price(state, src, host, gen_end: dict, slack: float, min_gain: float) -> Colocation | None:
    """``src`` (pipeline A's tail) moved onto ``host`` (pipeline B's tail), priced."""
    cost = state.cost
    a, b = state.pipelines[src.pipeline], state.pipelines[host.pipeline]
    tp = host.tp
    if not a.model.fits_tp(tp):
        return None  # vLLM cannot shard the guest's model over the host's width
    reqs = src.requests
    k = len(reqs)
    ctx = float(sum(r.kv_tokens for r in reqs))
    guest_need = ctx + src.predicted_work_tokens
    host_need = host.kv_tokens + host.predicted_work_tokens
    share = min(1.0 - _MIN_SHARE, max(_MIN_SHARE, guest_need / max(1.0, guest_need + host_need)))
    split = split_kv(cost, b.model, a.model, tp, share)
    if guest_need > _KV_MARGIN * split.guest_tokens or host_need > _KV_MARGIN * split.host_tokens:
        return None  # the memory does not fit both
    overhead = cost.f.decode_step_overhead_s
    g_left, h_left = src.predicted_tokens_left, host.predicted_tokens_left
    g_alone = cost.decode_step_s(a.model, tp, k, ctx + k * g_left / 2)
    h_alone = host.step_s or cost.decode_step_s(b.model, tp, max(1, host.running), host.kv_tokens)
    both = colocated_step_s(g_alone, h_alone, overhead)
    resident = all(a.name in state.devices[d].resident for d in host.devices)
    start = (0.0 if resident else cost.context_switch_s(a.model, tp, train_state=False)) + cost.migration_s(a.model, tp, ctx)
    # the host decodes alone while the guest loads and re-prefills, then both at the shared step
    # until the shorter is done; the longer goes on alone
    h_start = host.stall_s + min(h_left, start / max(h_alone, 1e-9)) * h_alone
    h_rest = max(0.0, h_left - start / max(h_alone, 1e-9))
    overlap = min(h_rest, g_left)
    host_end = h_start + overlap * both + (h_rest - overlap) * h_alone
    guest_end = start + overlap * both + (g_left - overlap) * g_alone
    host_old = host.predicted_drain_s()
    if guest_end > gen_end[a.name] * (1 + slack) or host_end > gen_end[b.name] * (1 + slack):
        return None  # stretches a pipeline's generation beyond its slack
    freed = src.predicted_drain_s() * src.tp
    held = max(0.0, max(host_end, guest_end) - host_old) * tp
    if freed < min_gain * held or freed <= 0.0:
        return None
    return Colocation(a.name, src.id, host.id, tuple(host.devices), round(share, 4), freed, held, guest_end, host_end)


def plan_colocations(state, free, gone, tail_requests: int = 32, min_gain: float = 2.0,
                     slack: float = 0.05) -> tuple[Colocation, ...]:
    """Co-locations that pay this round (pure): a tail replica of pipeline A (at most
    ``tail_requests`` requests, none queued) moves onto the devices of pipeline B's tail
    replica when the device-seconds its own devices free are at least ``min_gain`` x the
    device-seconds the pair's interfering decode holds B's devices longer, neither
    pipeline's generation is stretched beyond ``slack``, both caches fit their predicted
    need, and another pipeline has work for the freed devices. ``free``: the round's free
    devices; ``gone``: replica ids this round already retires or empties. Only where the
    executor declares co-location (``state.colocation``)."""
    if not getattr(state, "colocation", False):
        return ()
    pairs = colocated_pairs(state)
    cand = [r for r in state.replicas.values()
            if not r.retiring and r.id not in gone and r.id not in pairs and 0 < r.load <= tail_requests
            and not r.queued]
    if len(cand) < 2 or len({r.pipeline for r in cand}) < 2:
        return ()
    gen_end = {}
    for p in state.order:
        live = [r for r in p.replicas if not r.retiring and r.id not in gone]
        gen_end[p.name] = max((r.predicted_drain_s() for r in live), default=0.0)
    out: list[Colocation] = []
    used: set = set()
    for src in sorted(cand, key=lambda r: (r.load, r.id)):
        if src.id in used:
            continue
        a = state.pipelines[src.pipeline]
        siblings = [r for r in a.replicas if r.id != src.id and not r.retiring and r.id not in gone]
        if not siblings and a.pending:
            continue  # its last replica with requests still to route: keep it
        if not _wants_devices(state, {src.pipeline}):
            break
        best = None
        for host in cand:
            if host.pipeline == src.pipeline or host.id in used:
                continue
            c = _price(state, src, host, gen_end, slack, min_gain)
            if c is not None and (best is None or c.freed_device_s - c.cost_device_s
                                  > best.freed_device_s - best.cost_device_s):
                best = c
        if best is None:
            continue
        out.append(best)
        used.update((src.id, best.host))
    return tuple(out)


def colocate_tails(rnd, out: list, config) -> None:
    """The jigsaw policy's co-location step (after tail consolidation): the round's free set
    keeps the devices a co-located replica still holds when its partner retires; then each
    co-location that pays (``plan_colocations``) is appended to ``out``; co-located
    replicas are left alone by the rest of the round (their KV split is fixed)."""
    state = rnd.state
    held = {d for r in state.replicas.values() if r.id not in rnd.gone for d in r.devices}
    rnd.free.difference_update(held)
    # replicas this round already moves requests into are priced on what they held before:
    # leave them out too
    touched = {d.dst for d in out if isinstance(d, Migrate)}
    plans = plan_colocations(state, frozenset(rnd.free), frozenset(rnd.gone | touched), config.tail_requests,
                             config.min_gain, config.latency_slack)
    for c in plans:
        out.append(c.decision())
        rnd.gone.add(c.src)
        rnd.gone.add(c.host)
        rnd.free.update(state.replicas[c.src].devices)
    rnd.gone.update(colocated_pairs(state))
