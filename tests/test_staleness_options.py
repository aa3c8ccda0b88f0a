"""Bounded staleness as an adapter option: verl's ``+jigsaw.staleness`` and OpenRLHF's
``--jigsaw.staleness`` are validated with a clear error, checked against the host's trainer
mode (a sync trainer is on-policy), written into the host's own bound (verl's
``max_off_policy_threshold``, OpenRLHF's ``--train.async_queue_size``) and registered, so the
coordinator's policy plans the pipeline under it. No verl, OpenRLHF or Ray import."""

from __future__ import annotations

from dataclasses import replace

import pytest

from jigsaw_plugin.adapters.openrlhf.config import JigsawUsageError, parse_jigsaw_flags
from jigsaw_plugin.adapters.openrlhf.config import resolve_staleness as resolve_openrlhf
from jigsaw_plugin.adapters.verl.options import OFF_POLICY_THRESHOLD_KEY, parse_options, resolve_staleness
from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.manager import get_plugin_manager
from jigsaw_plugin.runtime.capabilities import HostCapabilities
from jigsaw_plugin.runtime.host_executor import HostPipeline, host_workload
from jigsaw_plugin.runtime.lease_schedulers import CoordinatorConfig, make_scheduler


class SamplerNode(dict):
    """Stands in for verl's ``trainer.v1.sampler`` DictConfig (no omegaconf in the unit-test
    env): ``get`` by key, assignment by attribute, as resolve_staleness uses it."""

    def __setattr__(self, key, value):
        self[key] = value


# --- verl -------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [-1, True, "2", 1.5])
def test_verl_staleness_bad_values_name_the_option_the_value_and_what_is_allowed(bad):
    with pytest.raises(SpecError) as e:
        parse_options({"staleness": bad}, default_pipeline="p")
    text = str(e.value)
    assert "+jigsaw.staleness" in text and repr(bad) in text and "an integer >= 0" in text


def test_verl_staleness_travels_in_the_frozen_options():
    options = parse_options({"staleness": 2}, default_pipeline="p")
    assert options.staleness == 2 and parse_options({}, default_pipeline="p").staleness is None
    with pytest.raises(AttributeError):
        options.staleness = 3  # frozen: what the driver validated is what the workers get


def test_verl_sync_trainer_refuses_a_bound_and_names_the_async_mode():
    assert resolve_staleness(parse_options({"staleness": 0}, "p"), "sync") == 0
    assert resolve_staleness(parse_options({}, "p"), "sync") == 0
    with pytest.raises(SpecError) as e:
        resolve_staleness(parse_options({"staleness": 2}, "p"), "sync")
    text = str(e.value)
    assert "+jigsaw.staleness" in text and "2" in text and "jigsaw_colocate_async" in text


def test_verl_async_trainer_bound_becomes_verls_off_policy_threshold():
    sampler = SamplerNode(max_off_policy_threshold=8, max_off_policy_strategy="drop")  # verl's default
    assert resolve_staleness(parse_options({"staleness": 2}, "p"), "colocate_async", sampler) == 2
    assert sampler["max_off_policy_threshold"] == 3  # lag <= threshold - 1 (replay_buffer.py:528)
    # without the option the bound is verl's own threshold's
    assert resolve_staleness(parse_options({}, "p"), "colocate_async", SamplerNode(max_off_policy_threshold=4)) == 3


def test_verl_async_trainer_conflicts_and_unbounded_runs_are_clear_errors():
    with pytest.raises(SpecError) as e:  # the user set another threshold by hand
        resolve_staleness(parse_options({"staleness": 2}, "p"), "colocate_async",
                          SamplerNode(max_off_policy_threshold=5))
    assert "+jigsaw.staleness" in str(e.value) and OFF_POLICY_THRESHOLD_KEY in str(e.value)
    with pytest.raises(SpecError, match="is null"):  # verl bounds nothing, nor does the option
        resolve_staleness(parse_options({}, "p"), "colocate_async", SamplerNode(max_off_policy_threshold=None))


# --- OpenRLHF ---------------------------------------------------------------------------

def test_openrlhf_sync_trainer_is_staleness_0_and_refuses_a_bound():
    config, rest = parse_jigsaw_flags(["--jigsaw.enable", "--actor.x", "1"])
    assert config.staleness is None and rest == ["--actor.x", "1"]
    assert resolve_openrlhf(None, rest) == (0, rest) and resolve_openrlhf(0, rest) == (0, rest)
    with pytest.raises(JigsawUsageError) as e:
        parse_jigsaw_flags(["--jigsaw.enable", "--jigsaw.staleness", "2"])
    text = str(e.value)
    assert "--jigsaw.staleness: got 2" in text and "--train.async_enable" in text


