"""verl's side of policy-chosen migration, without verl or Ray: the jigsaw balancer carries a
coordinator's ``HostMigration`` out with its own ``migrate`` (abort on the source server,
resume on the destination) or drops it cleanly; the session declares ``migration`` only for
two or more servers behind a balancer taking this coordinator's commands for this pipeline."""

from __future__ import annotations

import types

from jigsaw_plugin.adapters.verl.options import JigsawOptions
from jigsaw_plugin.adapters.verl.router import JigsawLoadBalancer
from jigsaw_plugin.adapters.verl.session import JigsawSession
from jigsaw_plugin.runtime.host_requests import HostMigration

SPEC = {"algorithm": "grpo", "prompts_per_step": 2, "samples_per_prompt": 2, "max_response_len": 64,
        "max_prompt_len": 64, "steps": 2, "model": "tiny-qwen2"}


class _Server:
    """A CPU stand-in for a vLLM server's actor handle (records aborts)."""

    def __init__(self):
        self.aborted = []
        self.abort_request = types.SimpleNamespace(remote=lambda rid: self.aborted.append(rid) or f"ref:{rid}")


def test_the_balancer_carries_a_command_out_and_the_resumed_attempt_lands_on_the_destination():
    a, b = _Server(), _Server()
    lb = JigsawLoadBalancer({"a": a, "b": b}, {"router_class": "x", "pipeline": "p"})
    assert lb.binding() == {"servers": ["a", "b"], "coordinator": None, "pipeline": "p"}
    lb.acquire_server("r1", jigsaw_vllm_id="r1#0", jigsaw_prompt_tokens=5, jigsaw_max_tokens=10)
    lb.acquire_server("r2", jigsaw_vllm_id="r2#0", jigsaw_prompt_tokens=5, jigsaw_max_tokens=10)
    assert lb.carry_out(HostMigration("p", "r2", "b", "a", 1, 0.0)) == "aborted"
    assert b.aborted == ["r2#0"] and a.aborted == []
    lb.release_server("b", request_id="r2")
    lb.attempt_done("r2", "b", 3, "aborted")  # verl's client: the aborted attempt returned
    assert lb.acquire_server("r2", jigsaw_vllm_id="r2#1", jigsaw_prompt_tokens=8, jigsaw_max_tokens=7)[0] == "a"
    ev = [(e["hook"], e.get("replica") or e.get("dst_replica"), e.get("generated_tokens"))
          for e in lb.events() if e["request_id"] == "r2"]
    assert ev == [("jigsaw_request_submitted", "b", None), ("jigsaw_request_aborted", "b", 3),
                  ("jigsaw_request_migrated", "a", 3), ("jigsaw_request_submitted", "a", None)]
    assert [c["status"] for c in lb.migration_commands()] == ["aborted"]
    # the resumed attempt generates 4 more: the hooks carry the turn's total (hookspecs.py)
    lb.attempt_done("r2", "a", 4, "completed")
    assert [e["generated_tokens"] for e in lb.events()
            if e["request_id"] == "r2" and e["hook"] == "jigsaw_request_finished"] == [7]


def test_a_command_the_balancer_cannot_carry_out_is_dropped_not_raised():
    a, b = _Server(), _Server()
    lb = JigsawLoadBalancer({"a": a, "b": b}, {"router_class": "x", "pipeline": "p"})
    lb.acquire_server("r1", jigsaw_vllm_id="r1#0")
    lb.attempt_done("r1", "a", 9, "completed")
    lb.release_server("a", request_id="r1")
    assert lb.carry_out(HostMigration("p", "r1", "a", "b", 1, 0.0)).startswith("dropped: the request is not in flight")
    lb.acquire_server("r3", jigsaw_vllm_id="r3#0")  # lands on a (least in flight)
    assert "runs on a, not b" in lb.carry_out(HostMigration("p", "r3", "b", "a", 2, 0.0))
    assert a.aborted == b.aborted == []
    assert [c["status"] for c in lb.migration_commands()] == ["dropped", "dropped"]


def test_the_session_declares_migration_only_for_two_servers_behind_this_coordinators_balancer():
    s = JigsawSession(JigsawOptions(pipeline="p", coordinator="jig", policy="observe"), n_devices=2)  # no Ray here
    both = {"servers": ["a", "b"], "coordinator": "jig", "pipeline": "p"}
    host = s.host_pipeline({**SPEC, "rollout_binding": both})
    assert host.capabilities.migration and host.servers == ("a", "b")
    for binding in (None, {**both, "servers": ["a"]}, {**both, "coordinator": None}, {**both, "pipeline": "q"}):
        host = s.host_pipeline({**SPEC, "rollout_binding": binding})
        assert not host.capabilities.migration and host.servers == ()


def test_a_server_that_does_not_abort_drops_the_command_and_the_request_goes_on_where_it_is():
    a, b = _Server(), _Server()
    b.abort_request = types.SimpleNamespace(remote=lambda rid: {"aborted": False, "error": f"Request {rid} not found"})
    lb = JigsawLoadBalancer({"a": a, "b": b}, {"router_class": "x", "pipeline": "p"})
    lb.acquire_server("r1", jigsaw_vllm_id="r1#0")
    lb.acquire_server("r2", jigsaw_vllm_id="r2#0")  # on b
    out = lb.carry_out(HostMigration("p", "r2", "b", "a", 1, 0.0))
    assert out == "dropped: the server did not abort it: Request r2#0 not found"
    lb.attempt_done("r2", "b", 12, "completed")  # it finished where it ran
    assert [e["hook"] for e in lb.events() if e["request_id"] == "r2"] == ["jigsaw_request_submitted",
                                                                            "jigsaw_request_finished"]
    assert lb.migration_commands()[0]["status"] == "dropped"
