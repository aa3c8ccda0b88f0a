"""build_from_events on hand-written hook streams: the same shape as the plan, migrations,
aborts, context switches, gating, and errors that name the event."""

import pytest

from jigsaw_plugin.graph import GraphError, build_from_events, build_from_spec
from jigsaw_plugin.workload import parse_workload

PROMPT, RESPONSE, OBS = 5, 10, 3


def _workload(algorithm="grpo", mode="sync", staleness=0, steps=2, turns=2, tp=None):
    p = {"name": "agent", "model": "qwen2.5-1.5b", "algorithm": algorithm, "mode": mode, "staleness": staleness,
         "prompts_per_step": 1, "samples_per_prompt": 2, "max_response_len": 1000,
         "prompt_len": {"dist": "const", "value": PROMPT}, "response_len": {"dist": "const", "value": RESPONSE},
         "turns": {"dist": "const", "value": turns}, "tool_latency_s": {"dist": "const", "value": 0.5},
         "observation_len": {"dist": "const", "value": OBS}, "steps": steps}
    if tp:
        p["rollout_tp"] = tp
    return parse_workload({"version": 1, "cluster": {"gpus": 2, "gpu": "h100", "gpus_per_node": 8},
                           "pipelines": [p]})


def _stage(events, step, stage, devices, t0, t1, samples=2, tokens=0):
    kw = {"pipeline": "agent", "step": step, "stage": stage, "devices": devices, "samples": samples, "tokens": tokens}
    events.append({"hook": "jigsaw_stage_start", **kw, "t": t0})
    events.append({"hook": "jigsaw_stage_end", **kw, "t": t1})


def _stream(wl, steps=2, turns=2, stages=("old_log_prob", "ref", "adv", "update_actor")):
    """What a host adapter records for ``wl``: two samples of ``turns`` turns per step on two
    replicas, the training stages on devices 0 and 1, a weight sync closing each step."""
    spec = wl.pipelines[0]
    ev = [{"hook": "jigsaw_register_pipeline", "pipeline": "agent", "spec": spec.to_dict()},
          {"hook": "jigsaw_pipeline_start", "pipeline": "agent", "t": 0.0}]
    t = 0.0
    tokens = 2 * (PROMPT + turns * RESPONSE + (turns - 1) * OBS)
    for k in range(steps):
        ev.append({"hook": "jigsaw_step_start", "pipeline": "agent", "step": k, "t": t})
        ev.append({"hook": "jigsaw_stage_start", "pipeline": "agent", "step": k, "stage": "gen", "devices": [0, 1],
                   "samples": 2, "tokens": 2 * PROMPT, "t": t})
        for i in range(2):
            rid = f"agent/{k}/{i}"
            context = PROMPT
            for turn in range(turns):
                req = {"pipeline": "agent", "step": k, "request_id": rid, "turn": turn}
                ev.append({"hook": "jigsaw_request_submitted", **req, "replica": i, "prompt_tokens": context,
                           "max_tokens": 1000, "t": t})
                ev.append({"hook": "jigsaw_request_progress", "pipeline": "agent", "step": k, "request_id": rid,
                           "generated_tokens": 4, "t": t + 0.5})
                t += 1.0
                ev.append({"hook": "jigsaw_request_finished", **req, "replica": i, "generated_tokens": RESPONSE,
                           "t": t})
                context += RESPONSE
                if turn + 1 < turns:
                    ev.append({"hook": "jigsaw_tool_call_start", **req, "t": t})
                    t += 0.5
                    ev.append({"hook": "jigsaw_tool_call_end", **req, "observation_tokens": OBS, "t": t})
                    context += OBS
        ev.append({"hook": "jigsaw_stage_end", "pipeline": "agent", "step": k, "stage": "gen", "devices": [],
                   "samples": 2, "tokens": 2 * turns * RESPONSE, "t": t})
        for stage in stages:
            _stage(ev, k, stage, [] if stage == "adv" else [0, 1], t, t + 1.0, tokens=tokens)
            t += 1.0
        ev.append({"hook": "jigsaw_weight_sync_start", "pipeline": "agent", "step": k, "version": k + 1,
                   "devices": [0, 1], "bytes": 3_080_000_000, "t": t})
        t += 0.25
        ev.append({"hook": "jigsaw_weight_sync_end", "pipeline": "agent", "step": k, "version": k + 1,
                   "devices": [0, 1], "t": t})
        ev.append({"hook": "jigsaw_step_end", "pipeline": "agent", "step": k, "t": t})
    ev.append({"hook": "jigsaw_pipeline_end", "pipeline": "agent", "t": t})
    return ev


def _shape(g):
    return {s.id: (s.kind, s.resource, s.devices, s.sizes) for s in g.nodes()}, set(g.edges())


