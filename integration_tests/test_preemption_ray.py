"""Preemption tolerance on Ray with real vLLM engines (issue 16, item 5; runtime/preemption*.py).

One GRPO pipeline of the tiny model on two one-core devices (device 0 on demand, device 1
spot), a trainer actor, pooled engines that record what their workers loaded. The same
workload runs twice on the same seed: without preemptions, and with the spot device
preempted twice at chosen moments: once while its replica generates (the requests resume
on the on-demand replica through the migration path, keeping their tokens) and once while
a training stage runs there (the trainer actor is killed and restored from its last
checkpoint; the stage runs again). Each time the replacement engine pulls the latest
weights from the parameter server. Needs ``.venv-cpu``; run under the real-run lock:
``flock /tmp/jigsaw-real.lock .venv-cpu/bin/python -m pytest -x -q integration_tests/test_preemption_ray.py``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here: `make venv-cpu` builds .venv-cpu")

pytestmark = pytest.mark.ray_cluster


@pytest.fixture(scope="module")
def ray_pool(local_engines):
    import ray

    from jigsaw_plugin.runtime.preemption_run import make_pool

    local_engines.close()  # the shared local engines go first: memory and cores
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, resources={"jigsaw_device": 2}, include_dashboard=False, log_to_driver=False,
             namespace="test-preemption-ray")
    pool = make_pool()
    yield pool
    pool.shutdown()
    ray.shutdown()


def _ledger(case_result_folder):
    from jigsaw_plugin.runtime.reference.resume import load_checkpoint

    return sorted(load_checkpoint(case_result_folder).ledger, key=lambda r: (r.step, r.index))


def test_preempted_rollout_worker_and_trainer_lose_and_duplicate_nothing(ray_pool, tiny_model_dir, tmp_path):
    import ray

    from jigsaw_plugin.runtime.preemption_run import SPOT_DEVICE, PreemptionCase, run_case
    from jigsaw_plugin.runtime.preemption_weights import read_digests

    case = PreemptionCase("test", rate_per_hour=0.0, recovery="migrate", steps=8, prompts_per_step=4,
                          response_len=(256, 512))
    seen: dict = {}

    async def preempt_twice(driver, live):
        (spot,) = [d for d in driver.devices if d.device == SPOT_DEVICE]
        router = live.routers["p0"]

        def spot_task():
            return live.task_on(SPOT_DEVICE)

        def done():
            return all(p.done for p in live.order)

        def generating():
            task = spot_task()
            return task is not None and task.kind == "replica" and router.records_on(task.replica)

        while not done():  # a rollout on the spot replica, 0.2 s into it (a step takes ~1-2 s at low load)
            if generating():
                await asyncio.sleep(0.2)
                if generating():
                    break
            await asyncio.sleep(0.005)
        if done():
            return
        await driver.preempt_now(spot)
        while not (spot_task() is not None and spot_task().kind == "stage"
                   and spot_task().stage == "update_actor") and not done():
            await asyncio.sleep(0.005)
        if done():
            return
        seen["stage"] = spot_task().stage
        await driver.preempt_now(spot)

    async def main():
        base = await run_case(case, ray_pool, tiny_model_dir, workdir=tmp_path / "base")
        pre = await run_case(case, ray_pool, tiny_model_dir, preempt=preempt_twice, workdir=tmp_path / "pre")
        return base, pre

    base, pre = asyncio.run(asyncio.wait_for(main(), 900))
    print("base", base.samples_per_s, base.wall_s, "preempted", pre.samples_per_s, pre.wall_s)
    print("preemptions", pre.preemptions, "replacements", pre.replacements, "pulls", pre.pulls,
          "restores", pre.trainer_restores, "reruns", pre.stage_reruns, "migrated", pre.migrated)

    # the same samples trained, each once, at full length, with and without preemptions
    for r in (base, pre):
        assert (r.samples_lost, r.samples_duplicated, r.wrong_length) == (0, 0, 0)
        assert r.samples == case.steps * case.prompts_per_step * case.samples_per_prompt
        assert r.trainer_version == case.steps  # no update kept twice, none lost
        assert max(r.staleness) <= r.staleness_bound  # sync: every sample on the current version
    assert [(x.step, x.index, x.prompt_tokens, x.response_tokens) for x in _ledger(Path(base.checkpoints) / "p0")] == \
           [(x.step, x.index, x.prompt_tokens, x.response_tokens) for x in _ledger(Path(pre.checkpoints) / "p0")]
    assert sum(pre.staleness.values()) == pre.samples

    # the rollout preemption: its in-flight requests resumed elsewhere with their tokens
    first, second = pre.preemptions
    assert first.hit == "replica" and first.requests > 0
    # (a request that finished while its abort was on the way just finished: no move)
    assert 1 <= len(pre.migrated) <= first.requests and min(pre.migrated) > 0 and not pre.restarted
    # the trainer preemption: restored at its last checkpoint; the update ran again if the
    # kill reached it mid-pass (a RayActorError), or ran once on the restored trainer if the
    # kill came between the stage's grant and its call (the runner waits for the restore
    # first). Either way the ledger and versions above show it kept exactly once.
    assert second.hit == "stage" and seen["stage"] == "update_actor"
    ((name, version),) = pre.trainer_restores
    assert version < case.steps
    for rerun in pre.stage_reruns:
        assert rerun.stage == "update_actor" and rerun.restored_version == version == rerun.step
    # each replacement pulled the latest version from the parameter server, bit-identical
    assert len(pre.pulls) == 2 and all(p.ok for p in pre.pulls), pre.pulls
    survivors = [row for key, engine in ray_pool.engines.items() if key[1] != SPOT_DEVICE
                 for row in read_digests(ray.get(engine.handle.pids.remote()))]
    for pull in pre.pulls:  # the same model parameters as the on-demand engine holding that version
        same = [row["params"] for row in survivors if row["loaded"] == pull.loaded_checksum]
        assert same and set(same) == {pull.params_digest}
    assert Counter(r.hit for r in pre.preemptions) == {"replica": 1, "stage": 1}
