"""What one decide round of the jigsaw policy works on (``Round``: the state, the homes,
the devices still free) and the small helpers its mechanisms share."""

from __future__ import annotations

from dataclasses import dataclass

from jigsaw_plugin.scheduler.decisions import LaunchReplica, ResizeStage, RetireReplica

__all__ = [
    "INF",
    "UNSET",
    "MICRO_BATCHES",
    "STAGE_TIMES_KEPT",
    "SHARE_ESTIMATES_KEPT",
    "JigsawMemo",
    "Round",
    "Ends",
    "Shares",
    "apportion",
    "finish_together",
    "assign_devices",
    "batch_held",
    "tail_s",
    "prefix_fastest",
    "limit_of",
    "running_context",
    "ended_replicas",
    "balanced_groups",
]

INF = float("inf")
UNSET = object()  # a figure of the round not computed yet
# micro-batches a stage not yet started is assumed to run as (the simulator's default; a
# running stage reports its own in ``RunningStageView``)
MICRO_BATCHES = 8
STAGE_TIMES_KEPT = 256  # passes whose times by width a policy keeps (a few per pipeline)
SHARE_ESTIMATES_KEPT = 1024  # (generation, training) estimates on a share a policy keeps


@dataclass(frozen=True)
class JigsawMemo:
    """What the policy derives once, at setup: each pipeline's homes and each device's owner."""

    home: dict  # pipeline -> (rollout home, training home)
    owner: dict  # device -> the pipeline whose static share holds it


def apportion(work: dict, floor: dict, total: int) -> dict:
    """Device counts summing to ``total`` (when the floors allow): each name gets its
    ``floor``, the rest in proportion to ``work`` above it (largest remainders; ties by
    order). Names with no work and no floor get none."""
    counts = dict(floor)
    left = total - sum(counts.values())
    want = {k: w for k, w in work.items() if w > 0}
    if left <= 0 or not want:
        return counts
    whole = sum(want.values())
    ideal = {k: total * w / whole for k, w in want.items()}
    excess = {k: max(0.0, ideal[k] - counts[k]) for k in want}
    ex = sum(excess.values()) or 1.0
    share = {k: left * e / ex for k, e in excess.items()}
    for k, v in share.items():
        counts[k] += int(v)
    rest = total - sum(counts.values())
    for k in sorted(share, key=lambda k: -(share[k] - int(share[k])))[:max(0, rest)]:
        counts[k] += 1
    return counts


def finish_together(left: dict, total: int) -> dict:
    """Devices per name so that all finish at one time ``T``: a name with ``work``
    device-seconds that spread and ``fixed`` seconds that do not finishes at
    ``fixed + work / n`` on ``n`` devices; ``T`` is found by bisection so the counts (real
    numbers) sum to ``total``."""
    busy = {k: (w, f) for k, (w, f) in left.items() if w > 0}
    if not busy:
        return {k: 0.0 for k in left}
    need = lambda t: sum(w / (t - f) if t > f else INF for w, f in busy.values())
    lo = max(f for _, f in busy.values())
    hi = lo + sum(w for w, _ in busy.values()) / max(1, total) * 2 + 1.0
    while need(hi) > total:
        hi *= 2
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if need(mid) > total else (lo, mid)
    return {k: (busy[k][0] / (hi - busy[k][1]) if k in busy else 0.0) for k in left}


