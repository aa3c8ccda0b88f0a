"""Two real verl ``main_ppo`` jobs at the same time on one coordinator running a policy.

- Under ``jigsaw``: every stage of every job ran on the policy's grant (the coordinator's
  event log, the job's own event file, and verl's own console log: its stage timers match
  the granted spans), and nothing was lost (verl trained every generated sample once, at
  its full length: its token counts equal the rollout's).
- Under a policy that asks one job for a request migration (``refusing_policy.py``): the
  coordinator refuses it naming verl's capability, that job stops with the reason in its log
  (no hang), and the other job finishes its steps.

Heavy (two main_ppo runs at once: 4-15 minutes each on a 2-core machine): part of
``make integration-verl-e2e``; run it under the machine's real-run lock.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from test_main_ppo_cpu import check_run  # this directory is on sys.path (pytest rootdir-less import)


@pytest.mark.timeout(2400)
def test_two_verl_jobs_run_every_stage_on_the_jigsaw_policys_grants(tmp_path):
    from jigsaw_plugin.adapters.verl.cpu_two_jobs import grant_problems, run_concurrent, verl_log_problems

    r = run_concurrent(tmp_path, steps=2, policy="jigsaw", pool_devices=2)
    for run in r.runs:
        check_run(run, steps=2, devices=1)  # exit 0, both steps, 4 samples trained per step, KL small
    # each stage granted once in order, the hosts saw the same grants, every sample trained,
    # refusals name the capability, no device granted to both jobs at once
    assert grant_problems(r, steps=2) == []
    # verl's own log agrees: its timers match the granted spans, its token counts the rollout's
    assert verl_log_problems(r, steps=2) == []
    grants = [e for e in r.events if e.get("hook") == "jigsaw_stage_granted"]
    assert {e["policy"] for e in grants} == {"jigsaw"}
    # the policy's own record: rollout replicas launched on the pool's devices for both jobs
    launched = [e for e in r.events if e.get("hook") == "jigsaw_lease_granted" and e.get("purpose") == "rollout"]
    assert {e["pipeline"] for e in launched} == {"verl-a", "verl-b"}
    assert r.scheduler["decisions"] > 0


@pytest.mark.timeout(2400)
def test_a_decision_verl_cannot_carry_out_is_refused_and_the_job_stops_with_the_reason(tmp_path):
    import refusing_policy

    from jigsaw_plugin.adapters.verl.cpu_two_jobs import run_concurrent

    r = run_concurrent(tmp_path, steps=2, policy=refusing_policy.NAME, pool_devices=2,
                       policy_modules=("refusing_policy",), timeout_s=900)
    a, b = r.runs
    check_run(a, steps=2, devices=1)  # the other job is not affected
    refused = [e for e in r.events if e.get("hook") == "jigsaw_decision_refused"]
    assert [e["pipeline"] for e in refused] == [refusing_policy.TARGET], refused
    assert "migration=false" in refused[0]["reason"] and "absorb" in refused[0]["decision"]
    log = Path(b.log_path).read_text(errors="replace")
    assert b.returncode not in (0, -9), b  # it stopped by itself (-9: killed at the timeout, a hang)
    assert "LeaseError" in log and "outside the host's capabilities" in log and "migration=false" in log
    # it ran its first step on the policy's grants, and never started the refused rollout
    assert [m["step"] for m in b.steps] == [1]
    grants_b = [(e["step"], e["stage"]) for e in r.events
                if e.get("hook") == "jigsaw_stage_granted" and e["pipeline"] == refusing_policy.TARGET]
    assert grants_b == [(0, "gen"), (0, "old_log_prob"), (0, "update_actor"), (0, "weight_sync")]
