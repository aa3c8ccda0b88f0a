"""The simulator's invariants with co-located replicas (hypothesis): nothing lost or
duplicated, a device never double-booked except by a declared co-location pair (whose
shared time is the host's record alone), on-policy or within the staleness bound."""

from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jigsaw_plugin.sim import Simulation
from sim_helpers import HookLog, assert_each_request_once, device_overlaps, small_workload
from test_colocation import ForcedColocation


def _leases_overlap_outside_pairs(log, colocations) -> list:
    """Per device, intervals held by two leases at once that no co-location record declares."""
    open_at: dict = {}
    spans = defaultdict(list)
    for kw in log.calls:
        name, args = kw
        if name == "jigsaw_lease_granted" and args.get("purpose") == "rollout":
            for d in args["devices"]:
                open_at.setdefault((d, args["pipeline"]), []).append(args["t"])
        elif name == "jigsaw_lease_released":
            for d in args["devices"]:
                starts = open_at.get((d, args["pipeline"]))
                if starts:
                    spans[d].append((starts.pop(0), args["t"], args["pipeline"]))
    declared = [(set(r["devices"]), r["start_t"], r["end_t"], {r["host_pipeline"], r["guest_pipeline"]})
                for r in colocations]
    bad = []
    for d, items in spans.items():
        items.sort()
        for i, (s1, e1, p1) in enumerate(items):
            for s2, e2, p2 in items[i + 1:]:
                if s2 >= e1 - 1e-9:
                    break
                if p1 == p2:
                    continue
                if not any(d in devs and s2 >= st_ - 1e-9 and {p1, p2} == pair for devs, st_, _, pair in declared):
                    bad.append((d, (s1, e1, p1), (s2, e2, p2)))
    return bad


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_invariants_hold_with_a_co_located_pair(data):
    modes = data.draw(st.sampled_from([("sync",), ("async",), ("sync", "async")]))
    wl = small_workload(
        gpus=data.draw(st.sampled_from([2, 4])) * 2, pipelines=2, prompts=data.draw(st.integers(2, 6)),
        samples=data.draw(st.integers(1, 4)), steps=data.draw(st.integers(1, 2)),
        agentic=data.draw(st.sampled_from([(False,), (True,), (False, True)])), modes=modes,
        staleness=tuple(0 if m == "sync" else 1 for m in modes), median=data.draw(st.sampled_from([300, 1500])))
    log = HookLog()
    sim = Simulation(wl, ForcedColocation(kv_share=data.draw(st.sampled_from([0.1, 0.3, 0.6]))),
                     seed=data.draw(st.integers(0, 3)), hooks=log, record_requests=True)
    result = sim.run()
    assert_each_request_once(result, log, wl)
    for p in wl.pipelines:
        got = result["pipelines"][p.name]["max_staleness"]
        assert got <= sim.policy.staleness_bound(sim.world.pipelines[p.name])
    assert device_overlaps(sim.world.trace) == []
    assert _leases_overlap_outside_pairs(log, sim.world.colocations) == []
    for r in sim.world.colocations:  # every pair is two pipelines on one group, and it ended
        assert r["host_pipeline"] != r["guest_pipeline"] and r["end_t"] is not None
    gb = result["gap_breakdown"]
    assert gb["idle_device_s"] >= -1e-6  # no device counted twice
