"""The coordinator's policy schedulers on host pipelines (no Ray: the actor's body is
plain asyncio): grants follow the policy, refusals are clear, nothing hangs."""

from __future__ import annotations

import asyncio

import pytest

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.manager import get_plugin_manager
from jigsaw_plugin.runtime.capabilities import HostCapabilities, refusal
from jigsaw_plugin.runtime.host_executor import HostPipeline
from jigsaw_plugin.runtime.lease_schedulers import (
    CoordinatorConfig,
    FifoLeaseScheduler,
    LeaseError,
    PolicyScheduler,
    make_scheduler,
)
from jigsaw_plugin.scheduler.base import Policy, register_policy
from jigsaw_plugin.scheduler.decisions import LaunchReplica, Migrate, ResizeStage, RunStage, StartGen

GRPO = ("old_log_prob", "ref", "update_actor", "weight_sync")  # adv runs on the driver: no grant


def host(name: str, width: int = 1, steps: int = 2) -> HostPipeline:
    return HostPipeline(name, "tiny-qwen2", "grpo", 2, 2, 32, 16, steps, width,
                        HostCapabilities("verl", training_width=width))


def scheduler(policy: str, devices: int, *hosts, **options):
    log: list[dict] = []
    s = make_scheduler(CoordinatorConfig(devices, policy, tuple(options.items())),
                       get_plugin_manager(load_entrypoints=False, default_plugins=False), log.append)
    for h in hosts:
        s.register(h.name, h)
    return s, log


async def drive(s, name: str, steps: int, grants: list) -> None:
    """A host's loop, as the verl session runs it: the rollout, then each training stage."""
    for k in range(steps):
        for stage in ("gen", *GRPO):
            devices = await s.acquire(name, "rollout" if stage == "gen" else "train", 1, 5.0, k, stage)
            grants.append((name, k, stage, devices))
            await asyncio.sleep(0.001)  # the stage runs
            s.release(name, devices, k, stage, tokens=64 if stage == "gen" else None)


@pytest.mark.parametrize("policy", ["jigsaw", "verl-sync"])
def test_two_hosts_run_every_stage_once_on_the_policys_grants(policy):
    async def main():
        s, log = scheduler(policy, 2, host("a"), host("b"))
        grants: list = []
        await asyncio.gather(drive(s, "a", 2, grants), drive(s, "b", 2, grants))
        return s, log, grants

    s, log, grants = asyncio.run(main())
    for name in "ab":  # every stage of every step granted exactly once, in order
        mine = [(k, st) for n, k, st, _ in grants if n == name]
        assert mine == [(k, st) for k in range(2) for st in ("gen", *GRPO)]
    assert all(p.done and p.version == 2 for p in s.ex.order)
    assert {e["stage"] for e in log if e["hook"] == "jigsaw_stage_granted"} == {"gen", *GRPO}
    assert s.report()["refusals"] == [] and s.report()["decisions"] > 0
    # no device held by two pipelines at once (the executor's trace of claims)
    spans = [x for x in s.ex.trace if x[2]]
    for i, a in enumerate(spans):
        for b in spans[i + 1:]:
            if a[0].split()[0] != b[0].split()[0] and set(a[2]) & set(b[2]):
                assert a[4] <= b[3] or b[4] <= a[3], (a, b)


@register_policy("test-too-narrow")
class _TooNarrow(Policy):
    """Asks a 2-wide fixed gang to train on one device."""

    name = "test-too-narrow"

    def decide(self, state):
        out = []
        for p in state.order:
            if p.next_stage and not p.stage_running:
                out.append(RunStage(p.name, p.train_next, p.next_stage, (0,)))
            elif p.gen_next == p.train_next < p.total_steps and not p.replicas and all(
                    d in state.free for d in p.static_devices):
                out += [LaunchReplica(p.name, p.static_devices), StartGen(p.name, p.gen_next)]
        return out


@register_policy("test-idle")
class _Idle(Policy):
    name = "test-idle"

    def decide(self, state):
        return []


def test_a_decision_outside_the_hosts_capabilities_is_refused_not_hung():
    async def main():
        s, log = scheduler("test-too-narrow", 2, host("wide", width=2, steps=1))
        got = await s.acquire("wide", "rollout", 2, 5.0, 0, "gen")
        s.release("wide", got, 0, "gen", tokens=10)
        with pytest.raises(LeaseError, match="fixed at 2 device.*asked for 1"):
            await s.acquire("wide", "train", 2, 5.0, 0, "old_log_prob")
        return log

    log = asyncio.run(main())
    refused = [e for e in log if e["hook"] == "jigsaw_decision_refused"]
    assert refused and "training_resizable=false" in refused[0]["reason"]


def test_a_policy_that_never_grants_fails_the_wait_with_the_reason():
    async def main():
        s, _ = scheduler("test-idle", 1, host("a"))
        with pytest.raises(LeaseError, match="decided nothing .* would never be granted"):
            await s.acquire("a", "rollout", 1, 5.0, 0, "gen")

    asyncio.run(main())


