"""Preemption in live runs without Ray: the seeded preemption times (runtime/preemption.py),
the router's eviction (keep the prefix / restart from the first token), and a live run on
EMULATED engines (control-plane only: no model) whose spot replica is preempted mid-rollout
and whose requests finish elsewhere at full length. The real run (vLLM engines, trainer
actors, the parameter server) is integration_tests/test_preemption_ray.py."""

import asyncio

import pytest

from jigsaw_plugin.costmodel import CostModel, hardware_profile
from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.runtime.emulated import EmulatedEngine
from jigsaw_plugin.runtime.live import LiveExecutor
from jigsaw_plugin.runtime.preemption import PreemptionDriver, draw_times, preemptible_devices
from jigsaw_plugin.runtime.router import Router
from jigsaw_plugin.scheduler import get_policy
from jigsaw_plugin.workload import parse_workload

COST = CostModel(hardware_profile("h100"))


def _cluster(rate=None, trace=None, tmp_path=None, replace_s=120.0):
    pre = {"replace_s": replace_s}
    if trace is not None:
        path = tmp_path / "trace.csv"
        path.write_text("t_s,device\n" + "".join(f"{t},{d}\n" for t, d in trace))
        pre["trace"] = str(path)
    else:
        pre["rate_per_hour"] = rate
    return {"classes": [{"name": "ondemand", "gpu": "h100", "count": 2, "gpus_per_node": 4},
                        {"name": "spot", "gpu": "h100", "count": 2, "gpus_per_node": 4, "preemptible": pre}]}


def _workload(cluster, steps=2):
    return parse_workload({"version": 1, "cluster": cluster, "pipelines": [{
        "name": "p0", "model": "qwen2.5-1.5b", "algorithm": "grpo", "mode": "sync", "prompts_per_step": 4,
        "samples_per_prompt": 4, "max_response_len": 2048,
        "prompt_len": {"dist": "const", "value": 64},
        "response_len": {"dist": "uniform", "low": 300, "high": 800}, "steps": steps}]})


def _times(dev, seed, n):
    gen = draw_times(dev, seed)
    next(gen)
    out, after = [], 0.0
    for _ in range(n):
        t = gen.send(after)
        out.append(t)
        after = t + dev.replace_wall_s
    return out


def test_preemption_times_are_seeded_and_scaled_to_wall_seconds():
    wl = _workload(_cluster(rate=5.0))
    devs = preemptible_devices(wl.cluster, time_scale=60.0)
    assert [d.device for d in devs] == [2, 3] and {d.cls for d in devs} == {"spot"}
    assert devs[0].rate_per_wall_s == pytest.approx(5.0 * 60 / 3600) and devs[0].replace_wall_s == pytest.approx(2.0)
    a, b = _times(devs[0], 7, 400), _times(devs[0], 7, 400)
    assert a == b != _times(devs[1], 7, 400)  # seeded per device
    gaps = [t2 - t1 - devs[0].replace_wall_s for t1, t2 in zip([0.0 - devs[0].replace_wall_s] + a, a)]
    assert sum(gaps) / len(gaps) == pytest.approx(3600 / (5.0 * 60), rel=0.15)  # Poisson at the scaled rate


def test_a_trace_is_scaled_and_a_bad_time_scale_is_named(tmp_path):
    wl = _workload(_cluster(trace=[(120.0, 1), (30.0, 1), (60.0, 0)], tmp_path=tmp_path))
    devs = preemptible_devices(wl.cluster, time_scale=10.0)
    assert devs[0].trace_wall_s == (6.0,) and devs[1].trace_wall_s == (3.0, 12.0)
    gen = draw_times(devs[1], 0)
    next(gen)
    assert gen.send(0.0) == 3.0
    with pytest.raises(StopIteration):
        gen.send(15.0)  # 12.0 fell while the device was down: it hit nothing
    for bad in (0, -1.0, float("nan"), "fast", True):
        with pytest.raises(SpecError, match="time_scale"):
            preemptible_devices(wl.cluster, bad)
    with pytest.raises(SpecError, match="recovery"):
        PreemptionDriver(devs, None, recovery="retry")


