"""RollMux's inter-group planning: which jobs share a co-execution group, and how each
group's devices split into a rollout pool and a training pool.

RollMux (arXiv 2512.11306) places jobs in co-execution groups, each an isolated set of
devices with a rollout pool and a training pool; inside a group the jobs take the pools in
round-robin, so one job trains while another rolls out. Its inter-group scheduler picks the
grouping and the pool sizes from profiled phase times. Here the profile is the cost model
on the spec's distributions, as the disaggregated baselines profile their split: a step's
generation by ``estimates.gen_profile_s`` (engine-level: batches, the long tail, prefill,
tool calls), its training by ``estimates.train_estimate_s``; the plan minimises the
estimated makespan: the slowest group's round-robin over its steps. A group holds one or
two jobs (pairs are what the paper evaluates); its devices are its jobs' static shares.

A round-robin of jobs ``j`` with generation ``g_j`` on the rollout pool and training
``t_j`` on the training pool repeats every ``max(sum g, sum t, max_j (g_j + t_j))``
seconds: each pool serves every job once a period, and a job's next rollout waits for its
own training (on-policy).
"""

from __future__ import annotations

from dataclasses import dataclass

from jigsaw_plugin.scheduler.estimates import gen_profile_s, length_stats, rollout_tp, train_estimate_s

__all__ = ["GroupPlan", "plan_groups", "round_robin_period_s"]

#: above this many jobs the grouping is greedy, not enumerated (the plans grow as n!)
_ENUMERATE_UP_TO = 10


@dataclass(frozen=True)
class GroupPlan:
    names: tuple[str, ...]  # the group's jobs, in the workload's order
    devices: tuple[int, ...]  # their static shares, joined
    rollout: int  # the first ``rollout`` of ``devices`` are the rollout pool, the rest train
    period_s: float  # estimated round-robin period
    estimate_s: float  # estimated time to finish every job's steps


def round_robin_period_s(gen: list[float], train: list[float]) -> float:
    """The steady-state period of a round-robin over jobs with these phase times."""
    return max(sum(gen), sum(train), *(g + t for g, t in zip(gen, train)))


def _plan_one(group: tuple, cost, stats: dict, profiles: dict) -> GroupPlan | None:
    devices = tuple(d for p in group for d in p.static_devices)
    tp = max(rollout_tp(p, cost) for p in group)
    best = None

    def profile(p, r: int) -> float:  # a job's profile depends on its replica count and its partner
        other = sum(q.model.weight_bytes for q in group if q is not p)
        key = (p.name, r // rollout_tp(p, cost), other)
        if key not in profiles:
            profiles[key] = gen_profile_s(p, cost, r, other)
        return profiles[key]

    need = max(cost.min_gang(p.model, update=True) for p in group)  # the training pool holds each job's state
    for r in range(tp, len(devices) - need + 1, tp):
        gen = [profile(p, r) for p in group]
        train = [train_estimate_s(p, cost, len(devices) - r, stats[p.name]) for p in group]
        period = round_robin_period_s(gen, train)
        # jobs with fewer steps leave; the rest run on alone at their own gen + train
        steps = sorted(p.total_steps for p in group)
        alone = max(g + t for g, t in zip(gen, train))
        estimate = steps[0] * period + (steps[-1] - steps[0]) * alone
        if best is None or estimate < best[0] - 1e-9:
            best = (estimate, r, period)
    if best is None:
        return None  # too few devices for separate pools
    return GroupPlan(tuple(p.name for p in group), devices, best[1], float(best[2]), float(best[0]))


def _groupings(items: list):
    """Every way to cut ``items`` into groups of one or two."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for tail in _groupings(rest):
        yield [(first,), *tail]
    for i, other in enumerate(rest):
        for tail in _groupings(rest[:i] + rest[i + 1:]):
            yield [(first, other), *tail]


def plan_groups(pipelines: list, cost) -> list[GroupPlan] | None:
    """The grouping of ``pipelines`` (``PipelineView``s) with the least estimated makespan
    (ties: the least summed estimate), or None when no grouping leaves every group both
    pools. Up to ``_ENUMERATE_UP_TO`` jobs every grouping is scored; above, jobs are paired
    greedily, each with the partner that most lowers the pair's estimate against running
    both alone."""
    stats = {p.name: length_stats(p.spec) for p in pipelines}
    plans: dict[tuple, GroupPlan | None] = {}
    profiles: dict[tuple, float] = {}

    def plan(group: tuple) -> GroupPlan | None:
        key = tuple(p.name for p in group)
        if key not in plans:
            plans[key] = _plan_one(group, cost, stats, profiles)
        return plans[key]

    if len(pipelines) <= _ENUMERATE_UP_TO:
        candidates = _groupings(list(pipelines))
    else:
        candidates = [_greedy_pairs(list(pipelines), plan)]
    best = None
    for grouping in candidates:
        out = [plan(g) for g in grouping]
        if any(x is None for x in out):
            continue
        score = (max(x.estimate_s for x in out), sum(x.estimate_s for x in out))
        if best is None or score < best[0]:
            best = (score, out)
    return None if best is None else best[1]


def _greedy_pairs(items: list, plan) -> list[tuple]:
    out = []
    inf = float("inf")
    while items:
        first = items.pop(0)
        alone = plan((first,))
        best = None
        for other in items:
            pair, solo = plan((first, other)), plan((other,))
            if pair is None:
                continue
            gain = max(alone.estimate_s if alone else inf, solo.estimate_s if solo else inf) - pair.estimate_s
            if gain > 0 and (best is None or gain > best[0]):
                best = (gain, other)
        if best is not None:
            items.remove(best[1])
            out.append((first, best[1]))
        else:
            out.append((first,))
    return out
