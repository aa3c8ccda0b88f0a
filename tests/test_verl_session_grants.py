"""The verl session asks the coordinator a grant per stage (no verl, no Ray: the client is a
recording stand-in for the coordinator's Ray handle)."""

from __future__ import annotations

import pytest

from jigsaw_plugin.adapters.verl.options import parse_options
from jigsaw_plugin.adapters.verl.session import JigsawSession, model_profile_of
from jigsaw_plugin.errors import SpecError


class RecordingClient:
    """Stand-in for ``CoordinatorClient`` (a Ray actor handle cannot exist here)."""

    def __init__(self, policy: str = "jigsaw"):
        self.calls: list = []
        self.policy = policy

    def info(self):
        return {"policy": self.policy}

    def register_pipeline(self, pipeline, spec, host=None):
        self.calls.append(("register", pipeline, host))

    def acquire(self, pipeline, purpose, n, default=None, step=None, stage=None):
        self.calls.append(("acquire", step, stage, default))
        return (1,)

    def release(self, pipeline, devices, step=None, stage=None, tokens=None):
        self.calls.append(("release", step, stage, tokens))

    def flush(self):
        pass

    def unregister_pipeline(self, pipeline):
        pass


SPEC = {"algorithm": "dapo", "prompts_per_step": 2, "samples_per_prompt": 2, "max_response_len": 16,
        "max_prompt_len": 64, "steps": 1, "model": "/m/tiny-qwen2-chat"}


def test_one_grant_per_stage_with_its_step_and_the_hosts_own_devices_as_fallback():
    s = JigsawSession(parse_options({"pipeline": "a"}), n_devices=1)
    s.client = RecordingClient()
    s.start(SPEC)
    host = s.client.calls[0][2]
    assert host.model_profile == "tiny-qwen2" and not host.capabilities.training_resizable
    s.reporter.step_start()
    assert s.devices_for("gen", (0,)) == (1,)
    assert s.devices_for("reward", (0,)) == (1,)  # rides on the rollout's grant
    s.rollout_tokens = 40
    for stage in ("old_log_prob", "update_actor", "weight_sync"):
        s.devices_for(stage, (0,))
        s.stage_done(stage)
    s.finish()
    assert s.client.calls[1:] == [
        ("acquire", 0, "gen", (0,)),
        ("release", 0, "gen", 40),  # the rollout ends when training starts
        ("acquire", 0, "old_log_prob", (0,)), ("release", 0, "old_log_prob", None),
        ("acquire", 0, "update_actor", (0,)), ("release", 0, "update_actor", None),
        ("acquire", 0, "weight_sync", (0,)), ("release", 0, "weight_sync", None),
    ]


def test_a_fifo_lease_coordinator_gets_no_declaration():
    s = JigsawSession(parse_options({"pipeline": "a"}), n_devices=1)
    s.client = RecordingClient("fifo-lease")
    s.start({"algorithm": "dapo"})  # v0's spec: not enough for a policy, fine for leases
    assert s.client.calls == [("register", "a", None)]


def test_unknown_model_and_bad_scheduler_are_spec_errors():
    with pytest.raises(SpecError, match="model_profile"):
        model_profile_of(parse_options({}), "/models/my-own-llm")
    assert model_profile_of(parse_options({}), "/x/Qwen2.5-0.5B-Instruct") == "qwen2.5-0.5b"
    with pytest.raises(SpecError, match="scheduler"):
        parse_options({"scheduler": "round-robin"})
    with pytest.raises(SpecError, match="pool_devices"):
        parse_options({"pool_devices": 0})


