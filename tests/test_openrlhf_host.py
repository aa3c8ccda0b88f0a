"""What an OpenRLHF run declares to a coordinator policy (adapters/openrlhf/host.py): its
settings from OpenRLHF's own arguments, its capabilities, and a clear refusal of runs a
policy cannot plan. No OpenRLHF needed: the arguments are OpenRLHF's nested namespace."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from jigsaw_plugin.adapters.openrlhf.host import model_profile_of, openrlhf_host_pipeline
from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.runtime.host_executor import HostPipeline, host_workload


def args(**over):
    """OpenRLHF 0.11.2's parsed arguments, the fields host.py reads (as the CPU tests set them)."""
    a = NS(train=NS(async_enable=False, colocate_all=False), vllm=NS(tensor_parallel_size=1),
           eval=NS(dataset=None), algo=NS(advantage=NS(estimator="group_norm")),
           actor=NS(model_name_or_path="/tmp/x/tiny-qwen2-tok"),
           rollout=NS(batch_size=4, n_samples_per_prompt=2, max_new_tokens=128), data=NS(max_len=512))
    for path, value in over.items():
        obj, *rest = path.split("__")
        target = getattr(a, obj)
        for name in rest[:-1]:
            target = getattr(target, name)
        setattr(target, rest[-1], value)
    return a


def test_a_run_declares_its_settings_and_what_openrlhf_can_do():
    host = openrlhf_host_pipeline("orl", args(), n_engines=2, n_train=1, active_engines=None, steps=2,
                                  request_migration=True)
    assert (host.model_profile, host.algorithm, host.prompts_per_step, host.samples_per_prompt) == \
        ("tiny-qwen2", "grpo", 4, 2)
    assert (host.max_response_len, host.prompt_len, host.steps, host.devices) == (128, 384, 2, 2)
    caps = host.capabilities
    assert (caps.framework, caps.stage_grants, caps.rollout_replicas, caps.replicas_elastic) == \
        ("openrlhf", "phase", 2, False)
    assert caps.replica_release and caps.migration and not caps.training_resizable and caps.training_width == 1
    assert host.servers == ("0", "1")  # its engines, as its request events name them
    # it crosses to the coordinator as the frozen object and back from a dict unchanged
    assert HostPipeline.from_dict(host.to_dict()) == host
    host_workload(3, [host])  # a valid workload entry for the policy


def test_the_share_and_the_release_follow_the_adapters_settings():
    one = openrlhf_host_pipeline("orl", args(algo__advantage__estimator="gae"), n_engines=3, n_train=1,
                                 active_engines=1, steps=1, request_migration=False)
    assert one.devices == 1 and one.algorithm == "ppo" and one.capabilities.rollout_replicas == 3
    assert not one.capabilities.replica_release  # least-in-flight: no tail consolidation, no early release
    wide = openrlhf_host_pipeline("orl", args(), n_engines=1, n_train=2, active_engines=None, steps=1,
                                  request_migration=True)
    assert wide.devices == 2 and wide.capabilities.training_width == 2


@pytest.mark.parametrize("over, field", [
    ({"train__async_enable": True}, "--train.async_enable"),
    ({"vllm__tensor_parallel_size": 2}, "--vllm.tensor_parallel_size"),
    ({"eval__dataset": "e.jsonl"}, "--eval.dataset"),
    ({"algo__advantage__estimator": "magic"}, "--algo.advantage.estimator"),
    ({"actor__model_name_or_path": "/m/llama-3-8b"}, "--actor.model_name_or_path"),
])
def test_a_run_the_policy_cannot_plan_is_refused_naming_the_argument(over, field):
    with pytest.raises(SpecError) as e:
        openrlhf_host_pipeline("orl", args(**over), n_engines=2, n_train=1, active_engines=None, steps=2,
                               request_migration=True)
    assert e.value.field == field
    if field != "--algo.advantage.estimator":
        assert "fifo-lease" in str(e.value)  # the way out


def test_steps_and_engines_must_exist():
    with pytest.raises(SpecError, match="--vllm.num_engines"):
        openrlhf_host_pipeline("orl", args(), n_engines=0, n_train=1, active_engines=None, steps=2,
                               request_migration=True)
    with pytest.raises(SpecError, match="orl: steps"):
        openrlhf_host_pipeline("orl", args(), n_engines=1, n_train=1, active_engines=None, steps=0,
                               request_migration=True)


def test_model_profile_from_the_model_folder():
    assert model_profile_of("/models/Qwen2.5-0.5B-Instruct/") == "qwen2.5-0.5b"
    assert model_profile_of("Qwen2.5-Math-7B") == "qwen2.5-math-7b"


def test_a_refusal_raised_in_a_ray_actor_reaches_the_command_line_as_one_line():
    from jigsaw_plugin.adapters.openrlhf.train_ppo_ray import spec_error_in

    err = SpecError("--train.async_enable", True, "off under a coordinator policy")
    wrapped = RuntimeError("task failed")
    wrapped.cause = err  # how Ray's RayTaskError carries an actor method's exception
    assert spec_error_in(wrapped) == str(err)
    died = RuntimeError("The actor died because of an error raised in its creation task\n  File x\n"
                        f"jigsaw_plugin.errors.SpecError: {err}")  # an actor constructor's error: text only
    assert spec_error_in(died) == str(err)
    assert spec_error_in(RuntimeError("unrelated")) is None