def test_a_hand_written_run_gives_the_plan_s_graph_with_times():
    wl = _workload()
    plan = build_from_spec(wl, "agent")
    run = build_from_events(_stream(wl))
    plan.validate()
    run.validate()
    assert plan.summary()["kinds"] == run.summary()["kinds"] == {
        "adv": 2, "barrier": 2, "gen_turn": 8, "old_log_prob_shard": 4, "ref_shard": 4, "reward": 4,
        "rollout_request": 4, "tool_call": 4, "update_actor": 2, "weight_sync": 2}
    # the same node ids, kinds, resources, devices and sizes, and the same edges
    assert _shape(plan) == _shape(run)
    assert run.node("agent/s0/r1/t1").sizes == {"tokens": RESPONSE, "prompt_tokens": PROMPT + RESPONSE + OBS}
    assert run.node("agent/s1/weight_sync").attrs["version"] == 2
    # step 1 waits for step 0's weight sync, through every first turn
    assert ("agent/s0/weight_sync", "agent/s1/r0/t0", "barrier") in run.edges()
    # times come from the events; the plan has none
    t0 = run.node("agent/s0/r0/t0")
    assert (t0.start_s, t0.end_s) == (0.0, 1.0) and plan.node("agent/s0/r0/t0").start_s is None
    assert run.node("agent/s0/r0/tool0").duration_s == 0.5
    assert run.node("agent/s0/r0").start_s == 0.0 and run.node("agent/s0/r0").end_s == 2.5
    assert run.node("agent/s0/ref/1").start_s is not None
    # a timed run's critical path is by duration and ends at the last weight sync
    path = run.critical_path()
    assert path[-1] == "agent/s1/weight_sync" and run.critical_path_length() > 0


@pytest.mark.parametrize("algorithm,turns", [("ppo", 1), ("dapo", 3)])
def test_the_shapes_agree_for_other_algorithms(algorithm, turns):
    wl = _workload(algorithm=algorithm, turns=turns, tp=2)
    stages = {"ppo": ("old_log_prob", "ref", "values", "adv", "update_critic", "update_actor"),
              "dapo": ("old_log_prob", "adv", "update_actor")}[algorithm]
    plan, run = build_from_spec(wl, "agent"), build_from_events(_stream(wl, turns=turns, stages=stages))
    assert _shape(plan) == _shape(run)
    assert {s.devices for s in run.nodes(kind="gen_turn")} == {2}  # rollout_tp from the registered spec


def _one_request(*middle):
    """One request of one turn: submitted on replica 0 at t=0, the given events, finished at t=10."""
    req = {"pipeline": "p", "step": 0, "request_id": "p/0/0", "turn": 0}
    return [{"hook": "jigsaw_request_submitted", **req, "replica": 0, "prompt_tokens": 100, "max_tokens": 500,
             "t": 0.0},
            *({**req, **e} for e in middle),
            {"hook": "jigsaw_request_finished", **req, "replica": middle[-1].get("dst_replica", 1) if middle else 0,
             "generated_tokens": 300, "t": 10.0}]


def test_a_migrated_request_is_two_segments_and_a_migration():
    g = build_from_events(_one_request({"hook": "jigsaw_request_migrated", "src_replica": 0, "dst_replica": 1,
                                        "generated_tokens": 120, "t": 4.0}))
    g.validate()
    first, mig, second = g.node("p/s0/r0/t0"), g.node("p/s0/r0/t0/mig0"), g.node("p/s0/r0/t0.1")
    assert (first.start_s, first.end_s, first.sizes["tokens"], first.attrs["replica"]) == (0.0, 4.0, 120, 0)
    assert mig.kind == "migration" and mig.resource == "rollout"
    assert mig.sizes["tokens"] == 100 + 120  # prompt + generated, re-prefilled on the destination
    assert (mig.attrs["src_replica"], mig.attrs["dst_replica"]) == (0, 1)
    assert (second.start_s, second.end_s, second.sizes["tokens"], second.attrs["replica"]) == (4.0, 10.0, 180, 1)
    assert [e for e in g.edges() if e[0] != "p/s0/r0"] == [
        ("p/s0/r0/t0", "p/s0/r0/t0/mig0", "data"), ("p/s0/r0/t0/mig0", "p/s0/r0/t0.1", "data"),
        ("p/s0/r0/t0.1", "p/s0/r0/reward", "data")]


def test_abort_to_migrate_then_resubmit_is_a_migration_too():
    req = {"pipeline": "p", "step": 0, "request_id": 7, "turn": 0}
    g = build_from_events([
        {"hook": "jigsaw_request_submitted", **req, "replica": "a", "prompt_tokens": 50, "max_tokens": 99, "t": 0.0},
        {"hook": "jigsaw_request_aborted", **req, "replica": "a", "generated_tokens": 20, "reason": "migrate",
         "t": 2.0},
        {"hook": "jigsaw_request_submitted", **req, "replica": "b", "prompt_tokens": 70, "max_tokens": 79, "t": 2.5},
        {"hook": "jigsaw_request_finished", **req, "replica": "b", "generated_tokens": 60, "t": 5.0}])
    g.validate()
    assert g.summary()["kinds"] == {"gen_turn": 2, "migration": 1, "reward": 1, "rollout_request": 1}
    mig = g.node("p/s0/r7/t0/mig0")
    assert mig.sizes["tokens"] == 70 and mig.attrs["dst_replica"] == "b"
    assert g.node("p/s0/r7/t0.1").start_s == 2.5 and g.node("p/s0/r7/t0.1").sizes["tokens"] == 40