@pytest.mark.parametrize("keep", [True, False])
def test_an_evicted_request_resumes_with_its_prefix_or_from_its_first_token(keep):
    async def main():
        events = []
        a, b = EmulatedEngine(), EmulatedEngine()  # 1 ms per token
        router = Router({0: a}, on_event=lambda name, **kw: events.append((name, kw)))
        task = asyncio.ensure_future(router.generate("p0/0/0/0", [1, 2, 3], 400))
        while not router.records_on(0) or len(router.records_on(0)[0].live) < 20:
            await asyncio.sleep(0.005)
        router.mark_retiring(0)
        engine, segment = router.begin_evict("p0/0/0/0", keep_tokens=keep)
        assert router.begin_evict("p0/0/0/0", keep_tokens=keep) is None  # never twice
        await engine.abort(segment)
        await asyncio.sleep(0.05)  # no live replica: the request waits, holding its tokens
        assert not task.done()
        router.add_replica(1, b)
        out = await asyncio.wait_for(task, 30)
        return out, events

    out, events = asyncio.run(main())
    assert len(out) == 400
    name, kw = [(n, kw) for n, kw in events if n in ("migrated", "restarted")][0]
    if keep:
        assert name == "migrated" and kw["generated_tokens"] >= 20
    else:
        assert name == "restarted" and kw["dropped_tokens"] >= 20


class _EmulatedTarget:
    """What a preemption does on EMULATED engines: the device leaves, its replica drains
    through the migration path; the replacement rejoins (no weights, no trainer here)."""

    def __init__(self, live):
        self.live, self.down = live, []

    async def preempt(self, device, recovery):
        task = self.live.task_on(device)
        self.live.take_down(device)
        self.down.append([device, None, None])
        hit = {"hit": "idle" if task is None else "stage", "requests": 0, "pipeline": None}
        if task is not None and task.kind == "replica":
            n = await self.live.preempt_replica(task.replica, keep_tokens=recovery == "migrate")
            hit = {"hit": "replica", "requests": n, "pipeline": task.pipeline}
        self.down[-1][1] = self.live.t  # drained (the notice period): from here the device is gone
        return hit

    async def replace(self, device):
        self.live.bring_up(device)
        self.down[-1][2] = self.live.t
        return [], []


@pytest.mark.parametrize("recovery", ["migrate", "restart"])
def test_a_preempted_replicas_requests_finish_elsewhere_at_full_length(recovery):
    wl = _workload(_cluster(rate=1.0, replace_s=1.0), steps=2)
    live = LiveExecutor(wl, get_policy("verl-sync"),
                        lambda p, devs: EmulatedEngine(COST, p.model, tp=len(devs), time_scale=0.004), 0,
                        time_scale=0.004)
    events = []
    live.router_listeners.append(lambda pipeline, name, **kw: events.append((name, kw)))
    target = _EmulatedTarget(live)
    spot = preemptible_devices(wl.cluster, time_scale=1.0)
    driver = PreemptionDriver(spot, target, recovery=recovery)

    def generating_on(device):
        task = live.task_on(device)
        if task is None or task.kind != "replica":
            return False
        return any(len(r.live) > 10 for r in live.routers["p0"].records_on(task.replica))

    async def preempt_mid_rollout(dev):
        while not generating_on(dev.device):
            await asyncio.sleep(0.002)
        await driver.preempt_now(dev)

    async def main():
        side = asyncio.ensure_future(preempt_mid_rollout(spot[0]))
        await asyncio.wait_for(live.run(), 60)
        await side

    asyncio.run(main())
    (pre,) = driver.preemptions
    assert pre.hit == "replica" and pre.requests > 0
    for p in live.order:
        for s in p.steps.values():  # every sample generated once, at its full length
            assert s.n_gen_done == s.n and s.generated == int(s.samples.gen_tokens.sum())
    kept = [kw["generated_tokens"] for n, kw in events if n == "migrated"]
    dropped = [kw["dropped_tokens"] for n, kw in events if n == "restarted"]
    if recovery == "migrate":
        assert len(kept) == pre.requests and min(kept) > 0 and not dropped
    else:
        assert not kept and len(dropped) >= pre.requests  # the step's other requests restart too
    device, down, back = target.down[0]
    for name, kind, devices, start, end in live.trace:  # nothing ran on the device while it was gone
        if device in devices:
            assert end <= down + 1e-6 or start >= back - 1e-6, (name, start, end, down, back)
    assert driver.replacements[0].device == device
