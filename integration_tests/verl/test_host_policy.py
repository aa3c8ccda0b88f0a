"""Two real verl ``main_ppo`` jobs at the same time on one coordinator whose policy is
``jigsaw``: every stage of every job ran on the policy's grant, and nothing was lost.

Heavy (two main_ppo runs at once: 5-15 minutes on a 2-core machine): part of
``make integration-verl-e2e``. The refusal of a decision outside a host's capabilities is
tested on the same code path without verl in tests/test_host_scheduler.py.
"""

from __future__ import annotations

import pytest

from test_main_ppo_cpu import check_run  # this directory is on sys.path (pytest rootdir-less import)


@pytest.mark.timeout(2400)
def test_two_verl_jobs_run_every_stage_on_the_jigsaw_policys_grants(tmp_path):
    from jigsaw_plugin.adapters.verl.cpu_two_jobs import grant_problems, run_concurrent

    r = run_concurrent(tmp_path, steps=2, policy="jigsaw", pool_devices=2)
    for run in r.runs:
        check_run(run, steps=2, devices=1)  # exit 0, both steps, 4 samples trained per step, KL small
    # each stage granted once in order, the hosts saw the same grants, every sample trained,
    # refusals name the capability, no device granted to both jobs at once
    assert grant_problems(r, steps=2) == []
    grants = [e for e in r.events if e.get("hook") == "jigsaw_stage_granted"]
    assert {e["policy"] for e in grants} == {"jigsaw"}
    # the policy's own record: rollout replicas launched on the pool's devices for both jobs
    launched = [e for e in r.events if e.get("hook") == "jigsaw_lease_granted" and e.get("purpose") == "rollout"]
    assert {e["pipeline"] for e in launched} == {"verl-a", "verl-b"}
    assert r.scheduler["decisions"] > 0