def _run_with(tmp_path, grants_b, samples_b=4, refusal="migration=false"):
    """A ConcurrentResult as run_concurrent returns it, written by hand (no verl here)."""
    import json

    from jigsaw_plugin.adapters.verl.cpu_e2e import E2EResult
    from jigsaw_plugin.adapters.verl.cpu_two_jobs import GRANTED_STAGES, ConcurrentResult

    events, runs = [], []
    for name, stages, samples in (("verl-a", GRANTED_STAGES, 4), ("verl-b", grants_b, samples_b)):
        host = []
        for st in stages:
            events.append({"hook": "jigsaw_stage_granted", "pipeline": name, "step": 0, "stage": st, "devices": [0]})
            host.append({"hook": "jigsaw_lease_granted", "devices": [0]})
        host += [{"hook": "jigsaw_stage_end", "stage": st, "step": 0, "samples": samples}
                 for st in ("gen", "update_actor")]
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(e) + "\n" for e in host))
        runs.append(E2EResult(0, 1.0, 1, "log", str(path)))
    report = {"refusals": [{"reason": refusal, "decision": "x"}],
              "trace": [["verl-a gen s0", "rollout", [0], 0.0, 1.0], ["verl-b gen s0", "rollout", [0], 1.0, 2.0]]}
    return ConcurrentResult("jigsaw", 2, runs, 1.0, events, report, 0.0)


def test_grant_checks_pass_a_good_run_and_name_what_is_wrong(tmp_path):
    from jigsaw_plugin.adapters.verl.cpu_two_jobs import GRANTED_STAGES, grant_problems

    assert grant_problems(_run_with(tmp_path, GRANTED_STAGES), steps=1) == []
    missing = grant_problems(_run_with(tmp_path, GRANTED_STAGES[:-1]), steps=1)
    assert any("verl-b: grants" in p for p in missing)
    lost = grant_problems(_run_with(tmp_path, GRANTED_STAGES, samples_b=3), steps=1)
    assert any("samples generated / trained" in p for p in lost)
    assert any("names no capability" in p for p in grant_problems(_run_with(tmp_path, GRANTED_STAGES, refusal="no"),
                                                                   steps=1))


def _verl_job(tmp_path, name, gen_tokens=64, trained=294, aborted=0.0, gen_s=2.0, verl_gen_s=2.0, dup=False):
    """One job's console log (verl's step lines) and event file, written by hand (no verl here)."""
    import json

    from jigsaw_plugin.adapters.verl.cpu_e2e import E2EResult, parse_step_metrics

    line = (f"(TaskRunnerV1 pid=1) step:1 - perf/total_num_tokens:{trained} - prompt_length/mean:57.5 - "
            f"response_length/mean:16.0 - response/aborted_ratio:{aborted} - timing_s/gen:{verl_gen_s} - "
            f"timing_s/old_log_prob:0.1 - timing_s/update_actor:0.2 - training/global_step:1 - x:1\n")
    log = tmp_path / f"{name}.log"
    log.write_text(line * (2 if dup else 1))
    events = []
    for stage, start, dur, tokens in (("gen", 0.0, gen_s, gen_tokens), ("old_log_prob", 3.0, 0.1, 294),
                                      ("update_actor", 4.0, 0.2, 294)):
        events.append({"hook": "jigsaw_stage_start", "step": 0, "stage": stage, "t": start, "tokens": tokens})
        events.append({"hook": "jigsaw_stage_end", "step": 0, "stage": stage, "t": start + dur, "tokens": tokens})
    path = tmp_path / f"{name}.events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return E2EResult(0, 1.0, 1, str(log), str(path), parse_step_metrics(log.read_text()))


def test_verl_log_checks_pass_a_good_run_and_name_what_verl_contradicts(tmp_path):
    from jigsaw_plugin.adapters.verl.cpu_two_jobs import ConcurrentResult, verl_log_problems

    def problems(**bad):
        runs = [_verl_job(tmp_path, "a"), _verl_job(tmp_path, "b", **bad)]
        return verl_log_problems(ConcurrentResult("jigsaw", 2, runs, 1.0, [], {}, 0.0), steps=1)

    assert problems() == []
    assert any("verl trained 3.00 samples" in p for p in problems(trained=220.5))
    assert any("aborted" in p for p in problems(aborted=0.25))
    assert any("generated tokens" in p for p in problems(gen_tokens=48))
    assert any("timing_s/gen" in p for p in problems(verl_gen_s=5.0))  # verl's gen ran outside the granted span
    assert any("step lines [1, 1]" in p for p in problems(dup=True))  # a step logged twice
