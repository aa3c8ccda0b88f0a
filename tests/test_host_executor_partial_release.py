"""Partial release of a rollout grant (``HostCapabilities.replica_release``): an
OpenRLHF-shaped host gives an engine's device back while its rollout goes on, the policy
grants it to another pipeline at once, nothing is double-booked, and what a host cannot do
is refused clearly. Hand-driven hosts on the coordinator's ``PolicyScheduler`` (plain
asyncio, no Ray)."""

from __future__ import annotations

import asyncio

import pytest

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.events import EventRecorder
from jigsaw_plugin.manager import get_plugin_manager, register
from jigsaw_plugin.runtime.capabilities import HostCapabilities, refusal
from jigsaw_plugin.runtime.host_executor import HostPipeline
from jigsaw_plugin.runtime.lease_schedulers import CoordinatorConfig, make_scheduler
from jigsaw_plugin.scheduler.base import Policy, register_policy
from jigsaw_plugin.scheduler.decisions import LaunchReplica, RunStage, StartGen

VERL_STAGES = ("old_log_prob", "ref", "update_actor", "weight_sync")  # adv runs on the driver


def orl(name: str = "o", engines: int = 2, release: bool = True, steps: int = 1) -> HostPipeline:
    """OpenRLHF as its adapter declares it (adapters/openrlhf/host.py): phase grants, a
    fixed pool of engines, replica release, a fixed 1-wide training gang."""
    return HostPipeline(name, "tiny-qwen2", "grpo", 2, 2, 32, 16, steps, 1,
                        HostCapabilities("openrlhf", stage_grants="phase", rollout_replicas=engines,
                                         replica_release=release, training_width=1))


def verl(name: str = "v", steps: int = 1) -> HostPipeline:
    return HostPipeline(name, "tiny-qwen2", "grpo", 2, 2, 32, 16, steps, 1,
                        HostCapabilities("verl", training_width=1))


@register_policy("test-first-free")
class _FirstFree(Policy):
    """Grants on the lowest free devices: a rollout gets up to ``WANT[pipeline]`` replicas of
    one device each, a training stage one device; nothing else (test policy)."""

    name = "test-first-free"
    WANT = {"o": 2}

    def decide(self, state):
        free, out = sorted(state.free), []
        for p in state.order:
            if p.next_stage and free:
                out.append(RunStage(p.name, p.train_next, p.next_stage, (free.pop(0),)))
            elif p.gen_next == p.train_next < p.total_steps and not p.replicas and free:
                n = min(len(free), self.WANT.get(p.name, 1))
                out += [LaunchReplica(p.name, (d,)) for d in free[:n]] + [StartGen(p.name, p.gen_next)]
                free = free[n:]
        return out


@register_policy("test-widen-mid-rollout")
class _Widen(_FirstFree):
    """First-free, plus, once ``armed``, one more replica for any pipeline whose rollout runs."""

    name = "test-widen-mid-rollout"
    WANT = {"o": 1}
    armed = False

    def decide(self, state):
        out = super().decide(state)
        if not out and self.armed:
            free = sorted(state.free)
            out = [LaunchReplica(p.name, (free[0],)) for p in state.order if p.replicas and free][:1]
        return out


def scheduler(policy: str, devices: int, *hosts):
    log: list[dict] = []
    pm = get_plugin_manager(load_entrypoints=False, default_plugins=False)
    leases = EventRecorder()
    register(pm, leases, name="leases")
    s = make_scheduler(CoordinatorConfig(devices, policy), pm, log.append)
    for h in hosts:
        s.register(h.name, h)
    return s, log, leases


async def train(s, name: str, step: int, phase: bool) -> list:
    """The training side of a step as each host asks for it: one phase grant (OpenRLHF) or
    one grant per stage (verl)."""
    got = []
    for stage in (("train",) if phase else VERL_STAGES):
        devices = await s.acquire(name, "train", 1, 5.0, step, stage)
        got.append((name, step, stage, devices))
        await asyncio.sleep(0.001)
        s.release(name, devices, step, stage)
    return got


def no_device_twice(trace) -> None:
    spans = [x for x in trace if x[2]]
    for i, a in enumerate(spans):
        for b in spans[i + 1:]:
            if a[0].split()[0] != b[0].split()[0] and set(a[2]) & set(b[2]):
                assert a[4] <= b[3] or b[4] <= a[3], (a, b)


