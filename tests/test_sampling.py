"""sample_step: shapes, determinism, sharing, the max_response_len cap, speed."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jigsaw_plugin.workload import StepSamples, load_workload, parse_workload, sample_step

REPO = Path(__file__).resolve().parents[1]


def pipeline(**kw):
    p = {
        "name": "p",
        "model": "qwen2.5-7b",
        "prompts_per_step": 8,
        "samples_per_prompt": 4,
        "max_response_len": 4096,
        "prompt_len": {"dist": "lognormal", "median": 150, "sigma": 0.5},
        "response_len": {"dist": "lognormal", "median": 400, "sigma": 1.0},
        "steps": 3,
    }
    p.update(kw)
    p = {k: v for k, v in p.items() if v is not None}
    return parse_workload({"version": 1, "cluster": {"gpus": 8, "gpu": "h100"}, "pipelines": [p]}).pipelines[0]


AGENTIC = dict(
    turns={"dist": "categorical", "values": [1, 2, 3, 4, 5], "weights": [1, 4, 3, 1, 1]},
    tool_latency_s={"dist": "lognormal", "median": 0.16, "sigma": 1.3},
    observation_len={"dist": "uniform", "low": 400, "high": 1500},
    reward={"kind": "sandbox"},
)


def check_invariants(s: StepSamples, p) -> None:
    n = p.samples_per_step
    assert s.n == len(s) == n
    assert s.prompt_len.dtype == s.turns.dtype == s.turn_offset.dtype == np.int64
    assert s.gen_tokens.dtype == s.observation_len.dtype == np.int64
    assert s.tool_latency_s.dtype == s.reward_latency_s.dtype == np.float64
    assert s.prompt_len.shape == s.turns.shape == s.reward_latency_s.shape == (n,)
    t = int(s.turns.sum())
    assert s.turn_offset.shape == (n + 1,) and s.turn_offset[0] == 0 and s.turn_offset[-1] == t
    assert np.array_equal(np.diff(s.turn_offset), s.turns)
    assert s.gen_tokens.shape == s.tool_latency_s.shape == s.observation_len.shape == (t,)
    assert s.turns.min() >= 1 and s.prompt_len.min() >= 1 and s.gen_tokens.min() >= 1
    assert s.observation_len.min() >= 0 and s.tool_latency_s.min() >= 0 and s.reward_latency_s.min() >= 0
    gen = s.generated_per_sample()
    assert gen.max() <= p.max_response_len
    last = s.turn_offset[1:] - 1
    assert np.all(s.tool_latency_s[last] == 0) and np.all(s.observation_len[last] == 0)
    # a sample's turns are dropped only after it reached the cap
    if p.turns is None:
        assert np.all(s.turns == 1)
        assert not s.tool_latency_s.any() and not s.observation_len.any()
    # every prompt's samples share its prompt length
    per_prompt = s.prompt_len.reshape(p.prompts_per_step, p.samples_per_prompt)
    assert np.all(per_prompt == per_prompt[:, :1])


def test_single_turn_shapes():
    p = pipeline()
    s = sample_step(p, 0, 0)
    check_invariants(s, p)
    assert np.array_equal(s.turn_offset, np.arange(p.samples_per_step + 1))
    assert np.all(s.reward_latency_s == 0.01)


def test_agentic_shapes_and_last_turn():
    p = pipeline(**AGENTIC)
    s = sample_step(p, 1, 7)
    check_invariants(s, p)
    assert s.turns.max() > 1
    multi = np.flatnonzero(s.turns > 1)
    first = s.turn_offset[multi]
    assert np.all(s.observation_len[first] >= 400) and np.all(s.tool_latency_s[first] > 0)


def test_deterministic_in_name_step_seed():
    p = pipeline(**AGENTIC)
    a, b = sample_step(p, 2, 5), sample_step(p, 2, 5)
    for f in ("prompt_len", "turns", "turn_offset", "gen_tokens", "tool_latency_s", "observation_len",
              "reward_latency_s"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f
    assert not np.array_equal(a.gen_tokens[:20], sample_step(p, 3, 5).gen_tokens[:20])
    assert not np.array_equal(a.gen_tokens[:20], sample_step(p, 2, 6).gen_tokens[:20])
    q = pipeline(name="other", **AGENTIC)
    assert not np.array_equal(a.prompt_len, sample_step(q, 2, 5).prompt_len)


def test_seed_derivation_is_stable_across_processes():
    """crc32-based, not hash(): a fixed expected value pins it."""
    p = pipeline(prompt_len={"dist": "uniform", "low": 0, "high": 1_000_000})
    s = sample_step(p, 0, 0)
    assert _crc("p") == 2181537457  # zlib.crc32(b"p"): the same in every process
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([0, 0, 2181537457]).spawn(6)[0]))
    expected = np.maximum(np.rint(rng.uniform(0, 1_000_000, 8)), 1).astype(np.int64)
    assert np.array_equal(s.prompt_len[::4], expected)


def _crc(name: str) -> int:
    import zlib

    return zlib.crc32(name.encode())


def test_fields_have_independent_streams():
    """Changing one field's distribution leaves the other fields' draws unchanged."""
    a = sample_step(pipeline(**AGENTIC), 0, 0)
    b = sample_step(pipeline(**{**AGENTIC, "observation_len": {"dist": "const", "value": 9}}), 0, 0)
    assert np.array_equal(a.prompt_len, b.prompt_len) and np.array_equal(a.turns, b.turns)
    assert np.array_equal(a.gen_tokens, b.gen_tokens) and np.array_equal(a.tool_latency_s, b.tool_latency_s)
    assert not np.array_equal(a.observation_len, b.observation_len)


def test_cap_truncates_and_ends_the_trajectory():
    p = pipeline(max_response_len=250, response_len={"dist": "const", "value": 100},
                 turns={"dist": "const", "value": 5}, tool_latency_s=0.5, observation_len=1000)
    s = sample_step(p, 0, 0)
    assert np.all(s.turns == 3)
    assert np.array_equal(s.gen_tokens[:3], [100, 100, 50])
    assert np.array_equal(s.observation_len[:3], [1000, 1000, 0])
    assert np.array_equal(s.tool_latency_s[:3], [0.5, 0.5, 0.0])
    assert np.all(s.generated_per_sample() == 250)


def test_cap_exactly_reached_drops_later_turns():
    p = pipeline(max_response_len=200, response_len={"dist": "const", "value": 100},
                 turns={"dist": "const", "value": 4}, tool_latency_s=0.5, observation_len=10)
    s = sample_step(p, 0, 0)
    assert np.all(s.turns == 2) and np.all(s.gen_tokens == 100)


def test_single_turn_cap():
    p = pipeline(max_response_len=300, response_len={"dist": "uniform", "low": 100, "high": 1000})
    s = sample_step(p, 0, 0)
    assert s.gen_tokens.max() == 300 and s.gen_tokens.min() >= 100


def test_rounding_and_floors():
    p = pipeline(prompt_len={"dist": "normal", "mean": 0, "std": 5}, response_len={"dist": "const", "value": 0.2},
                 turns={"dist": "const", "value": -3}, tool_latency_s={"dist": "normal", "mean": 0, "std": 1},
                 observation_len={"dist": "const", "value": -7},
                 reward={"latency_s": {"dist": "normal", "mean": 0, "std": 1}})
    s = sample_step(p, 0, 0)
    check_invariants(s, p)
    assert np.all(s.turns == 1) and np.all(s.gen_tokens == 1) and s.prompt_len.min() == 1


def test_huge_turns_bounded_by_cap():
    p = pipeline(max_response_len=16, response_len=1, turns={"dist": "const", "value": 1e12},
                 tool_latency_s=0, observation_len=0)
    s = sample_step(p, 0, 0)
    assert np.all(s.turns == 16)


def test_negative_step_or_seed():
    with pytest.raises(ValueError):
        sample_step(pipeline(), -1, 0)
    with pytest.raises(ValueError):
        sample_step(pipeline(), 0, -1)


def test_empirical_statistics_follow_the_spec():
    p = pipeline(prompts_per_step=512, samples_per_prompt=16, max_response_len=1_000_000,
                 response_len={"dist": "lognormal", "median": 466, "sigma": 0.93}, **{k: v for k, v in AGENTIC.items()
                                                                                      if k != "reward"})
    s = sample_step(p, 0, 0)
    assert abs(np.median(s.gen_tokens) / 466 - 1) < 0.03
    assert abs(s.turns.mean() - 2.7) < 0.05  # weights 1,4,3,1,1 over 1..5
    assert abs(np.mean(s.turns == 2) - 0.4) < 0.02


@st.composite
def agentic_pipeline(draw):
    cap = draw(st.integers(1, 5000))
    turns = draw(st.one_of(
        st.none(),
        st.builds(lambda v: {"dist": "const", "value": v}, st.integers(-2, 12)),
        st.builds(lambda m, s: {"dist": "lognormal", "median": m, "sigma": s}, st.floats(0.5, 10), st.floats(0, 2)),
    ))
    resp = draw(st.one_of(
        st.builds(lambda m, s: {"dist": "lognormal", "median": m, "sigma": s}, st.floats(1, 5000), st.floats(0, 2)),
        st.builds(lambda v: {"dist": "const", "value": v}, st.floats(-10, 10000)),
        st.builds(lambda lo, w: {"dist": "uniform", "low": lo, "high": lo + w}, st.floats(-5, 3000), st.floats(0, 3000)),
    ))
    kw = dict(max_response_len=cap, response_len=resp, prompts_per_step=draw(st.integers(1, 16)),
              samples_per_prompt=draw(st.integers(1, 16)), name=draw(st.from_regex(r"[a-z][a-z0-9-]{0,8}",
                                                                                    fullmatch=True)))
    if turns is not None:
        kw.update(turns=turns, tool_latency_s={"dist": "normal", "mean": 0.3, "std": 0.5},
                  observation_len={"dist": "uniform", "low": -10, "high": 800})
    return pipeline(**kw)


@settings(max_examples=200, deadline=None)
@given(agentic_pipeline(), st.integers(0, 50), st.integers(0, 2**32 - 1))
def test_invariants_hold_for_any_pipeline(p, step, seed):
    s = sample_step(p, step, seed)
    check_invariants(s, p)
    # truncation rule: a sample has fewer turns than drawn only if it used the whole budget
    full = sample_step(parse_like(p, max_response_len=10**9), step, seed)
    short = s.turns < full.turns
    assert np.all(s.generated_per_sample()[short] == p.max_response_len)
    assert np.all(s.turns <= full.turns)


def parse_like(p, **changes):
    import dataclasses

    return dataclasses.replace(p, **changes)


def test_demo_step_8192_is_fast():
    w = load_workload(REPO / "examples/workloads/demo.yaml")
    import dataclasses

    for p in w.pipelines:
        big = dataclasses.replace(p, prompts_per_step=512, samples_per_prompt=16)
        sample_step(big, 0, 0)
        times = []
        for step in range(10):
            t = time.process_time()  # CPU time: other processes' load must not fail this guard
            s = sample_step(big, step, 0)
            times.append(time.process_time() - t)
        assert s.n == 8192
        assert np.median(times) < 0.05, f"{p.name}: {np.median(times) * 1e3:.1f} ms"


# --------------------------------------------------------------------------- group_correlation


def _normal_score_icc(values: np.ndarray, group_of: np.ndarray) -> float:
    """ICC(1) of the normal scores of ``values`` among groups (ties get random order: the
    draws are continuous before rounding, so ties are rare)."""
    from jigsaw_plugin.predict.normal import ppf

    ranks = np.empty(len(values))
    ranks[np.argsort(values, kind="stable")] = np.arange(1, len(values) + 1)
    z = ppf((ranks - 0.5) / len(values))
    sizes = np.bincount(group_of).astype(float)
    sums = np.bincount(group_of, z)
    g, n = len(sizes), sizes.sum()
    msw = ((z * z).sum() - (sums**2 / sizes).sum()) / (n - g)
    msb = ((sums**2 / sizes).sum() - sums.sum() ** 2 / n) / (g - 1)
    k0 = (n - (sizes**2).sum() / n) / (g - 1)
    return (msb - msw) / (msb + (k0 - 1) * msw)


@pytest.mark.parametrize("rho", [0.0, 0.1, 0.4, 0.8])
def test_group_correlation_is_measurable(rho):
    p = pipeline(prompts_per_step=1500, samples_per_prompt=8, max_response_len=100_000, group_correlation=rho)
    s = sample_step(p, step=0, seed=3)
    icc = _normal_score_icc(s.gen_tokens.astype(float), np.arange(s.n) // 8)
    assert abs(icc - rho) < 0.05, (rho, icc)


def test_group_correlation_keeps_the_multiset_and_other_fields():
    kw = dict(prompts_per_step=64, samples_per_prompt=8)
    s0 = sample_step(pipeline(**kw), step=2, seed=5)
    s1 = sample_step(pipeline(group_correlation=0.6, **kw), step=2, seed=5)
    assert not np.array_equal(s0.gen_tokens, s1.gen_tokens)  # permuted ...
    assert np.array_equal(np.sort(s0.gen_tokens), np.sort(s1.gen_tokens))  # ... not redrawn
    assert s0.gen_tokens.sum() == s1.gen_tokens.sum()
    for f in ("prompt_len", "turns", "turn_offset", "tool_latency_s", "observation_len", "reward_latency_s"):
        assert np.array_equal(getattr(s0, f), getattr(s1, f)), f
    # seeded: the same seed gives the same permutation
    assert np.array_equal(s1.gen_tokens, sample_step(pipeline(group_correlation=0.6, **kw), step=2, seed=5).gen_tokens)


def test_group_correlation_zero_is_the_old_sampler():
    explicit = sample_step(pipeline(group_correlation=0.0), step=1, seed=9)
    absent = sample_step(pipeline(), step=1, seed=9)
    for f in ("prompt_len", "gen_tokens", "turns", "reward_latency_s"):
        assert np.array_equal(getattr(explicit, f), getattr(absent, f))


def test_group_correlation_agentic_turns():
    kw = dict(prompts_per_step=800, samples_per_prompt=8, max_response_len=1_000_000, **AGENTIC)
    s0 = sample_step(pipeline(**kw), step=0, seed=1)
    s1 = sample_step(pipeline(group_correlation=0.5, **kw), step=0, seed=1)
    check_invariants(s1, pipeline(group_correlation=0.5, **kw))
    assert np.array_equal(s0.turns, s1.turns)  # no cap reached: same turns ...
    assert np.array_equal(np.sort(s0.gen_tokens), np.sort(s1.gen_tokens))  # ... and the same turn lengths
    prompt_of_turn = np.repeat(np.arange(s1.n) // 8, s1.turns)
    assert abs(_normal_score_icc(s1.gen_tokens.astype(float), prompt_of_turn) - 0.5) < 0.06
    assert abs(_normal_score_icc(s0.gen_tokens.astype(float), prompt_of_turn)) < 0.03
