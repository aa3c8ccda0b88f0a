"""The Ray backend on real vLLM engines: a fault mid-rollout, the coordinator dying, and
a policy run by the coordinator end to end (runtime/ray_bench.py, engine_pool.py).

Needs ``.venv-cpu`` (``make integration``). Marked ``ray_cluster``: runs after the tests
that share the two local engines, which its fixture shuts down first (at most a few vLLM
engines on the 2-core machine at a time).
"""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here: `make venv-cpu` builds .venv-cpu")
psutil = pytest.importorskip("psutil")

from jigsaw_plugin.workload import parse_workload  # noqa: E402

pytestmark = pytest.mark.ray_cluster


def _workload(pipelines: int, devices: int, steps: int, prompts: int, length: int, policy_note: str = "") -> dict:
    return {
        "version": 1,
        "cluster": {"gpus": devices, "gpu": "cpu", "gpus_per_node": devices},
        "pipelines": [{
            "name": f"p{i}", "model": "tiny-qwen2", "algorithm": "grpo", "mode": "sync",
            "prompts_per_step": prompts, "samples_per_prompt": 4, "max_response_len": 512,
            "prompt_len": {"dist": "const", "value": 16},
            "response_len": {"dist": "uniform", "low": length // 2, "high": length},
            "reward": {"kind": "rule", "latency_s": {"dist": "const", "value": 0.0}},
            "steps": steps,
        } for i in range(pipelines)],
    }


@pytest.fixture(scope="module")
def ray_local(local_engines):
    import ray

    local_engines.close()  # the shared local engines go first: memory and cores
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, resources={"jigsaw_device": 2}, include_dashboard=False, log_to_driver=False,
             namespace="test-runtime-ray")
    yield ray
    ray.shutdown()


def _alive(pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def test_engine_killed_mid_rollout_its_requests_finish_elsewhere(ray_local, tiny_model_dir):
    """One pipeline, two replicas (verl-sync on 2 devices). One engine actor is killed
    while it generates; its requests resume on the other replica, the step trains on
    every sample, each sample's response has its exact length, and the fault is recorded."""
    ray = ray_local
    from jigsaw_plugin.runtime.engine_pool import EnginePool
    from jigsaw_plugin.runtime.live import LiveExecutor
    from jigsaw_plugin.runtime.reference import ReferenceStageRunner, ReferenceTrainer
    from jigsaw_plugin.scheduler import get_policy

    wl = parse_workload(_workload(1, 2, 1, 4, 200))
    pool = EnginePool(pin=True)
    trainer = ReferenceTrainer(tiny_model_dir, seed=0)
    runner = ReferenceStageRunner({"p0": trainer})
    live = LiveExecutor(wl, get_policy("verl-sync"), lambda p, devs: pool.lend(p.name, devs, runner.latest_weights),
                        stage_runner=runner, sampling={"greedy": False, "temperature": 1.0, "sampling_seed": 0})
    killed = {}

    async def kill_one():
        router = live.routers["p0"]
        while not (len(router.engines) == 2 and router.requests and all(router.inflight.values())):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # mid-generation
        victim = max(router.inflight, key=router.inflight.get)
        killed["replica"], killed["inflight"] = victim, router.inflight[victim]
        ray.kill(router.engines[victim].engine.handle)

    async def main():
        await pool.ensure("p0", tiny_model_dir, range(2))
        killer = asyncio.create_task(kill_one())
        await asyncio.wait_for(live.run(), 400)
        await killer

    try:
        asyncio.run(main())
    finally:
        pool.shutdown()
    assert killed["inflight"] >= 1
    assert [f["replica"] for f in live.faults] == [killed["replica"]]
    (update,) = [r for r in runner.records if r.stage == "update_actor"]
    assert update.samples == 16  # every sample of the step was trained on
    step = live.pipelines["p0"].steps[0]
    assert step.n_gen_done == 16 and step.generated == int(step.samples.gen_tokens.sum())
    assert trainer.version == 1


def test_coordinator_death_is_a_clear_error_and_leaves_no_orphans(ray_local, tiny_model_dir):
    ray = ray_local
    from jigsaw_plugin.runtime.coordinator import CoordinatorDied, connect_coordinator

    client = connect_coordinator(name="dies", devices=2)
    data = _workload(1, 2, 20, 8, 300)  # long enough to be running when it is killed
    ref = client.handle.run_workload.remote(data, "jigsaw", {}, {"seed": 0})
    pids: list[int] = []
    deadline = time.time() + 300
    while len(pids) < 1 + 2 * 2 and time.time() < deadline:  # a trainer; 2 engines: actor + vLLM each
        time.sleep(2)
        pids = ray.get(client.handle.pool_pids.remote())
    assert len(pids) >= 5, pids
    time.sleep(3)  # the run is under way
    client.shutdown()  # the coordinator dies (ray.kill)
    with pytest.raises(CoordinatorDied, match="'dies' died"):
        client._get(ref)
    end = time.time() + 60
    while _alive(pids) and time.time() < end:
        time.sleep(1)
    # trainer and engine actors (owned by the coordinator: Ray kills them with it) and the
    # engines' vLLM processes (the reaper kills them): nothing is left behind
    assert _alive(pids) == []


def test_bench_on_real_engines_writes_the_simulator_result_json(ray_local, tmp_path):
    """``run_ab_ray``: both policies on the same samples, result JSON like the simulator's."""
    import yaml

    from jigsaw_plugin.runtime.ray_bench import run_ab_ray

    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(_workload(2, 2, 2, 4, 64)))
    from jigsaw_plugin.sim import simulate

    ab = run_ab_ray(path, "verl-sync", "jigsaw", repeats=1, log=lambda *a: None, warmup=False, record_events=True,
                    predict=simulate)
    for side in ("baseline", "candidate"):
        r = ab[side]
        assert r["backend"] == "ray" and r["samples"] == 2 * 2 * 16
        assert set(r["pipelines"]) == {"p0", "p1"} and 0 < r["gpu_busy_fraction"] <= 1
        assert r["measured"]["trainer_versions"] == {"p0": 2, "p1": 2}
        assert r["measured"]["weight_sync"]  # the syncs ran
    # same samples and seeds under both policies: the same rewards step by step
    assert ab["baseline"]["measured"]["reward_mean_by_step"] == ab["candidate"]["measured"]["reward_mean_by_step"]
    assert ab["throughput_ratio"] > 0 and ab["peak_memory_gib"] > 0 and "simulated" in ab
    # the sub-stage graph of the real run, from its hook events (as for a host adapter)
    from jigsaw_plugin.graph import build_from_events

    g = build_from_events(ab["events"]["candidate"], pipeline="p0")
    kinds = {n.kind for n in g.nodes()}
    g.validate()
    assert {"rollout_request", "gen_turn", "update_actor", "weight_sync"} <= kinds, kinds
    assert sum(1 for n in g.nodes() if n.kind == "rollout_request") == 2 * 16  # one per sample