def test_a_preempted_request_resumes_as_a_second_segment_without_a_migration():
    g = build_from_events(_one_request(
        {"hook": "jigsaw_request_aborted", "replica": 0, "generated_tokens": 50, "reason": "preempt", "t": 3.0},
        {"hook": "jigsaw_request_submitted", "replica": 0, "prompt_tokens": 150, "max_tokens": 450, "t": 6.0,
         "dst_replica": 0}))
    assert "migration" not in g.summary()["kinds"]
    a, b = g.node("p/s0/r0/t0"), g.node("p/s0/r0/t0.1")
    assert (a.end_s, a.sizes["tokens"], a.attrs["ended"]) == (3.0, 50, "aborted: preempt")
    assert (b.start_s, b.sizes["tokens"]) == (6.0, 250)
    assert ("p/s0/r0/t0", "p/s0/r0/t0.1", "data") in g.edges()


def test_a_context_switch_is_attached_to_the_stage_it_makes_room_for():
    wl = _workload(steps=1)
    ev = _stream(wl, steps=1)
    at = next(i for i, e in enumerate(ev) if e["hook"] == "jigsaw_stage_start" and e["stage"] == "old_log_prob")
    ev.insert(at, {"hook": "jigsaw_context_switch", "devices": [1], "from_pipeline": "other", "to_pipeline": "agent",
                   "duration_s": 2.0, "t": ev[at]["t"]})
    ev.insert(1, {"hook": "jigsaw_context_switch", "devices": [0, 1], "from_pipeline": None, "to_pipeline": "agent",
                  "duration_s": 1.0, "t": 0.0})
    ev.insert(2, {"hook": "jigsaw_lease_granted", "pipeline": "agent", "devices": [0, 1], "purpose": "rollout",
                  "t": 0.0})
    g = build_from_events(ev)
    g.validate()
    rollout_sw, train_sw = sorted(g.nodes(kind="context_switch"), key=lambda s: s.start_s)
    assert rollout_sw.resource == "rollout" and rollout_sw.devices == 2 and rollout_sw.duration_s == 1.0
    assert train_sw.resource == "train" and train_sw.attrs["for_stage"] == "old_log_prob"
    assert {(u, v) for u, v, k in g.edges("order") if u == train_sw.id} == {
        (train_sw.id, "agent/s0/old_log_prob/0"), (train_sw.id, "agent/s0/old_log_prob/1")}


def test_async_gating_follows_the_registered_staleness_or_else_the_clock():
    wl = _workload(mode="async", staleness=1, steps=3)
    ev = _stream(wl, steps=3)
    gates = lambda g: {(g.node(u).step, g.node(v).step) for u, v, k in g.edges("barrier")  # noqa: E731
                       if g.node(u).kind == "weight_sync"}
    assert gates(build_from_events(ev)) == gates(build_from_spec(wl, "agent")) == {(0, 2)}
    # without a registered mode: the last weight sync that ended before the step began
    unregistered = [e for e in ev if e["hook"] != "jigsaw_register_pipeline"]
    assert gates(build_from_events(unregistered)) == {(0, 1), (1, 2)}


def test_pipeline_filter_and_an_unfinished_run():
    wl = _workload(steps=2)
    ev = _stream(wl, steps=2)
    cut = next(i for i, e in enumerate(ev) if e["hook"] == "jigsaw_request_finished" and e["step"] == 1)
    g = build_from_events(ev[:cut])  # step 1's first request never finished
    g.validate()
    assert len(g.nodes(kind="reward", step=1)) == 0 and len(g.nodes(kind="weight_sync")) == 1
    assert build_from_events(ev, pipeline="nope").summary()["nodes"] == 0


@pytest.mark.parametrize("event,message", [
    ({"hook": "jigsaw_bogus"}, "unknown hook 'jigsaw_bogus'"),
    ({"hook": "jigsaw_request_finished", "pipeline": "p", "step": 0, "turn": 0, "t": 1.0},
     r"event 0 \(jigsaw_request_finished\): missing request_id, replica, generated_tokens"),
    ({"hook": "jigsaw_stage_start", "pipeline": "p", "step": 0, "stage": "dance", "devices": [], "t": 1.0},
     "stage 'dance'; allowed: gen, reward"),
])
def test_bad_events_name_the_problem(event, message):
    with pytest.raises(GraphError, match=message):
        build_from_events([event])
