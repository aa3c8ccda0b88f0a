"""Migration of a real verl job's rollout requests, chosen by the coordinator's policy.

Two real verl ``main_ppo`` jobs on one coordinator running ``jigsaw`` (pool of 3): ``verl-a``
with two pretend devices (two vLLM servers, a 2-rank FSDP gang) behind the jigsaw balancer,
which declares ``migration=true`` and takes the coordinator's commands; ``verl-b`` with one
device (no migration). Checked, from three independent records:

- the coordinator's event log: each migration the policy chose (``jigsaw_migration_issued``,
  with the decision) was carried out (``jigsaw_migration_done``) or dropped with a reason;
  the request's own events show the abort on the source server, the move, and the resumed
  attempt submitted to and finished on the destination;
- verl's side: the balancer's record of each command (``migration_commands.jsonl``, written
  in verl's balancer actor) holds the vLLM server's own answer to the abort;
- verl's console metrics: every sample trained exactly once at its full length (per step,
  the tokens generated across all attempts of its requests equal verl's response lengths;
  verl reports no aborted response), and the usual grant checks of the pair hold.

Heavy (a 2-device and a 1-device main_ppo at once: ~5-12 minutes on a 2-core machine): run
it under the machine's real-run lock (``flock /tmp/jigsaw-real.lock``).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

from test_main_ppo_cpu import check_run  # this directory is on sys.path (pytest rootdir-less import)

STEPS = 2
RESPONSE_LEN = int(os.environ.get("JIGSAW_MIGRATION_RESPONSE_LEN", "256"))


def migration_problems(r, pipeline: str = "verl-a", steps: int = STEPS, samples: int = 4) -> tuple[list, dict]:
    """(what does not hold, figures) of the migrations of a run (``run_concurrent``)."""
    problems, ev = [], r.events
    issued = [e for e in ev if e.get("hook") == "jigsaw_migration_issued" and e["pipeline"] == pipeline]
    done = [e for e in ev if e.get("hook") == "jigsaw_migration_done" and e["pipeline"] == pipeline]
    dropped = [e for e in ev if e.get("hook") == "jigsaw_migration_dropped" and e["pipeline"] == pipeline]
    job = next(j for j in r.runs if Path(j.log_path).parent.name == pipeline)
    path = Path(job.log_path).parent / "migration_commands.jsonl"
    balancer = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    requests = defaultdict(list)  # (step, request id) -> its request events, in the coordinator's order
    for e in ev:
        if e.get("hook", "").startswith("jigsaw_request_") and e.get("pipeline") == pipeline:
            requests[(e["step"], e["request_id"])].append(e)
    for e in dropped:
        if not e.get("reason"):
            problems.append(f"a dropped command without a reason: {e}")
    resolved = {(e["request_id"], e["seq"]) for e in dropped if "seq" in e}
    for cmd in issued:
        if not cmd.get("decision", "").startswith(("Migrate(", "LaunchReplica(")):
            problems.append(f"a command without the policy's decision: {cmd}")
        moved = [d for d in done if d["request_id"] == cmd["request_id"] and d["dst_server"] == cmd["dst_server"]
                 and d["t"] >= cmd["t"]]
        if not moved and (cmd["request_id"], cmd["seq"]) not in resolved:
            problems.append(f"command {cmd['seq']} ({cmd['request_id']}) neither carried out nor dropped")
    kept = 0
    for d in done:
        step = next((k for (k, rid) in requests if rid == d["request_id"]), None)
        trail = [(e["hook"].removeprefix("jigsaw_request_"), e.get("replica") or e.get("dst_replica"))
                 for e in requests.get((step, d["request_id"]), [])]
        src, dst = d["src_server"], d["dst_server"]
        at = [i for i, x in enumerate(trail) if x == ("migrated", dst)]
        moved_ok = any(0 < i < len(trail) - 1 and trail[i - 1] == ("aborted", src) and trail[i + 1] == ("submitted", dst)
                       for i in at)
        if not trail or trail[0][0] != "submitted" or not moved_ok or trail[-1:] != [("finished", trail[-2][1])] \
                or [x[0] for x in trail].count("finished") != 1:
            problems.append(f"{d['request_id']}: its events {trail} are not abort on {src} -> resumed on {dst} "
                            f"-> finished once")
        mine = [b for b in balancer if b["request_id"] == d["request_id"] and b["dst_server"] == dst]
        if not mine or mine[0]["status"] != "aborted" or not (mine[0].get("server_answer") or {}).get("aborted"):
            problems.append(f"{d['request_id']}: verl's balancer/vLLM server did not abort it: {mine}")
        kept += d["generated_tokens"]
    # every sample once, at its full length: each request's finished event carries the turn's
    # total across attempts (hookspecs.py), which must equal verl's response lengths
    for m in job.steps:
        k = m["step"] - 1
        mine = {rid: es for (step, rid), es in requests.items() if step == k}
        finished = [e for es in mine.values() for e in es if e["hook"] == "jigsaw_request_finished"]
        if len(mine) != samples or len(finished) != samples:
            problems.append(f"step {k}: {len(mine)} requests, {len(finished)} finished; expected {samples} each")
        total = sum(e["generated_tokens"] for e in finished)
        if total != round(samples * m["response_length/mean"]):
            problems.append(f"step {k}: {total} tokens generated across attempts, verl's responses hold "
                            f"{samples * m['response_length/mean']:.0f}")
        if m.get("response/aborted_ratio", 0.0) != 0.0:
            problems.append(f"step {k}: verl reports aborted responses")
    figures = {"issued": len(issued), "carried_out": len(done), "dropped": len(dropped),
               "tokens_kept": kept, "balancer_commands": len(balancer),
               "refusals": len(r.scheduler.get("refusals", []))}
    return problems, figures


@pytest.mark.timeout(1500)
def test_the_jigsaw_policy_chooses_migrations_and_verl_carries_them_out(tmp_path):
    from jigsaw_plugin.adapters.verl.cpu_two_jobs import grant_problems, run_concurrent, verl_log_problems

    r = run_concurrent(tmp_path, steps=STEPS, policy="jigsaw", pool_devices=3, job_devices=(2, 1),
                       routed=("verl-a",), response_len=RESPONSE_LEN, timeout_s=1200)
    a, b = r.runs
    check_run(a, steps=STEPS, devices=2)
    check_run(b, steps=STEPS, devices=1)
    assert grant_problems(r, steps=STEPS) == []
    assert verl_log_problems(r, steps=STEPS) == []
    problems, figures = migration_problems(r)
    print(json.dumps({"wall_s": r.wall_s, "peak_pss_gib": r.peak_pss_gib, **figures,
                      "walls": [a.wall_s, b.wall_s]}))
    assert problems == []
    assert figures["carried_out"] >= 1, figures  # the policy chose at least one and verl carried it out