def test_a_released_engine_device_goes_to_the_waiting_pipeline_while_the_rollout_goes_on():
    async def main():
        s, log, leases = scheduler("test-first-free", 2, orl())
        assert await s.acquire("o", "rollout", 2, 5.0, 0, "gen") == (0, 1)  # both engines on
        s.register("v", verl())
        v_gen = asyncio.ensure_future(s.acquire("v", "rollout", 1, 5.0, 0, "gen"))
        await asyncio.sleep(0.05)
        assert not v_gen.done()  # no device free: v waits
        # OpenRLHF's rollout controller drained engine 1 into engine 0 and switched it off
        assert s.release("o", (1,), 0, "gen") == (1,)
        assert await asyncio.wait_for(v_gen, 2.0) == (1,)  # the policy gave it to v at once
        p = s.ex.pipelines["o"]
        assert [r.devices for r in p.replicas] == [(0,)] and p.steps[0].gen_end_t is None  # o still rolls out
        assert s.holder() == {0: "o", 1: "v"}
        s.release("o", (0,), 0, "gen", tokens=64)  # the rest of o's grant: its rollout ended
        assert s.ex.pipelines["o"].steps[0].gen_end_t is not None
        o_train = asyncio.ensure_future(train(s, "o", 0, phase=True))
        await asyncio.sleep(0.01)
        s.release("v", (1,), 0, "gen", tokens=64)
        got = await train(s, "v", 0, phase=False) + await o_train
        return s, log, leases, got

    s, log, leases, got = asyncio.run(main())
    assert all(p.done and p.version == 1 for p in s.ex.order)
    assert [st for n, _, st, _ in got if n == "v"] == list(VERL_STAGES)
    assert [st for n, _, st, _ in got if n == "o"] == ["train"]
    # the event log: o's device 1 released before v was granted it, and never held twice
    holder: dict[int, str] = {}
    for e in leases.events:
        if e["hook"] == "jigsaw_lease_granted":
            assert not set(e["devices"]) & set(holder), (e, holder)
            holder.update({d: e["pipeline"] for d in e["devices"]})
        elif e["hook"] == "jigsaw_lease_released":
            assert all(holder.pop(d) == e["pipeline"] for d in e["devices"])
    order = [(e["hook"], e["pipeline"], tuple(e["devices"])) for e in leases.events]
    assert order.index(("jigsaw_lease_released", "o", (1,))) < order.index(("jigsaw_lease_granted", "v", (1,)))
    no_device_twice(s.ex.trace)
    assert s.report()["refusals"] == []


def test_a_replica_asked_for_mid_rollout_is_refused_and_its_device_stays_free():
    async def main():
        s, log, _ = scheduler("test-widen-mid-rollout", 2, orl())
        assert await s.acquire("o", "rollout", 2, 5.0, 0, "gen") == (0,)
        s.policy.armed = True  # the policy now asks for a second engine for the running rollout
        s.ex.dirty = True
        s.ex.round()
        return s, log

    s, log = asyncio.run(main())
    refused = [e for e in log if e["hook"] == "jigsaw_decision_refused"]
    assert len(refused) == 1 and refused[0]["pipeline"] == "o"
    assert "cannot take one more (replicas_elastic=false)" in refused[0]["reason"]
    assert s.holder() == {0: "o"} and len(s.ex.pipelines["o"].replicas) == 1


def test_partial_releases_a_host_cannot_make_are_clear_errors():
    async def main():
        s, _, _ = scheduler("test-first-free", 3, orl(release=False), verl())
        assert await s.acquire("o", "rollout", 2, 5.0, 0, "gen") == (0, 1)
        with pytest.raises(SpecError, match=r"replica_release=false"):
            s.release("o", (1,), 0, "gen")
        s2, _, _ = scheduler("test-first-free", 3, orl(), verl())
        assert await s2.acquire("o", "rollout", 2, 5.0, 0, "gen") == (0, 1)
        with pytest.raises(SpecError, match=r"release of rollout step: got 1; allowed: the step whose rollout it "
                                            r"holds \(0\)"):
            s2.ex.release_replicas("o", 1, (1,))
        with pytest.raises(SpecError, match=r"released rollout devices: got \[2\]; allowed: devices of its "
                                            r"rollout grant still held: \[0, 1\]"):
            s2.ex.release_replicas("o", 0, (2,))
        assert s2.holder()[0] == s2.holder()[1] == "o"  # nothing changed by the bad calls

    asyncio.run(main())


