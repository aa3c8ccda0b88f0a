"""A work bound that prices the chain's decode (``chain_work_s``, used by ``bounds``).

The work bound (``work_s``) lets every decode step run full and the chain bound
(``critical_path_s``) lets every step's longest trajectory decode alone on the widest
replica; no run has both. A synchronous step's last trajectory decodes its tokens one
decode step each, and a run of makespan ``T`` leaves its pipeline at most ``T - rest``
seconds for them (``rest``: the chain's other parts, its tool calls, reward, update passes,
fixed costs and weight syncs). A fast step on ``tp`` devices takes at least
``a + b x context`` seconds (host work, all-reduces at batch 1 and the weight shard's read,
then the KV it reads: ``a``, ``b``) and costs ``tp`` x its all-reduces in device-seconds
that no KV or weight read counts (``e``); the contexts of the other sequences it carries
make it slower, and those it does not carry need steps of their own, each reading the
weights (``W`` device-seconds) again: with ``cap`` the roomiest replica's KV cache, a step
that carries ``x`` tokens of context leaves ``W (1 - x / cap)`` of a weight read to other
steps. Per token of the trajectory, at context ``c``, a width and a carried context
``x`` in ``[c, cap]`` cost ``e + W (1 - x / cap)`` device-seconds above the work bound's
reads (which count ``max(L, F)`` weight reads: the trajectory's ``L`` steps and the ``F``
the step's contexts fill, so ``W (L - F)+`` of the sum is already counted) and take at least
``a + b x`` seconds.

For any ``mu >= 0`` (weak duality of the programme that picks a width and a carried
context per token under the time budget), the device-seconds above the work bound are at
least ``Phi(mu) - mu (T - rest)``, ``Phi`` the tokens' least ``cost + mu x seconds``
summed; a run of makespan ``T`` spends at least ``ideal + sum over pipelines of that``
(less the part of each pipeline's decode that its token floor already counts above its
reads: ``slack``), so the least ``T`` with ``gpus x T`` at least that is a lower bound on
the makespan. ``mu`` is searched on a grid (any grid point is a bound), ``T`` by
bisection. Each token's least over the lines is bounded below on buckets of contexts (a
line's least on an interval is at one of its ends), so nothing here is an estimate.

The chain's update passes share that budget (``ChainTokens.passes``): the work bound counts
each at its cheapest gang, where it is slowest; a gang of ``w`` holds ``w`` devices for the
whole pass, its fixed cost included, so a chain that needs its updates fast pays
device-seconds for them above the work bound (``PassPrices``: seconds and that excess at
each width, a pair run alongside as one). Their part ``Phi_t(mu)`` is each pass's least
``excess + mu x seconds``; the decode's excess has the work bound's token-floor ``slack``
taken off, the passes' not, so the budget's split between the two is searched on a grid
(``_pipeline_extra``) instead of under one ``mu``. docs/simulator.md ("Bounds and
effective utilisation") derives it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["WidthPrice", "PassPrices", "ChainTokens", "chain_work_s", "pareto", "BUCKETS"]

#: context buckets per turn of a chain trajectory (each bucket priced at its cheaper end)
BUCKETS = 32
# the dual weights tried (device-seconds per second of the chain's budget); 0 is the bound
# without the budget
_MU = np.concatenate([[0.0], np.geomspace(1e-3, 1e4, 71)])
_SPLITS = 257  # grid points of the budget's split between the decode and the update passes


@dataclass(frozen=True)
class WidthPrice:
    """One replica width's prices for a decode step of a chain trajectory's token."""

    step_s: float  # ``a``: the step's seconds at batch 1 with no KV (host, all-reduce, weight shard)
    per_context_s: float  # ``b``: seconds per token of context the step reads on this width
    excess_device_s: float  # ``e``: device-seconds no read counts (tp x the all-reduces)


@dataclass(frozen=True)
class PassPrices:
    """One update pass on a chain step (or a pair run alongside, as one), at each gang it
    may run on: its seconds on the chain (its fixed cost is in ``rest_s``) and the
    device-seconds it then spends above what the work bound counts for it (its compute on
    the cheapest gang, its fixed cost on the fewest devices). A pass resized at
    micro-batch boundaries runs each micro-batch at one width's price, so its (seconds,
    device-seconds) are a mix of these points: its least ``excess + mu x seconds`` is at one."""

    seconds: np.ndarray
    excess_device_s: np.ndarray


def pareto(seconds: np.ndarray, excess: np.ndarray) -> PassPrices:
    """The points no other is both as fast and as cheap as (the least ``excess + mu x
    seconds`` over all points is at one of them, for every ``mu >= 0``)."""
    order = np.lexsort((excess, seconds))
    t, e = np.asarray(seconds, float)[order], np.asarray(excess, float)[order]
    keep = e < np.minimum.accumulate(np.concatenate(([np.inf], e[:-1])))
    return PassPrices(t[keep], e[keep])


@dataclass(frozen=True)
class ChainTokens:
    """One synchronous pipeline's chain trajectories (a step's longest, every step) as
    ``chain_work_s`` prices them."""

    widths: tuple  # WidthPrice per width a schedule may use
    weights_device_s: float  # ``W``: one replica decode step's weight read, device-seconds
    cap: float  # the roomiest replica's KV cache, tokens (``bounds._kv_cap``)
    turns: tuple  # (first context, tokens) of each of the trajectories' turns
    counted_device_s: float  # sum over steps of W (L - F)+: weight reads the work bound counts for them
    rest_s: float  # the chain's seconds besides the trajectories' decode and the update passes
    slack_device_s: float  # its steps' token floors above their read floors (``bounds``)
    passes: tuple = ()  # ``PassPrices`` of each step's update passes (their seconds not in ``rest_s``)


def _buckets(turns: tuple, cap: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each turn's token contexts ``c0 .. c0 + n - 1`` as up to ``BUCKETS`` intervals, split
    at ``cap``: (tokens, lowest context, highest context) per interval."""
    n_out, lo_out, hi_out = [], [], []
    for c0, n in turns:
        n = int(n)
        if n <= 0:
            continue
        edges = np.unique(np.concatenate([np.linspace(0, n, min(BUCKETS, n) + 1).round(),
                                          [min(n, max(0.0, np.ceil(cap - c0)))]]))
        for s, t in zip(edges[:-1], edges[1:]):
            if t > s:
                n_out.append(t - s)
                lo_out.append(c0 + s)
                hi_out.append(c0 + t - 1)
    return np.asarray(n_out), np.asarray(lo_out), np.asarray(hi_out)


