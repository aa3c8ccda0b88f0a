"""Two real verl ``main_ppo`` jobs at the same time on one coordinator whose policy is
``jigsaw``: every stage of every job ran on the policy's grant, and nothing was lost.

Heavy (two main_ppo runs at once: 5-10 minutes on a 2-core machine): part of
``make integration-verl-e2e``. The refusal of a decision outside a host's capabilities is
tested on the same code path without verl in tests/test_host_scheduler.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_main_ppo_cpu import check_run  # this directory is on sys.path (pytest rootdir-less import)

#: The stages a verl job asks a grant for in this config (rule reward in the agent loop,
#: no reference, advantages on the driver: no grant).
GRANTED = ("gen", "old_log_prob", "update_actor", "weight_sync")


def _host_events(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


@pytest.mark.timeout(2400)
def test_two_verl_jobs_run_every_stage_on_the_jigsaw_policys_grants(tmp_path):
    from jigsaw_plugin.adapters.verl.cpu_two_jobs import run_concurrent

    r = run_concurrent(tmp_path, steps=2, policy="jigsaw", pool_devices=2)
    for run in r.runs:
        check_run(run, steps=2, devices=1)  # exit 0, both steps, 4 samples trained per step, KL small
    grants = [e for e in r.events if e.get("hook") == "jigsaw_stage_granted"]
    assert {e["policy"] for e in grants} == {"jigsaw"}
    for name, run in zip(("verl-a", "verl-b"), r.runs):
        mine = [(e["step"], e["stage"]) for e in grants if e["pipeline"] == name]
        # each stage of each step granted exactly once, in verl's order: nothing lost, nothing twice
        assert mine == [(k, st) for k in range(2) for st in GRANTED], mine
        # the host saw the same grants: its own event file has a lease per granted stage, same devices
        host = [e for e in _host_events(run.events_path) if e["hook"] == "jigsaw_lease_granted"]
        assert [tuple(e["devices"]) for e in host] == [tuple(e["devices"]) for e in grants if e["pipeline"] == name]
        # every sample trained at full length: the update read what the rollout generated
        ends = [e for e in _host_events(run.events_path) if e["hook"] == "jigsaw_stage_end"]
        for k in range(2):
            gen = next(e for e in ends if e["stage"] == "gen" and e["step"] == k)
            update = next(e for e in ends if e["stage"] == "update_actor" and e["step"] == k)
            assert gen["samples"] == update["samples"] == 4
    # the policy's own record: rollout replicas launched and released on the pool's devices
    launched = [e for e in r.events if e.get("hook") == "jigsaw_lease_granted" and e.get("purpose") == "rollout"]
    assert {e["pipeline"] for e in launched} == {"verl-a", "verl-b"}
    # what the policy asked beyond verl's capabilities (e.g. a tail widened onto the other
    # job's idle device: a migration) was refused with the capability named, and no run failed
    for refused in r.scheduler["refusals"]:
        assert "=false" in refused["reason"] and refused["decision"], refused
    assert r.scheduler["decisions"] > 0
    # no device was granted to both jobs at once (the policy's device trace)
    spans = [s for s in r.scheduler["trace"] if s[2]]
    for i, a in enumerate(spans):
        for b in spans[i + 1:]:
            if a[0].split()[0] != b[0].split()[0] and set(a[2]) & set(b[2]):
                assert a[4] <= b[3] or b[4] <= a[3], (a, b)
