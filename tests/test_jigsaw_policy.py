"""The jigsaw policy: its mechanisms act, can be switched off, and keep every guarantee."""

from collections import Counter

import pytest

from jigsaw_plugin.bench.ab import run_ab
from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.scheduler import get_policy
from jigsaw_plugin.sim import Simulation
from sim_helpers import HookLog, device_overlaps, small_workload


def _run(wl, **options):
    log = HookLog()
    sim = Simulation(wl, get_policy("jigsaw", **options), seed=1, hooks=log, record_requests=True)
    return sim, sim.run(), log


@pytest.fixture(scope="module")
def tail_heavy():
    # long-tailed responses, several pipelines, sync and async: every mechanism has work
    return small_workload(gpus=16, pipelines=3, prompts=16, samples=8, steps=3, median=1200,
                          modes=("sync", "sync", "async"), staleness=(0, 0, 1), agentic=(False, True))


def test_migrated_requests_finish_exactly_once_with_their_full_length(tail_heavy):
    sim, result, log = _run(tail_heavy)
    migrated = log.by("jigsaw_request_migrated")
    assert migrated, "expected migrations on a tail-heavy workload"
    finished = Counter((e["pipeline"], e["step"], e["request_id"], e["turn"]) for e in log.by("jigsaw_request_finished"))
    assert max(finished.values()) == 1
    for e in migrated:
        assert finished[(e["pipeline"], e["step"], e["request_id"], e["turn"])] == 1
    for p in tail_heavy.pipelines:
        for k in range(p.steps):
            s = sim.world.pipelines[p.name].steps[k]
            got = sum(e["generated_tokens"] for e in log.by("jigsaw_request_finished")
                      if e["pipeline"] == p.name and e["step"] == k)
            assert got == int(s.samples.gen_tokens.sum())
    assert device_overlaps(sim.world.trace) == []
    stale = {name: r["max_staleness"] for name, r in result["pipelines"].items()}
    assert stale["p0"] == stale["p1"] == 0 and stale["p2"] <= 1


def test_tails_are_resharded_onto_wider_replicas(tail_heavy):
    sim, _, log = _run(tail_heavy)
    widths = {len(e["devices"]) for e in log.by("jigsaw_lease_granted") if e["purpose"] == "rollout"}
    assert max(widths) > 1  # the model's own replicas are tp 1


@pytest.mark.parametrize("mechanism", ["migration", "resize", "lookahead", "multiplex", "borrow", "loans",
                                       "priority"])
def test_each_mechanism_can_be_switched_off(tail_heavy, mechanism):
    sim, result, log = _run(tail_heavy, **{mechanism: False})
    assert result["samples"] == sum(p.samples_per_step * p.steps for p in tail_heavy.pipelines)
    if mechanism == "migration":
        assert not log.by("jigsaw_request_migrated")
    if mechanism == "multiplex":  # every stage stays on its pipeline's static share
        shares = {p.name: set(p.static_devices) for p in sim.pipelines}
        for e in log.by("jigsaw_stage_start"):
            assert set(e["devices"]) <= shares[e["pipeline"]]
    if mechanism == "borrow":  # rollout replicas only on the pipeline's own share
        shares = {p.name: set(p.static_devices) for p in sim.pipelines}
        for e in log.by("jigsaw_lease_granted"):
            if e["purpose"] == "rollout" and len(e["devices"]) == 1:
                assert set(e["devices"]) <= shares[e["pipeline"]]


def test_bench_reports_a_ratio_on_the_same_samples(tail_heavy):
    ab = run_ab(tail_heavy, "verl-sync")
    assert ab["baseline"]["samples"] == ab["candidate"]["samples"]
    assert ab["throughput_ratio"] == pytest.approx(ab["candidate"]["samples_per_s"] / ab["baseline"]["samples_per_s"])
    ab = run_ab(tail_heavy, "verl-sync", ablate=["migration"])
    assert ab["candidate"]["ablate"] == ["migration"]
    with pytest.raises(SpecError, match="--ablate"):
        run_ab(tail_heavy, "verl-sync", ablate=["teleport"])
    with pytest.raises(SpecError, match="jigsaw option warp.*migration"):
        get_policy("jigsaw", warp=True)
    with pytest.raises(SpecError, match="takes no options"):
        get_policy("verl-sync", rollout_gpus=2)


def test_trace_replay_workload_runs_under_jigsaw_and_verl(monkeypatch):
    import os
    from pathlib import Path

    from jigsaw_plugin.workload import load_workload, parse_workload

    traces = Path(os.environ.get("JIGSAW_TRACE_DIR", Path(__file__).resolve().parents[2] / "shared/traces/polytrace"))
    if not (traces / "verl").is_dir():
        pytest.skip(f"PolyTrace traces not found at {traces} (set JIGSAW_TRACE_DIR)")
    monkeypatch.setenv("JIGSAW_TRACE_DIR", str(traces))
    root = Path(__file__).resolve().parents[1]
    wl = load_workload(root / "examples/workloads/trace/a_sync4_32gpu.yaml")
    data = wl.to_dict()
    for p in data["pipelines"]:  # a small slice of the real workload keeps the test quick
        p.update(prompts_per_step=16, samples_per_prompt=4, steps=2)
    small = parse_workload(data)
    ab = run_ab(small, "verl-sync")
    assert ab["baseline"]["samples"] == 4 * 16 * 4 * 2
    assert ab["throughput_ratio"] > 0
