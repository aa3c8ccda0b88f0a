"""A real verl ``main_ppo`` job and a real OpenRLHF job at the same time, sharing one
coordinator whose policy is ``jigsaw`` (``integration_tests/openrlhf/mixed.py``).

Shows: the policy's grants were carried out by both hosts (the coordinator's event log and
each host's own event file agree); the policy chose which of OpenRLHF's requests to migrate
(from the request rows OpenRLHF forwards) and OpenRLHF carried each command out through its
abort + resume path (its own event file and its rollout log show the move), giving the
emptied engine back during the rollout; every sample of both jobs trained exactly once at
its full length, and nothing was granted twice.

Run from ``.venv-verl`` (verl's driver) with ``.venv-openrlhf`` built beside it:

    flock /tmp/jigsaw-real.lock .venv-verl/bin/python -m pytest -q -p no:cacheprovider \\
        integration_tests/test_mixed_hosts.py

10-20 minutes on the shared 2-core machine. Skips, with the reason, where either host is missing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "openrlhf"))


def _skip_reason() -> str | None:
    from importlib.util import find_spec

    import mixed

    if find_spec("verl") is None:
        return "verl is not installed here (run from .venv-verl: make venv-verl)"
    if not mixed.ORL_PYTHON.exists():
        return f"{mixed.ORL_PYTHON} missing (make venv-openrlhf)"
    return None


@pytest.mark.timeout(2400)
def test_a_verl_job_and_an_openrlhf_job_share_one_coordinator_under_the_jigsaw_policy(tmp_path):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    import mixed

    # a pool of 3: verl's share 1, OpenRLHF's 2 (both its engines)
    r = mixed.run_mixed(tmp_path, mixed.MixedSettings(policy="jigsaw", pool_devices=3, orl_active_engines=2))
    logs = "; ".join(j.log_path for j in r.jobs)
    # both exit 0; every stage of both jobs granted once per step in order; each host ran on
    # its grants (its own event file); every sample trained once, migrated requests resumed
    # with their prefix; no device held idle for a rollout; refusals name the capability;
    # no device granted to both jobs at once
    assert mixed.problems(r) == [], logs
    grants = [e for e in r.events if e.get("hook") == "jigsaw_stage_granted"]
    assert {e["policy"] for e in grants} == {"jigsaw"}
    # the jobs shared the pool: some stage of one was granted while the other was mid-run
    spans = {name: (min(e["t"] for e in grants if e["pipeline"] == name),
                    max(e["t"] for e in grants if e["pipeline"] == name)) for name in (mixed.VERL, mixed.ORL)}
    (a0, a1), (b0, b1) = spans.values()
    assert a0 < b1 and b0 < a1, spans
    # OpenRLHF's engines given back mid-rollout (requests moved away on the policy's say, a
    # partial release of its grant) only in rollouts that ran on both engines
    two = {e["step"] for e in grants if e["pipeline"] == mixed.ORL and e["stage"] == "gen" and len(e["devices"]) == 2}
    assert {e["step"] for e in mixed.partial_releases(r)} <= two
    # the policy chose OpenRLHF migrations and OpenRLHF carried them out: each done command
    # is a move in OpenRLHF's own event file (mixed.problems) and a line of its rollout log
    moves = mixed.policy_migrations(r)
    done = [m for m in moves if m["status"] == "done"]
    assert two and done, (two, moves)
    orl_log = Path(r.jobs[1].log_path).read_text()
    for m in done:
        assert f"policy command {m['seq']} moves {m['request_id']} engine {m['src_server']} -> " \
               f"{m['dst_server']}: moved" in orl_log, m
