"""Training stages resized at micro-batch boundaries give the same update, bit for bit.

The real tiny Qwen2 trainer (torch on CPU, ``.venv-cpu``) driven by ``ReferenceStageRunner``
with a grant callback: the same batch trained on one device throughout, resized 1 -> 2 -> 1
devices between micro-batches, or paused and resumed, ends with identical parameters
(``torch.equal``), identical to the trainer's own whole-stage ``update_actor``. Each
micro-batch runs with one torch thread, on the worker thread of the device it was granted;
gradients are summed in micro-batch index order (trainer.py). About 15 s on the 2-core
machine.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed here: `make venv-cpu` builds .venv-cpu")
pytest.importorskip("transformers", reason="transformers is not installed here: `make venv-cpu` builds .venv-cpu")

from jigsaw_plugin.runtime.reference import ReferenceStageRunner, ReferenceTrainer  # noqa: E402
from jigsaw_plugin.runtime.reference.microbatch import DeviceGrant  # noqa: E402
from jigsaw_plugin.runtime.tiny_model import TINY_QWEN2, build_tiny_qwen2  # noqa: E402

STAGES = ("old_log_prob", "ref", "adv", "update_actor")
MICRO = 2


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_qwen2(tmp_path_factory.mktemp("mb") / "tiny-qwen2-seed0", seed=0)


def _batch(seed: int = 0) -> list:
    """8 prompts x 4 samples, responses of 6..24 tokens (padding differs between
    micro-batches), some tokens masked as tool observations."""
    rng = np.random.default_rng(seed)
    vocab = TINY_QWEN2["vocab_size"]
    out = []
    for g in range(8):
        prompt = [int(t) for t in rng.integers(0, vocab, 12)]
        for _ in range(4):
            n = int(rng.integers(6, 25))
            mask = [0 if 3 <= k < 5 and g % 3 == 0 else 1 for k in range(n)]
            out.append((prompt, [int(t) for t in rng.integers(0, vocab, n)], g, mask))
    return out


def _train(model_dir, grant, steps: int = 2):
    """``steps`` GRPO updates of a fresh trainer (seed 0) through the runner; returns the
    trainer, the runner and the old log-probs of the last step."""
    # micro-batches of 2: 4 per mini-batch of 8, so the order of the gradient sum matters
    # (a + b == b + a in floats; (a + b) + c need not equal a + (b + c))
    trainer = ReferenceTrainer(model_dir, seed=0, micro_batch_size=MICRO)
    runner = ReferenceStageRunner(trainer, grant=grant, pause_poll_s=0.001)
    olds = []

    async def main():
        for k in range(steps):
            for stage in STAGES:
                await runner.run("p", k, stage, (0,), _batch(k) if stage == "old_log_prob" else None)
            olds.append(runner._state[("p", k)]["old"])

    try:
        asyncio.run(main())
    finally:
        runner.close()
    return trainer, runner, olds


def _params(trainer) -> dict:
    return {k: v.detach().clone() for k, v in trainer.model.named_parameters()}


def _resize_1_2_1(request):
    """One device, two from micro-batch 4 on, one again from micro-batch 12."""
    return (0, 1) if 4 <= request.next_micro_batch < 12 else (0,)


class _PauseOnce:
    """Device 0 until micro-batch 3, paused (width 0) for three asks, then device 1."""

    def __init__(self):
        self.zeros = 0

    def __call__(self, request):
        if request.next_micro_batch < 3 or request.stage != "update_actor":
            return (0,)
        if self.zeros < 3:
            self.zeros += 1
            return ()
        return (1,)


def test_resized_and_paused_updates_are_bitwise_identical(model_dir):
    baseline, base_runner, base_old = _train(model_dir, lambda r: (0,))
    resized, res_runner, res_old = _train(model_dir, _resize_1_2_1)
    pause = _PauseOnce()
    paused, pau_runner, pau_old = _train(model_dir, pause)
    want = _params(baseline)
    assert baseline.version == resized.version == paused.version == 2
    for trainer in (resized, paused):
        got = _params(trainer)
        assert all(torch.equal(want[k], got[k]) for k in want), [k for k in want if not torch.equal(want[k], got[k])]
    for olds in (res_old, pau_old):  # the forward stages too, micro-batched on other devices
        assert all(torch.equal(a, b) for a, b in zip(base_old, olds))

    # the records show what ran where: widths 1 -> 2 -> 1 ...
    upd = [r for r in res_runner.records if r.stage == "update_actor"][0]
    widths = [1] * 4 + [2] * 8 + [1] * 4
    assert [m.width for m in upd.micro_batches] == widths
    assert [m.device for m in upd.micro_batches] == [0] * 4 + [0, 1] * 4 + [0] * 4
    assert [m.mini_batch for m in upd.micro_batches] == [k for k in range(4) for _ in range(4)]
    fwd = [r for r in res_runner.records if r.stage == "old_log_prob"][0]
    assert [m.width for m in fwd.micro_batches] == widths
    assert all(m.wall_s > 0 and m.end_s <= upd.wall_s for m in upd.micro_batches)
    # ... and the pause: micro-batch 3 waited three width-0 answers, then ran on device 1
    upd = [r for r in pau_runner.records if r.stage == "update_actor"][0]
    assert [m.pauses for m in upd.micro_batches] == [0, 0, 0, 3] + [0] * 12
    assert [m.device for m in upd.micro_batches] == [0, 0, 0] + [1] * 13
    assert upd.micro_batches[3].waited_s > 0
    # the update's metrics do not depend on the resizing either (time aside)
    m_base = [r.metrics for r in base_runner.records if r.stage == "update_actor"]
    m_res = [r.metrics for r in res_runner.records if r.stage == "update_actor"]
    for a, b in zip(m_base, m_res):
        assert {k: v for k, v in a.items() if k != "time_s"} == {k: v for k, v in b.items() if k != "time_s"}

    # the trainer's own whole-stage update (no grant) runs the same plan one after another
    whole = ReferenceTrainer(model_dir, seed=0, micro_batch_size=MICRO)
    for k in range(2):
        b = _batch(k)
        old, ref = whole.old_log_prob(b), whole.ref_log_prob(b)
        assert torch.equal(old, base_old[k])
        whole.update_actor(b, old, _adv(base_runner, k), ref)
    got = _params(whole)
    assert all(torch.equal(want[k], got[k]) for k in want)


def _adv(runner, step):
    from jigsaw_plugin.runtime.reference import grpo_advantages

    return grpo_advantages(runner.rewards[("p", step)], [s[2] for s in _batch(step)])


def test_device_grant_grows_a_stage_and_two_cores_run_micro_batches_side_by_side(model_dir):
    """A DeviceGrant set to two devices runs the micro-batches of a mini-batch two at a
    time, one per device (a worker thread each); the result equals one device throughout."""
    one, _, _ = _train(model_dir, lambda r: (0,), steps=1)
    grant = DeviceGrant((0, 1))
    two, runner, _ = _train(model_dir, grant, steps=1)
    want, got = _params(one), _params(two)
    assert all(torch.equal(want[k], got[k]) for k in want)
    upd = [r for r in runner.records if r.stage == "update_actor"][0]
    assert [m.device for m in upd.micro_batches] == [0, 1] * 8
    assert len(grant.asked) == len([r for r in runner.records if r.micro_batches]) * 8


def test_the_order_of_the_gradient_sum_changes_the_bits(model_dir):
    """Why the trainer sums in index order: the same four micro-batch gradients summed in
    another order differ in the last bits (so summing in completion order would make the
    update depend on which device finished first)."""
    trainer = ReferenceTrainer(model_dir, seed=0, micro_batch_size=MICRO)
    batch = _batch(0)
    old = trainer.old_log_prob(batch)
    adv = np.linspace(-1.0, 1.0, len(batch))
    grads = []
    for i in range(4):
        idx = list(range(2 * i, 2 * i + 2))
        trainer.micro_grad(i, [batch[j] for j in idx], old[idx], adv[idx], None, 40)
        grads.append([g.clone() for g in trainer.take_gradient(i)])
    in_order = [((a + b) + c) + d for a, b, c, d in zip(*grads)]
    other = [((d + b) + a) + c for a, b, c, d in zip(*grads)]
    assert not all(torch.equal(x, y) for x, y in zip(in_order, other))
    assert all(torch.allclose(x, y, rtol=1e-5, atol=1e-7) for x, y in zip(in_order, other))
    for i in (2, 0, 3, 1):  # kept again, in another order than the index order
        idx = list(range(2 * i, 2 * i + 2))
        trainer.micro_grad(i, [batch[j] for j in idx], old[idx], adv[idx], None, 40)
    trainer.optimizer_step([3, 1, 0, 2])  # asked in any order, sums 0, 1, 2, 3
    ref = ReferenceTrainer(model_dir, seed=0, micro_batch_size=MICRO)
    for k, p in enumerate(p for p in ref.model.parameters() if p.requires_grad):
        p.grad = in_order[k].clone()
    torch.nn.utils.clip_grad_norm_(ref.model.parameters(), 1.0)
    ref.optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(trainer.model.parameters(), ref.model.parameters()))
