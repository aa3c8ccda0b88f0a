"""The work bound on a pool of several device classes (``core.class_work``): the dual of the
linear programme that shares the work among classes, on hand-built items against the
programme's own optimum, its decode buckets against the tokens priced one by one, and that
no policy beats it where it binds (a fast class that is a small part of the pool)."""

import copy

import numpy as np
import pytest
from sim_helpers import small_workload

from jigsaw_plugin.core.bounds import compute_bounds
from jigsaw_plugin.core.class_work import Item, _decode_floor, class_work_s, decode_of
from jigsaw_plugin.scheduler import get_policy, policy_names
from jigsaw_plugin.sim import Simulation
from jigsaw_plugin.workload import parse_workload


def _two_class_optimum(a: np.ndarray, counts) -> float:
    """The least makespan of the fractional programme on two classes, directly: the items
    cheapest on class 0 relative to class 1 go there first (an exchange argument), the one
    at the threshold split so that both classes end together, or every item on one class
    where that is sooner."""
    order = np.argsort(a[:, 0] / a[:, 1])
    a = a[order]
    n0, n1 = counts
    best = min(a[:, 0].sum() / n0, a[:, 1].sum() / n1)
    for k in range(len(a)):
        left0 = a[:k, 0].sum() / n0  # items before k wholly on class 0, after k on class 1
        right1 = a[k + 1:, 1].sum() / n1
        # item k: fraction f on class 0: left0 + f a0 / n0 = right1 + (1 - f) a1 / n1
        f = (right1 + a[k, 1] / n1 - left0) / (a[k, 0] / n0 + a[k, 1] / n1)
        f = min(1.0, max(0.0, f))
        best = min(best, max(left0 + f * a[k, 0] / n0, right1 + (1 - f) * a[k, 1] / n1))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_the_dual_reaches_the_two_class_optimum_and_never_passes_it(seed):
    rng = np.random.default_rng(seed)
    a = rng.lognormal(0.0, 1.0, size=(40, 2)) * np.array([1.0, rng.uniform(1.5, 4.0)])  # class 1 slower
    counts = (int(rng.integers(2, 10)), int(rng.integers(10, 40)))
    opt = _two_class_optimum(a, counts)
    got = class_work_s([Item(tuple(row)) for row in a], [], counts)
    assert got <= opt * (1 + 1e-9)  # weak duality: a dual point is never above the optimum
    assert got >= opt * (1 - 1e-3)  # and the search finds it
    # equal weights per device: the one-class bound, every item at its cheapest class
    assert got >= a.min(axis=1).sum() / sum(counts) * (1 - 1e-12)


def test_three_classes_never_pass_any_assignment():
    rng = np.random.default_rng(7)
    a = rng.lognormal(0.0, 1.0, size=(30, 3)) * np.array([1.0, 2.0, 3.5])
    counts = (4, 12, 20)
    got = class_work_s([Item(tuple(row)) for row in a], [], counts)
    # any integral assignment's makespan is at or above the programme's optimum, so above the bound
    for _ in range(200):
        pick = rng.integers(0, 3, size=len(a))
        loads = [a[pick == c, c].sum() / counts[c] for c in range(3)]
        assert got <= max(loads) * (1 + 1e-9)
    assert got > a.min(axis=1).sum() / sum(counts)  # tighter than every item at its cheapest class


def test_the_decode_buckets_price_no_token_above_its_own_price():
    rng = np.random.default_rng(3)
    gen = rng.integers(1, 3000, size=25).astype(float)
    ctx = rng.integers(50, 9000, size=25).astype(float)
    per_token, per_kv, per_weights, cap = [2e-4, 5e-4], [3e-8, 9e-8], [1e-2, 3e-2], 20000.0
    d = decode_of(gen, ctx, per_token, per_kv, per_weights, cap)
    assert d.count.sum() == gen.sum()
    x = np.concatenate([c + np.arange(g) for g, c in zip(gen, ctx)])  # every token's context
    for y in (np.array([0.1, 0.02]), np.array([0.05, 0.05]), np.array([0.01, 0.2])):
        exact = max(float(np.sum(np.min([y[c] * (lam * per_token[c] + (1 - lam) * (
            per_kv[c] * x + per_weights[c] * np.minimum(x, cap) / cap)) for c in range(2)], axis=0)))
            for lam in np.linspace(0, 1, 9))
        got = _decode_floor(d, y)
        assert got <= exact * (1 + 1e-9)
        assert got >= exact * 0.99  # the buckets are narrow enough to be near it


def _fast_minority() -> dict:
    """Two 7B pipelines on 4 H100 beside 12 A100: the ideal prices every token at the H100's,
    as if the pool were all of them."""
    d = small_workload(gpus=16, pipelines=2, prompts=64, samples=8, steps=2, median=1500, max_len=8192,
                       models=("qwen2.5-7b", "qwen2.5-7b"), modes=("sync", "async"), staleness=(0, 1)).to_dict()
    d["cluster"] = {"classes": [{"name": "fast", "gpu": "h100", "count": 4, "gpus_per_node": 4},
                                {"name": "slow", "gpu": "a100", "count": 12, "gpus_per_node": 4}]}
    return d


def test_no_policy_beats_the_class_work_bound_where_it_binds():
    wl = parse_workload(_fast_minority())
    runs = [(name, "history") for name in policy_names() if not name.startswith("test-")] + [("jigsaw", "oracle")]
    bound = None
    for name, predictor in runs:
        sim = Simulation(wl, get_policy(name), seed=1, predictor=predictor)
        r = sim.run()
        b = compute_bounds(sim.world)
        assert b.work_s > 1.5 * b.ideal_device_s / sim.world.gpus  # the classes' shares bind ...
        assert b.makespan_lower_bound_s == b.work_s > b.critical_path_s  # ... the makespan's bound
        assert r["bounds"]["makespan_lower_bound_s"] == pytest.approx(b.makespan_lower_bound_s)
        assert r["makespan_s"] >= b.makespan_lower_bound_s, (name, r["makespan_s"], b)
        bound = b.work_s if bound is None else bound
        assert b.work_s == pytest.approx(bound)  # a function of the samples, not of the policy


def test_one_class_in_two_halves_is_the_one_class_bound():
    # the same devices split into two classes of one GPU: each class's price is the pool's,
    # so the shares add nothing and the bound is the ideal over the pool
    one = parse_workload(_fast_minority() | {"cluster": {"gpus": 16, "gpu": "a100", "gpus_per_node": 4}})
    d = copy.deepcopy(_fast_minority())
    d["cluster"]["classes"][0]["gpu"] = "a100"
    two = parse_workload(d)
    bounds = []
    for wl in (one, two):
        sim = Simulation(wl, get_policy("verl-sync"), seed=1)
        sim.run()
        bounds.append(compute_bounds(sim.world))
    assert bounds[1].work_s == pytest.approx(bounds[0].work_s, rel=1e-9)
    assert bounds[1].work_s == pytest.approx(bounds[1].ideal_device_s / 16, rel=1e-9)