def _phi(tokens: ChainTokens) -> np.ndarray:
    """``Phi(mu)`` on the ``_MU`` grid, less the weight reads the work bound already counts."""
    n, lo, hi = _buckets(tokens.turns, tokens.cap)
    if not len(n):
        return np.zeros(len(_MU))
    W, cap = tokens.weights_device_s, tokens.cap
    mu = _MU[:, None]
    best = np.full((len(_MU), len(n)), np.inf)
    below = hi < cap  # a bucket wholly under the cap (``_buckets`` splits at it)
    for w in tokens.widths:
        a, b, e = w.step_s, w.per_context_s, w.excess_device_s
        # carried context x = c (only its own): e + W (1 - c / cap) + mu (a + b c), linear in c
        slope = mu * b - W / cap
        at = np.where(slope >= 0, lo, hi)
        own = e + W * (1.0 - np.minimum(at, cap) / cap) + mu * (a + b * at)
        # a full cache carried (x = cap): e + mu (a + b cap); a context past the cap fills a step alone
        full = np.where(below, e + mu * (a + b * cap), e + mu * (a + b * lo))
        best = np.minimum(best, np.minimum(own, full))
    return (best * n).sum(axis=1) - tokens.counted_device_s


def _phi_passes(tokens: ChainTokens) -> np.ndarray:
    """Each update pass's least ``excess + mu x seconds`` over its gangs, summed, on the
    ``_MU`` grid."""
    out = np.zeros(len(_MU))
    for pp in tokens.passes:
        out += np.min(pp.excess_device_s[None, :] + _MU[:, None] * pp.seconds[None, :], axis=1)
    return out


def _pipeline_extra(phi_d: np.ndarray, phi_t: np.ndarray | None, budget: float, slack: float,
                    fastest_s: float = 0.0) -> float:
    """One pipeline's device-seconds above the work bound in a run that leaves its chain
    ``budget`` seconds for its trajectories' decode and its update passes. Each part's
    excess is at least ``h(tau) = max over mu of Phi(mu) - mu tau`` on the ``tau`` seconds
    it gets (weak duality); the decode's less the ``slack`` the work bound counts already
    (never below 0), the passes' in full. Without passes, that at the whole budget. With
    them, the budget's split is free: on a grid of the passes' share, each interval
    between two grid points is priced at its cheapest end of each part (both parts get
    cheaper with more time), and the least interval is the bound; never under the decode's
    price with the passes at their fastest (``fastest_s``, their least seconds)."""
    if phi_t is None:
        return max(0.0, float(np.max(phi_d - _MU * budget)) - slack)
    # the passes at their fastest leave the decode at most this (the bound without their
    # price, which the grid's intervals could otherwise fall below by an interval's width)
    fastest = max(0.0, float(np.max(phi_d - _MU * (budget - fastest_s))) - slack)
    tau = np.linspace(0.0, max(budget, 0.0), _SPLITS)
    h_t = np.max(phi_t[:, None] - _MU[:, None] * tau[None, :], axis=0)
    h_d = np.max(phi_d[:, None] - _MU[:, None] * (budget - tau)[None, :], axis=0)
    return max(fastest, float(np.min(np.maximum(0.0, h_d[:-1] - slack) + h_t[1:])))


def chain_work_s(ideal_device_s: float, gpus: int, pipelines: list, floor_s: float) -> float:
    """The least ``T >= floor_s`` with ``gpus x T >= ideal + sum of each pipeline's
    device-seconds above the work bound that a chain within ``T`` costs`` (module doc).
    ``floor_s``: a lower bound already known (the larger of the work and chain bounds)."""
    if not pipelines or gpus <= 0:
        return floor_s
    phis = [(_phi(p), _phi_passes(p) if p.passes else None, p.rest_s, p.slack_device_s,
             sum(float(np.min(pp.seconds)) for pp in p.passes)) for p in pipelines]

    def need(t: float) -> float:
        return ideal_device_s + sum(_pipeline_extra(phi_d, phi_t, t - rest, slack, fastest)
                                    for phi_d, phi_t, rest, slack, fastest in phis)

    lo = floor_s
    if need(lo) <= gpus * lo:
        return lo
    hi = need(lo) / gpus  # extra shrinks as T grows: at hi, need(hi) <= need(lo) = gpus x hi
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if need(mid) <= gpus * mid:
            hi = mid
        else:
            lo = mid
    return lo  # need(lo) > gpus x lo: no run is shorter than lo