def test_openrlhf_async_bound_sets_the_queue_or_must_agree_with_it():
    config, rest = parse_jigsaw_flags(["--jigsaw.enable", "--jigsaw.staleness", "2", "--train.async_enable"])
    assert config.staleness == 2 and rest == ["--train.async_enable", "--train.async_queue_size", "2"]
    config, rest = parse_jigsaw_flags(["--jigsaw.enable", "--train.async_enable", "--train.async_queue_size=3"])
    assert config.staleness is None and rest == ["--train.async_enable", "--train.async_queue_size=3"]
    assert resolve_openrlhf(None, rest) == (3, rest)  # the queue's own bound
    assert resolve_openrlhf(None, ["--train.async_enable"])[0] == 1  # OpenRLHF's default queue
    with pytest.raises(JigsawUsageError, match="allowed: 3 .*--train.async_queue_size 3"):
        parse_jigsaw_flags(["--jigsaw.enable", "--jigsaw.staleness=2", "--train.async_enable",
                            "--train.async_queue_size", "3"])
    with pytest.raises(JigsawUsageError, match="got 0; allowed: an integer >= 1 with --train.async_enable"):
        parse_jigsaw_flags(["--jigsaw.enable", "--jigsaw.staleness", "0", "--train.async_enable"])


@pytest.mark.parametrize("bad", ["-1", "x", "1.5", "inf"])
def test_openrlhf_staleness_bad_values_are_one_line(bad):
    with pytest.raises(JigsawUsageError, match=f"--jigsaw.staleness: got '{bad}'; allowed: int >= 0"):
        parse_jigsaw_flags(["--jigsaw.enable", "--jigsaw.staleness", bad])


# --- the registration the coordinator's policy plans with -------------------------------

def _host(staleness: int | None) -> HostPipeline:
    extra = {} if staleness is None else {"staleness": staleness}
    return HostPipeline("a", "tiny-qwen2", "grpo", 2, 2, 32, 16, 3, 1, HostCapabilities("verl"), **extra)


def test_registered_bound_reaches_the_policys_plan():
    assert _host(None).staleness == 0  # hosts that declare none stay synchronous
    again = HostPipeline.from_dict(_host(2).to_dict())
    assert again == _host(2)
    raw = _host(2).to_dict()
    del raw["staleness"]  # an older adapter's registration
    assert HostPipeline.from_dict(raw).staleness == 0
    spec = host_workload(2, [_host(2)]).pipelines[0]
    assert (spec.mode, spec.staleness) == ("async", 2)
    s = make_scheduler(CoordinatorConfig(2, "jigsaw", ()),
                       get_plugin_manager(load_entrypoints=False, default_plugins=False), lambda e: None)
    s.register("a", _host(2))
    s.register("b", replace(_host(0), name="b"))
    bounds = {p.name: s.ex.policy.staleness_bound(p) for p in s.ex.order}
    assert bounds == {"a": 2, "b": 0}


# --- the live executor's per-sample bookkeeping (EMULATED engines: no vLLM here) ----------

def _async_workload() -> dict:
    def pipeline(name: str, staleness: int) -> dict:
        return {"name": name, "model": "tiny-qwen2", "algorithm": "grpo", "mode": "async", "staleness": staleness,
                "prompts_per_step": 4, "samples_per_prompt": 4, "max_response_len": 256,
                "prompt_len": {"dist": "const", "value": 16},
                "response_len": {"dist": "quantiles", "q": [0, 0.5, 0.9, 1], "values": [8, 40, 120, 256]},
                "reward": {"kind": "rule", "latency_s": {"dist": "const", "value": 0.0}}, "steps": 5}

    return {"version": 1, "cluster": {"gpus": 2, "gpu": "cpu", "gpus_per_node": 2},
            "pipelines": [pipeline("s1", 1), pipeline("s2", 2)]}


@pytest.mark.parametrize("policy", ["jigsaw", "verl-sync"])
def test_live_executor_records_every_trained_samples_version_lag(policy):
    from jigsaw_plugin.costmodel import CostModel, hardware_profile
    from jigsaw_plugin.runtime.emulated import EmulatedEngine
    from jigsaw_plugin.runtime.live import run_live
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.workload import parse_workload

    cost = CostModel(hardware_profile("cpu"))
    factory = lambda p, d: EmulatedEngine(cost, p.model, tp=len(d), time_scale=0.01)  # noqa: E731
    wl = parse_workload(_async_workload())
    result = run_live(wl, get_policy(policy), factory, seed=0, time_scale=0.01)
    lagged = 0
    for name, bound in (("s1", 1), ("s2", 2)):
        r = result["pipelines"][name]
        hist = {int(k): n for k, n in r["staleness_histogram"].items()}
        assert r["staleness_unit"] == "sample"  # one count per trained sample, not per step
        assert sum(hist.values()) == r["samples"] == 5 * 16
        assert max(hist) == r["max_staleness"] <= bound
        lagged += sum(n for lag, n in hist.items() if lag > 0)
    # the async bound is used by the jigsaw policy (the next rollout overlaps training), the
    # synchronous baseline trains every sample on-policy
    assert (lagged > 0) == (policy == "jigsaw")
