"""The work bound on a pool of several device classes: each class does its share of the work
at its own price.

``bounds.work_s`` on one class is the ideal device-seconds over the devices. On a pool of
several classes the ideal prices every token and pass at the class where it is cheapest, as
if the whole pool were of it; where the cheap class is a minority (40 H100 beside 64 RTX
4090) no schedule comes near that. The tighter floor is a linear programme: share each work
item among the classes (fraction ``x_ic`` of item ``i`` on class ``c``, costing ``x_ic a_ic``
device-seconds there), with each class's device-seconds at most ``n_c T``; the least such
``T``. It is not solved here: its dual is, and any dual-feasible point is a bound on its
own (weak duality), so a search that stops short of the optimum is still a true bound:

    for any weights y_c >= 0 with sum_c n_c y_c = 1, every schedule of makespan T has
    T = sum_c y_c n_c T >= sum_c y_c (device-seconds on c) >= sum_i min_c y_c a_ic

(the device-seconds on class ``c`` are at least what its share of each item costs there).
With ``y_c = 1 / N`` for every class this is the ideal device-seconds over the pool, the
one-class bound; the search (``class_work_s``) starts there and moves weight between pairs
of classes, along which the objective is concave (a sum of minima of linear functions).

The items and why each price is a floor on its class:

- a training-side pass (``Item``): its compute at its cheapest width on the class plus its
  fixed cost on the fewest of the class's devices that hold its state. A gang that spans
  classes runs at its slowest class's pace (``sim.devices.ClassPricer``), so the share of
  its devices on class ``c`` costs at least that share of the gang's price at ``c``.
- prefill (``Item``): every prompt and observation token once, at the class's cheapest width.
- a decode (``Decode``): a synchronous step's tokens, or an asynchronous pipeline's whole
  run (its steps may share decode steps). A decode step costs at least the larger of two
  floors (``bounds``: its tokens at the largest batch with no KV reads; its HBM reads, the
  weights once per replica step and every sequence's KV cache), and so at least any mix
  ``lam x first + (1 - lam) x second`` of them, one ``lam`` for all the steps of a decode
  (tokens of two decodes never share a replica step). Per token on class ``c``: the first
  floor is the class's least device-seconds per token; the second its context's KV bytes
  and its share ``min(context, cap) / cap`` of a weight read (a replica step's contexts
  fill at most ``cap`` tokens of KV: ``bounds._cache_steps``), read at the class's
  bandwidth. The longest trajectory's steps (``bounds``' other count of weight reads) are
  not additive over a split and are left to the one-class bound, which still holds.
  A token's cheapest class times its weight, ``min_c y_c a_c(context)``, is concave in the
  context (a minimum of concave functions), so over the tokens of a context bucket it is at
  least its chord at their mean context: buckets of every decode's tokens by context (in
  closed form from each turn's first context and length) give the sum from below.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Decode", "Item", "class_work_s", "decode_of", "context_edges"]

#: the mixes of the two decode floors each decode is priced at (every one a floor)
_LAMBDAS = np.linspace(0.0, 1.0, 9)
_GOLDEN = (5 ** 0.5 - 1) / 2


@dataclass(frozen=True)
class Item:
    """A work item's device-seconds done wholly on each class (``a_ic``, one per class)."""

    device_s: tuple


@dataclass(frozen=True)
class Decode:
    """A decode's tokens by context bucket and its per-class floor coefficients.

    ``edges``: bucket edges in tokens of context (a token of context ``x`` is in bucket ``b``
    when ``edges[b] <= x < edges[b + 1]``); ``count`` and ``ctx_sum``: its tokens per bucket
    and the sum of their contexts. Per class: ``per_token`` (the first floor, device-seconds
    a token), ``per_kv_token`` (the second: device-seconds a token of context read) and
    ``per_weights`` (device-seconds of one replica step's weight read); ``cap``: the most
    tokens of KV one replica step reads."""

    edges: np.ndarray
    count: np.ndarray
    ctx_sum: np.ndarray
    per_token: np.ndarray
    per_kv_token: np.ndarray
    per_weights: np.ndarray
    cap: float


def context_edges(longest: float, cap: float) -> np.ndarray:
    """Bucket edges from 0 past ``longest`` tokens of context: 1, 2, 4 ... up to 64, then
    12 a doubling (the chord under a concave function is closer the narrower the bucket),
    with ``cap`` among them (the second floor's kink)."""
    top = max(2.0, float(longest) + 1.0)
    geo = np.geomspace(64.0, max(128.0, top), num=max(2, int(np.ceil(12 * np.log2(max(128.0, top) / 64.0))) + 1))
    edges = np.concatenate(([0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0], geo, [cap] if 0 < cap < top else []))
    edges = np.unique(np.floor(edges))
    return edges if edges[-1] >= top else np.append(edges, np.ceil(top))


