"""Preemptible devices in the simulator: nothing lost or duplicated, the staleness bound
holds, and the same samples are trained with and without preemptions."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from sim_helpers import HookLog, small_workload

from jigsaw_plugin.scheduler import get_policy
from jigsaw_plugin.sim import Simulation
from jigsaw_plugin.workload import parse_workload


def _workload(rate: float | None, trace=None, steps: int = 3):
    d = small_workload(modes=("async", "async"), staleness=(1, 2), steps=steps, prompts=8, samples=4).to_dict()
    spot = {"name": "spot", "gpu": "h100", "count": 6, "price_per_hour": 1.0}
    if rate is not None:
        spot["preemptible"] = {"rate_per_hour": rate, "replace_s": 15}
    d["cluster"] = {"classes": [spot, {"name": "od", "gpu": "h100", "count": 2, "price_per_hour": 3.0}]}
    return parse_workload(d)


def _run(workload, policy, recovery="migrate"):
    log = HookLog()
    sim = Simulation(workload, get_policy(policy), seed=3, hooks=log, record_requests=True,
                     preemption_recovery=recovery)
    return sim.run(), log


def _finished(log) -> Counter:
    return Counter((kw["pipeline"], kw["step"], kw["request_id"], kw["turn"], kw["generated_tokens"])
                   for kw in log.by("jigsaw_request_finished"))


POLICIES = ("jigsaw", "areal", "one-step-off", "verl-sync")
RATE = 60.0  # per device-hour: with 6 spot devices, one preemption every ~10 s of a ~1-minute run


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("recovery", ["migrate", "restart"])
def test_same_samples_trained_with_and_without_preemptions(policy, recovery):
    calm, calm_log = _run(_workload(None), policy)
    hit, hit_log = _run(_workload(RATE), policy, recovery)
    assert hit["preemptions"]["preemptions"] > 0
    # every turn of every sample finished exactly once, at its full sampled length
    assert _finished(hit_log) == _finished(calm_log)
    assert max(_finished(hit_log).values()) == 1
    for name, p in calm["pipelines"].items():
        q = hit["pipelines"][name]
        assert (q["steps"], q["samples"], q["generated_tokens"]) == (p["steps"], p["samples"], p["generated_tokens"])
    ends = Counter((kw["pipeline"], kw["step"]) for kw in hit_log.by("jigsaw_step_end"))
    assert set(ends.values()) == {1} and len(ends) == 6


def test_preempted_requests_resume_elsewhere():
    r, _ = _run(_workload(RATE), "one-step-off")
    assert r["preemptions"]["resumed_requests"] > 0
    assert r["preemptions"]["per_class"] == {"spot": r["preemptions"]["preemptions"], "od": 0}


@pytest.mark.parametrize("policy", ("jigsaw", "areal", "one-step-off"))
@pytest.mark.parametrize("rate", [None, RATE])
def test_staleness_bound_never_exceeded(policy, rate):
    w = _workload(rate)
    r, _ = _run(w, policy)
    pol = get_policy(policy)
    for spec in w.pipelines:
        res = r["pipelines"][spec.name]
        from jigsaw_plugin.core.pipelines import build_pipelines

        bound = pol.staleness_bound(next(p for p in build_pipelines(w) if p.name == spec.name))
        assert bound <= spec.staleness
        lags = [int(k) for k in res["staleness_histogram"]]
        assert max(lags) <= bound and res["max_staleness"] == max(lags)
        assert sum(res["staleness_histogram"].values()) == res["samples"]


def test_trace_preemptions_hit_the_named_devices(tmp_path):
    (tmp_path / "pre.csv").write_text("t_s,device\n1.0,0\n2.0,5\n")
    d = _workload(None).to_dict()
    d["cluster"]["classes"][0]["preemptible"] = {"trace": "pre.csv", "replace_s": 5}
    w = parse_workload(d, base_dir=tmp_path)
    r, _ = _run(w, "one-step-off")
    assert r["preemptions"]["preemptions"] == 2
    # downtime is not billed: 2 devices x 5 s less than the full pool
    spot = r["cost"]["classes"]["spot"]
    assert spot["device_hours"] == pytest.approx((6 * r["makespan_s"] - 10) / 3600)


def test_preemption_is_seeded():
    a, _ = _run(_workload(RATE), "areal")
    b, _ = _run(_workload(RATE), "areal")
    assert a["makespan_s"] == b["makespan_s"] and a["preemptions"] == b["preemptions"]


@pytest.mark.parametrize("policy", ("verl-sync", "rollmux"))
def test_a_rollout_whose_every_replica_is_preempted_starts_its_engines_again(policy, tmp_path):
    # every spot device preempted a second into the first rollouts: the step's requests
    # wait with no replica. verl-sync and RollMux launched replicas only as a step began,
    # so the run stalled (odd_workloads --preempt, stop 66); they now start their engines
    # again once the devices are back, and every sample finishes once at its full length
    (tmp_path / "pre.csv").write_text("t_s,device\n" + "".join(f"1.0,{d}\n" for d in range(6)))
    d = _workload(None).to_dict()
    d["cluster"]["classes"][0]["preemptible"] = {"trace": "pre.csv", "replace_s": 5}
    hit, hit_log = _run(parse_workload(d, base_dir=tmp_path), policy)
    calm, calm_log = _run(_workload(None), policy)
    assert hit["preemptions"]["preemptions"] == 6 and hit["preemptions"]["resumed_requests"] > 0
    assert _finished(hit_log) == _finished(calm_log) and max(_finished(hit_log).values()) == 1


def test_the_state_shows_the_preemptions_seen_so_far_and_none_to_come(tmp_path):
    # spot devices 0 and 5 preempted at 1 s and 2 s, each down 5 s: a round's state counts
    # what has happened by its time (a down still open up to then), never what is to come
    (tmp_path / "pre.csv").write_text("t_s,device\n1.0,0\n2.0,5\n")
    d = _workload(None).to_dict()
    d["cluster"]["classes"][0]["preemptible"] = {"trace": "pre.csv", "replace_s": 5}
    pol = get_policy("one-step-off")
    seen = []
    decide = pol.decide
    pol.decide = lambda state: (seen.append((state.t, state.preemptions)), decide(state))[1]
    Simulation(parse_workload(d, base_dir=tmp_path), pol, seed=3).run()
    checked = set()
    for t, pre in seen:
        if t < 1.0:
            assert pre == ()
            continue
        (s,) = pre
        starts = [x for x in (1.0, 2.0) if x <= t]
        down = sum(min(t, x + 5.0) - x for x in starts)
        assert (s.cls, s.count) == (0, len(starts))
        assert s.down_s == pytest.approx(down) and s.exposed_s == pytest.approx(6 * t - down)
        assert s.rate_per_s == pytest.approx(len(starts) / (6 * t - down))
        checked.add((len(starts), t >= 7.0))
    assert {(1, False), (2, False), (2, True)} <= checked  # rounds between and after the downs


def test_restart_pricing_is_the_pass_itself_without_preemptions_and_grows_with_the_gang():
    from jigsaw_plugin.scheduler.estimates import restart_priced_s

    assert restart_priced_s(3.0, 0.0, 30.0) == 3.0
    # rare preemptions: about the pass plus the expected lost work and waits (rate t (t/2 + wait))
    assert restart_priced_s(3.0, 1e-6, 30.0) == pytest.approx(3.0 + 1e-6 * 3.0 * (1.5 + 30.0), rel=1e-9)
    # (e^(rate t) - 1)(1/rate + wait): one device every 20 s, a 2 s pass, 10 s down
    assert restart_priced_s(2.0, 0.05, 10.0) == pytest.approx(math.expm1(0.1) * 30.0)
    # a pass that would almost never finish is priced past any real time, finite and in
    # order (its stage still starts on its likeliest gang), not an overflow
    hopeless = [restart_priced_s(t, 1.0, 1.0) for t in (800.0, 1e3, 1e4)]
    assert all(math.isfinite(x) and x > 1e299 for x in hopeless) and hopeless == sorted(set(hopeless))
    assert restart_priced_s(650.0, 1.0, 1.0) < hopeless[0]