def test_capability_checks_name_what_cannot_be_done():
    caps = HostCapabilities("verl", training_width=2)
    assert refusal(caps, RunStage("a", 0, "update_actor", (0, 1))) is None
    assert "fixed at 2" in refusal(caps, RunStage("a", 0, "update_actor", (0,)))
    assert "cannot resize" in refusal(caps, ResizeStage("a", 0, "update_actor", (0,)))
    assert "cannot run alongside" in refusal(caps, RunStage("a", 0, "update_critic", (0, 1), alongside=True))
    assert "cannot migrate" in refusal(caps, Migrate(0, 1))
    assert "spread=True" in refusal(caps, LaunchReplica("a", (1,), spread=True))
    assert "cannot add" in refusal(caps, LaunchReplica("a", (1,)), live_replicas=1)
    assert refusal(HostCapabilities("x", migration=True, replicas_elastic=True), LaunchReplica("a", (1,), absorb=(0,)),
                   live_replicas=1) is None


@pytest.mark.parametrize("raw, field", [
    ({"framework": "verl", "stage_grants": "always"}, "capabilities.stage_grants"),
    ({"framework": "verl", "training_width": 0}, "capabilities.training_width"),
    ({"framework": "verl", "migration": "yes"}, "capabilities.migration"),
    ({"framework": "verl", "colour": 1}, "capabilities.colour"),
    ({"stage_grants": "stage"}, "capabilities.framework"),
])
def test_bad_capabilities_are_spec_errors(raw, field):
    with pytest.raises(SpecError) as e:
        HostCapabilities.from_dict(raw)
    assert e.value.field == field


def test_coordinator_config_checks_the_policy_and_its_options():
    with pytest.raises(SpecError, match="--policy"):
        CoordinatorConfig(2, "no-such-policy")
    with pytest.raises(SpecError, match="jigsaw option"):
        CoordinatorConfig(2, "jigsaw", (("horizon", 1.0),))
    with pytest.raises(SpecError, match="coordinator.devices"):
        CoordinatorConfig(0)
    assert isinstance(make_scheduler(CoordinatorConfig(2), None, print), FifoLeaseScheduler)
    assert isinstance(make_scheduler(CoordinatorConfig(2, "jigsaw", (("horizon_s", 5.0),)),
                                     get_plugin_manager(load_entrypoints=False, default_plugins=False), print),
                      PolicyScheduler)


def test_a_policy_scheduler_needs_the_hosts_declaration_and_fitting_shares():
    s, _ = scheduler("jigsaw", 1)
    with pytest.raises(SpecError, match="HostPipeline"):
        s.register("a", None)
    s.register("a", host("a"))
    with pytest.raises(SpecError):
        s.register("b", host("b"))  # shares 1 + 1 > a pool of 1


def test_a_pipeline_that_leaves_gives_its_share_to_the_next():
    async def main():
        s, _ = scheduler("jigsaw", 2, host("a", width=2, steps=1))
        grants: list = []
        await drive(s, "a", 1, grants)
        assert s.drop("a") == ()
        s.register("b", host("b", steps=1))
        s.register("c", host("c", steps=1))  # 1 + 1 devices: fits once a's 2 are gone
        await asyncio.gather(drive(s, "b", 1, grants), drive(s, "c", 1, grants))
        return s, grants

    s, grants = asyncio.run(main())
    assert [p.name for p in s.ex.finished] == ["a"] and all(p.done for p in s.ex.order)
    assert len(grants) == 3 * 5


@register_policy("test-absorbing-b")
class _AbsorbingB(Policy):
    """verl-sync's decisions, except that host ``b``'s rollout is asked on a server that
    absorbs another's requests (a migration a verl host cannot carry out)."""

    name = "test-absorbing-b"

    def decide(self, state):
        import dataclasses

        from jigsaw_plugin.scheduler.baselines import VerlSync

        return [dataclasses.replace(d, absorb=(0,)) if isinstance(d, LaunchReplica) and d.pipeline == "b" else d
                for d in VerlSync().decide(state)]


def test_a_refused_rollout_decision_fails_that_hosts_wait_while_the_other_runs():
    async def main():
        s, log = scheduler("test-absorbing-b", 2, host("a"), host("b"))
        grants: list = []

        async def b():
            with pytest.raises(LeaseError, match="outside the host's capabilities.*migration=false"):
                await s.acquire("b", "rollout", 1, 5.0, 0, "gen")
            return s.ex.t

        refused_at, _ = await asyncio.gather(b(), drive(s, "a", 2, grants))
        return log, grants, refused_at, s.ex.t

    log, grants, refused_at, end = asyncio.run(main())
    assert [g[2] for g in grants] == ["gen", *GRPO] * 2  # a is not held up
    assert refused_at < 1.0  # at once, not after a wait or a timeout
    refused = [e for e in log if e["hook"] == "jigsaw_decision_refused"]
    assert [e["pipeline"] for e in refused] == ["b"] and "absorb=(0,)" in refused[0]["decision"]


def test_policy_modules_that_do_not_import_are_spec_errors():
    with pytest.raises(SpecError) as e:
        CoordinatorConfig(2, "jigsaw", policy_modules=("no_such_module_here",))
    assert e.value.field == "coordinator.policy_modules" and "ModuleNotFoundError" in str(e.value)
    with pytest.raises(SpecError, match="a tuple of module names"):
        CoordinatorConfig(2, "jigsaw", policy_modules="refusing_policy")