def decode_of(gen: np.ndarray, ctx: np.ndarray, per_token, per_kv_token, per_weights, cap: float) -> Decode | None:
    """A ``Decode`` of turns of ``gen`` tokens starting at contexts ``ctx`` (token ``j`` of a
    turn reads ``ctx + j``), or None where nothing is decoded."""
    gen = np.asarray(gen, dtype=np.float64)
    ctx = np.asarray(ctx, dtype=np.float64)
    keep = gen > 0
    gen, ctx = gen[keep], ctx[keep]
    if not len(gen):
        return None
    edges = context_edges(float(np.max(ctx + gen)), cap)
    # tokens below each edge and the sum of their contexts: m = clip(edge - ctx, 0, gen)
    # tokens of a turn read a context below the edge, ctx .. ctx + m - 1
    below = np.empty(len(edges))
    below_sum = np.empty(len(edges))
    for k, e in enumerate(edges):
        m = np.clip(e - ctx, 0.0, gen)
        below[k] = np.sum(m)
        below_sum[k] = np.sum(m * ctx + m * (m - 1) / 2)
    return Decode(edges, np.diff(below), np.diff(below_sum), np.asarray(per_token, dtype=np.float64),
                  np.asarray(per_kv_token, dtype=np.float64), np.asarray(per_weights, dtype=np.float64), float(cap))


def _decode_floor(d: Decode, y: np.ndarray) -> float:
    """``sum over tokens of min_c y_c a_c(context)`` from below, at the best mix of the two
    floors: a token's price on class ``c`` at context ``x`` under mix ``lam`` is
    ``lam per_token + (1 - lam) (per_kv_token x + per_weights min(x, cap) / cap)``, concave
    in ``x``, and so is its minimum over classes; each bucket's sum is at least its chord
    (through the bucket's edges) at the bucket's mean context, times its count."""
    x = d.edges[None, :]  # (1, E)
    second = d.per_kv_token[:, None] * x + d.per_weights[:, None] * np.minimum(x, d.cap) / d.cap  # (K, E)
    best = 0.0
    width = np.diff(d.edges)
    for lam in _LAMBDAS:
        price = lam * d.per_token[:, None] + (1.0 - lam) * second  # (K, E)
        h = np.min(y[:, None] * price, axis=0)  # (E,)
        slope = np.diff(h) / width
        total = float(np.sum(d.count * h[:-1] + (d.ctx_sum - d.count * d.edges[:-1]) * slope))
        best = max(best, total)
    return best


def _dual(items: np.ndarray, decodes: list, counts: np.ndarray, z: np.ndarray) -> float:
    """The dual objective at class shares ``z`` (``y_c = z_c / n_c``; ``sum z = 1``)."""
    y = z / z.sum() / counts  # sum_c n_c y_c = 1 exactly (a clipped share may drift by an ulp)
    total = float(np.sum(np.min(items * y[None, :], axis=1))) if len(items) else 0.0
    return total + sum(_decode_floor(d, y) for d in decodes)


def class_work_s(items: list, decodes: list, counts) -> float:
    """The largest dual objective found (a lower bound on the makespan, see the module's
    docstring): from equal weights per device, moving weight between each pair of classes by
    a golden-section search along the pair (the objective is concave), three passes.
    ``items``: ``Item``s; ``decodes``: ``Decode``s; ``counts``: devices per class."""
    counts = np.asarray(counts, dtype=np.float64)
    if len(counts) < 2:
        raise ValueError(f"class_work_s needs two or more device classes, got {len(counts)}")
    a = np.array([i.device_s for i in items], dtype=np.float64).reshape(-1, len(counts))
    z = counts / counts.sum()
    best = _dual(a, decodes, counts, z)
    for _ in range(3):
        for i in range(len(counts)):
            for j in range(i + 1, len(counts)):
                z, best = _line(a, decodes, counts, z, best, i, j)
    return best


def _line(a, decodes, counts, z, best, i, j, rounds: int = 30):
    """The best point on the segment that moves share between classes ``i`` and ``j``."""
    lo, hi = -z[i], z[j]  # t moves t from j to i

    def at(t):
        w = z.copy()
        w[i] += t
        w[j] -= t
        return w

    def f(t):
        return _dual(a, decodes, counts, np.clip(at(t), 0.0, None))

    x1, x2 = hi - _GOLDEN * (hi - lo), lo + _GOLDEN * (hi - lo)
    f1, f2 = f(x1), f(x2)
    for _ in range(rounds):
        if f1 < f2:
            lo, x1, f1 = x1, x2, f2
            x2 = lo + _GOLDEN * (hi - lo)
            f2 = f(x2)
        else:
            hi, x2, f2 = x2, x1, f1
            x1 = hi - _GOLDEN * (hi - lo)
            f1 = f(x1)
    t, ft = (x1, f1) if f1 >= f2 else (x2, f2)
    if ft > best:
        return np.clip(at(t), 0.0, None), ft
    return z, best