def batch_held(state, model, tp: int, context: float, cost=None) -> int:
    """Sequences one replica of width ``tp`` admits at ``context`` tokens each: its batch
    limit (``max_num_seqs``) or what its KV cache holds (at ``cost``, a device class's;
    None: the pool's first), at least one."""
    return max(1, min(state.max_num_seqs, int((cost or state.cost).kv_capacity_tokens(model, tp) // context)))


def tail_s(cost, model, tp: int, n: int, context: float, left: float) -> float:
    """Projected time for ``n`` requests holding ``context`` KV tokens on a replica of width
    ``tp`` to decode the longest one's ``left`` tokens (the KV grows by half of that on average)."""
    return left * cost.decode_step_s(model, tp, n, context + n * left / 2)


def prefix_fastest(times: list) -> list:
    """For each ``g`` (index ``g - 1``): the least of ``times[:g]`` (a pass's time on 1, 2,
    ... devices) and the width that gives it, the narrowest on ties."""
    out, best = [], (INF, 1)
    for w, t in enumerate(times, 1):
        if t < best[0] - 1e-12:
            best = (t, w)
        out.append(best)
    return out


def limit_of(r, engine_max: int) -> int | None:
    """The admission limit replica ``r`` runs under (None: its engine's own batch limit)."""
    return r.max_seqs if r.max_seqs < engine_max else None


def running_context(live) -> float:
    """Mean context (KV tokens) of the sequences ``live`` replicas run now (0 if none)."""
    return sum(r.kv_tokens for r in live) / max(1, sum(r.running for r in live))


def ended_replicas(out: list) -> set:
    """Replicas this round's decisions retire or absorb (they may close at once)."""
    ended = {d.replica for d in out if isinstance(d, RetireReplica)}
    for d in out:
        if isinstance(d, LaunchReplica):
            ended.update(d.absorb)
    return ended


def balanced_groups(replicas: list, k: int) -> list:
    """``replicas`` in ``k`` groups of near-equal load (largest first onto the lightest)."""
    groups = [[] for _ in range(k)]
    loads = [0] * k
    for r in sorted(replicas, key=lambda r: (-r.load, r.id)):
        j = loads.index(min(loads))
        groups[j].append(r)
        loads[j] += r.load
    return [g for g in groups if g]


def assign_devices(static: dict, counts: dict, node_of: list) -> dict:
    """Device tuples of the given ``counts``, moving as few devices from their static
    share as possible: a pipeline over its count gives up its last static devices, one
    under it takes free ones on the nodes it already holds first."""
    keep = {k: list(devs[:counts.get(k, 0)]) for k, devs in static.items()}
    taken = {d for devs in keep.values() for d in devs}
    pool = [d for devs in static.values() for d in devs if d not in taken]
    for k in sorted(static, key=lambda k: -(counts.get(k, 0) - len(keep[k]))):
        need = counts.get(k, 0) - len(keep[k])
        if need <= 0:
            continue
        nodes = {node_of[d] for d in keep[k]}
        pool.sort(key=lambda d: (node_of[d] not in nodes, d))
        keep[k] += pool[:need]
        pool = pool[need:]
    return {k: tuple(v) for k, v in keep.items()}


class Shares(dict):
    """pipeline -> the devices of its rollout and training homes, each built when first read."""

    def __init__(self, home: dict):
        super().__init__()
        self.home = home

    def __missing__(self, name: str) -> tuple:
        r, t = self.home[name]
        got = self[name] = r if r is t else tuple(dict.fromkeys(r + t))
        return got


class Round:
    """One decide round's working set: the free devices left and figures computed once."""

    __slots__ = ("state", "free", "need", "completion", "critical_s", "resized", "gone", "home", "owner",
                 "share", "paced_last", "rollout_cap", "bulk_tp", "spread", "aim", "predicted_last", "projected",
                 "moved_in", "claim", "risk", "risky", "gang_claims", "held_empty", "ready_work", "width_plan")

    def __init__(self, state, home: dict, owner: dict):
        self.state = state
        self.home = home  # pipeline -> (rollout home, training home) this round
        self.owner = owner  # device -> the pipeline whose home holds it this round
        self.share = Shares(home)  # pipeline -> its home devices (rollout and training), built on first use
        self.free = set(state.free)
        # (owner, for a rollout replica) -> seconds until it wants its home back
        self.need: dict[tuple, float] = {}
        self.completion: dict[str, float] = {}  # pipeline -> predicted seconds to finish its run
        self.critical_s: float | None = None
        self.paced_last: float | None = None  # the latest projected finish at observed paces
        self.resized: dict[str, tuple] = {}  # pipeline -> devices a ResizeStage of this round gives its stage
        self.gone: set = set()  # replicas this round retires or empties: no request may move to them
        self.rollout_cap: dict[str, int | None] = {}  # pipeline -> home devices its rollout may hold
        self.bulk_tp: dict[str, int] = {}  # pipeline -> the width its rollout replicas launch at
        # pipeline -> (width, keep) its next step starts at, where ``width_trials`` chose it
        self.width_plan: dict[str, tuple[int, bool]] = {}
        self.spread = UNSET  # (pipeline, batch) critical_spread serves, or None; computed on first use
        self.aim: dict[int, int] = {}  # width -> the batch a spread of that pipeline aims at (``_aim_batch``)
        self.predicted_last = UNSET  # the pipeline projected to finish clearly last (predicted_pace), or None
        self.projected: dict[str, float] = {}  # pipeline -> projected finish, no prediction read
        # replica -> (requests, KV tokens) this round's moves send it: its engine's report
        # does not show them yet, and two moves to one replica must both fit
        self.moved_in: dict[int, tuple[int, float]] = {}
        self.claim: tuple | None = None  # (seconds until the critical pipeline's next gang is ready, its name)
        self.risk = UNSET  # device -> (preemptions a second, seconds down) seen (estimates.device_risks)
        self.risky: dict = {}  # (pipeline, stage, devices) -> its gangs priced with restarts (``_gangs_on``)
        self.gang_claims: dict | None = None  # device -> seconds until a training gang takes it (``_gang_claims``)
        # replica -> its devices: empty, kept for its trajectories' next turns unless a decision
        # of this round takes a device of it (``keep_between_turns``); the devices count as free
        self.held_empty: dict[int, tuple] = {}
        self.ready_work = UNSET  # names of unfinished pipelines with work ready (``_ready_work``)

    def stage_devices(self, p) -> tuple:
        """The devices ``p``'s running stage will hold from its next boundary on."""
        if p.name in self.resized:
            return self.resized[p.name]
        rs = p.running_stage
        return rs.resize_to if rs.resize_to is not None else rs.devices

    def resize(self, out: list, p, devices: tuple) -> None:
        rs = p.running_stage
        self.resized[p.name] = devices
        out.append(ResizeStage(p.name, rs.step, rs.stage, devices))

    def drop_undone_resizes(self, out: list) -> list:
        """``out`` without the ResizeStages of a stage whose last one this round gives it the
        devices it already holds from its next boundary (a reclaim shrank it and a growth
        took the same devices back). No decision between them took a device the shrink let
        go (the last one would lack it), so the executor ends where it started; emitted, the
        pair came back every round of the instant, 3,183 of them in (a)'s run."""
        undone = set()
        for p in self.state.order:
            rs = p.running_stage
            if p.name in self.resized and rs is not None:
                held = rs.resize_to if rs.resize_to is not None else rs.devices
                if self.resized[p.name] == held:
                    undone.add(p.name)
        if not undone:
            return out
        return [d for d in out if not (isinstance(d, ResizeStage) and d.pipeline in undone and not d.rest)]


class Ends:
    """One pipeline's predicted drains in a round of tail consolidation (replica ->
    seconds), read as the pricing needs them, and what every pricing of the round derives
    from all of them: the bound a move may stretch the generation to and the three latest
    ends. Those two are computed once, not once per tail priced (550 tails a round at 1024
    GPUs), and again only after a move of the round changed an end."""

    __slots__ = ("drain", "slack", "extra", "_bound", "_top")

    def __init__(self, slack: float, drain: dict | None = None, extra: tuple = (0.0, 0.0)):
        self.drain: dict = {} if drain is None else drain
        self.slack = slack
        # (seconds, most as a fraction of the latest end): a further stretch the bound allows
        # (``early_merges``: what the step's early pass would take off its chain)
        self.extra = extra
        self._bound: float | None = None
        self._top: list | None = None

    def of(self, r) -> float:
        got = self.drain.get(r.id)
        if got is None:
            got = self.drain[r.id] = r.predicted_drain_s()
        return got

    def latest(self, live) -> tuple[float, list]:
        """(the generation's end bound: the latest end x (1 + slack), plus ``extra``'s
        seconds up to its fraction of the latest end; the three latest ends as (replica,
        end)), every live replica's drain read first, in live order (the order the latest
        ends tie in)."""
        if self._bound is None:
            drain = self.drain
            for r in live:
                if r.id not in drain:
                    drain[r.id] = r.predicted_drain_s()
            latest = max(drain.values())
            seconds, most = self.extra
            self._bound = latest * (1 + self.slack) + min(seconds, most * latest)
            self._top = sorted(drain.items(), key=lambda kv: -kv[1])[:3]  # "others" in O(1)
        return self._bound, self._top

    def moved(self, src, dst, end: float) -> None:
        """A move of this round: ``src`` is empty, ``dst`` ends at ``end``."""
        self.drain[dst.id], self.drain[src.id] = end, 0.0
        self._bound = self._top = None