def test_the_capability_is_declared_and_checked():
    caps = HostCapabilities.from_dict({"framework": "openrlhf", "stage_grants": "phase", "rollout_replicas": 2,
                                       "replica_release": True})
    assert caps.replica_release and caps.to_dict()["replica_release"] is True
    with pytest.raises(SpecError) as e:
        HostCapabilities("openrlhf", replica_release="yes")
    assert e.value.field == "capabilities.replica_release"
    assert "replicas_elastic=false" in refusal(caps, LaunchReplica("o", (1,)), 1, rollout_granted=True)
    assert refusal(caps, LaunchReplica("o", (1,)), 1) is None  # before the rollout is granted: fine
    elastic = HostCapabilities("x", replicas_elastic=True)
    assert refusal(elastic, LaunchReplica("o", (1,)), 1, rollout_granted=True) is None


@pytest.mark.parametrize("policy", ["jigsaw", "verl-sync"])
def test_registered_policies_run_an_openrlhf_host_that_releases_engines_early_beside_verl(policy):
    """The real policies, two steps, the OpenRLHF host giving back every engine but one as
    soon as it has more than one: every stage once, every step done, no device twice."""

    async def orl_loop(s, grants):
        for k in range(2):
            devices = await s.acquire("o", "rollout", 2, 10.0, k, "gen")
            grants.append(("o", k, "gen", devices))
            await asyncio.sleep(0.002)
            if len(devices) > 1:
                s.release("o", devices[1:], k, "gen")  # the tail consolidated on the first engine
                await asyncio.sleep(0.002)
            s.release("o", devices[:1], k, "gen", tokens=64)
            grants += await train(s, "o", k, phase=True)

    async def verl_loop(s, grants):
        for k in range(2):
            devices = await s.acquire("v", "rollout", 1, 10.0, k, "gen")
            grants.append(("v", k, "gen", devices))
            await asyncio.sleep(0.003)
            s.release("v", devices, k, "gen", tokens=64)
            grants += await train(s, "v", k, phase=False)

    async def main():
        s, log, _ = scheduler(policy, 3, orl(engines=2, steps=2), verl(steps=2))
        grants: list = []
        await asyncio.gather(orl_loop(s, grants), verl_loop(s, grants))
        return s, log, grants

    s, log, grants = asyncio.run(main())
    assert all(p.done and p.version == 2 for p in s.ex.order)
    assert [(k, st) for n, k, st, _ in grants if n == "o"] == [(k, st) for k in range(2) for st in ("gen", "train")]
    assert [(k, st) for n, k, st, _ in grants if n == "v"] == [(k, st) for k in range(2)
                                                               for st in ("gen", *VERL_STAGES)]
    no_device_twice(s.ex.trace)
    assert all("=false" in r["reason"] for r in s.report()["refusals"])


@register_policy("test-launch-two-retire-one")
class _LaunchTwoRetireOne(_FirstFree):
    """Launches two replicas, then retires the first before the host's grant (as jigsaw does
    when it consolidates a small rollout at once)."""

    name = "test-launch-two-retire-one"

    def decide(self, state):
        from jigsaw_plugin.scheduler.decisions import RetireReplica

        out = super().decide(state)
        if not out:
            reps = [r for p in state.order for r in p.replicas if p.name == "o" and not r.retiring]
            if len(reps) == 2:
                out = [RetireReplica(min(r.id for r in reps))]
        return out


def test_a_replica_retired_before_the_grant_gives_its_devices_back_at_once():
    async def main():
        s, _, leases = scheduler("test-launch-two-retire-one", 2, orl())
        got = await s.acquire("o", "rollout", 2, 5.0, 0, "gen")
        return s, leases, got

    s, leases, got = asyncio.run(main())
    assert len(got) == 1  # the host runs on the replica left
    assert s.holder() == {got[0]: "o"}  # the retired one's device is free, not held idle
    released = [e for e in leases.events if e["hook"] == "jigsaw_lease_released"]
    assert [tuple(e["devices"]) for e in released] == [tuple(d for d in (0, 1) if d != got[0])]


def test_a_host_places_its_own_gangs_without_the_simulators_memory_floor():
    # the simulator refuses a 32B update on fewer devices than hold its training state
    # (CostModel.min_gang); a host places its own FSDP gangs (or offloads), so the host
    # executor prices none infinite and refuses none for memory
    from jigsaw_plugin.runtime.host_executor import HostExecutor
    from jigsaw_plugin.scheduler import get_policy

    big = HostPipeline("v", "qwen2.5-32b", "grpo", 2, 2, 32, 16, 1, 1, HostCapabilities("verl", training_width=1))
    ex = HostExecutor(2, big, get_policy("verl-sync"))
    assert ex.cost.min_gang(ex.pipelines["v"].model, update=True) == 1
    assert ex.cost.train_s(ex.pipelines["v"].model, 1, 1000.0) < float("inf")
