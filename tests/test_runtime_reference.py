"""The reference pipeline's torch-free parts: reward, GRPO advantages, the stage runner's
sequencing and weight-sync modes (with a stand-in trainer). The real trainer is tested in
integration_tests/test_reference_grpo.py."""

import asyncio
import subprocess
import sys

import numpy as np
import pytest

from jigsaw_plugin.runtime.emulated import EmulatedEngine
from jigsaw_plugin.runtime.reference import ReferenceStageRunner, TokenSetReward, grpo_advantages, low_id_reward


def test_importing_the_reference_package_pulls_no_framework():
    code = ("import sys, jigsaw_plugin.runtime.reference; "
            "print(sorted(m for m in ('torch', 'transformers', 'ray', 'vllm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_low_id_reward_is_the_fraction_of_generated_tokens_below_the_threshold():
    r = low_id_reward(1024)
    assert r([1, 2], [0, 1023, 1024, 2047]) == 0.5
    assert r([1], []) == 0.0
    # a response mask leaves observation tokens out
    assert r.batch([([1], [5, 2000, 2000], 0, [1, 0, 0]), ([1], [5, 2000], 0)]) == [1.0, 0.5]
    assert TokenSetReward([7])([0], [7, 7, 8, 9]) == 0.5
    with pytest.raises(ValueError):
        TokenSetReward([])


def test_grpo_advantages_are_normalised_within_each_prompt_group():
    rewards = [1.0, 0.0, 0.5, 0.5, 0.2, 0.9, 0.9, 0.3]
    groups = [0, 0, 0, 0, 1, 1, 1, 2]
    adv = grpo_advantages(rewards, groups)
    g0 = np.array(rewards[:4])
    assert np.allclose(adv[:4], (g0 - g0.mean()) / (g0.std(ddof=1) + 1e-6))
    assert abs(adv[:4].sum()) < 1e-9 and abs(adv[4:7].sum()) < 1e-9
    assert adv[7] == 0.0  # a group of one has no relative signal
    assert np.all(grpo_advantages([0.5, 0.5, 0.5], [3, 3, 3]) == 0)  # equal rewards: no update
    with pytest.raises(ValueError):
        grpo_advantages([1.0, 2.0], [0])


class _Weights:
    def __init__(self, nbytes):
        self.nbytes = nbytes


class _FakeTrainer:
    """Stands in for ReferenceTrainer: records the calls, returns plain values."""

    def __init__(self):
        self.calls, self.version = [], 0

    def old_log_prob(self, batch):
        self.calls.append("old_log_prob")
        return [[-1.0] * len(b[1]) for b in batch]

    def ref_log_prob(self, batch):
        self.calls.append("ref_log_prob")
        return [[-1.5] * len(b[1]) for b in batch]

    def update_actor(self, batch, old, adv, ref):
        self.calls.append(("update_actor", len(batch), list(np.round(adv, 3)), ref is not None))
        self.version += 1
        return {"loss": 0.1, "version": self.version}

    def state_dict_bf16(self):
        return {"w": _Weights(10), "v": _Weights(6)}

    def get_version(self):
        return self.version


class _Engine:
    def __init__(self):
        self.loaded = []

    async def load_weights(self, state_dict, version=None):
        self.loaded.append(version)


def _pipeline(name, engines):
    router = type("R", (), {"engines": dict(enumerate(engines))})()
    reps = [type("Rep", (), {"id": i, "router": router})() for i in router.engines]
    return type("P", (), {"name": name, "replicas": reps})()


BATCH = [([1, 2], [5, 6], 0), ([1, 2], [2000, 6], 0), ([3], [2000, 2001], 1), ([3], [7, 2001], 1)]


def test_stage_runner_runs_the_grpo_stages_in_order_and_syncs_the_weights():
    tr, eng = _FakeTrainer(), _Engine()
    runner = ReferenceStageRunner(tr)
    p = _pipeline("p", [eng])

    async def main():
        await runner.run(p, 0, "old_log_prob", (0,), BATCH)
        await runner.run(p, 0, "ref", (0,))
        adv = await runner.run(p, 0, "adv", ())
        upd = await runner.run(p, 0, "update_actor", (0, 1))
        sync = await runner.run(p, 0, "weight_sync", (0, 1))
        return adv, upd, sync

    adv, upd, sync = asyncio.run(main())
    assert runner.rewards[("p", 0)] == [1.0, 0.5, 0.0, 0.5]
    assert adv["reward_mean"] == 0.5
    assert tr.calls[:2] == ["old_log_prob", "ref_log_prob"]
    name, n, a, with_ref = tr.calls[2]
    assert (name, n, with_ref) == ("update_actor", 4, True) and a[0] > 0 > a[1] and a[2] < 0 < a[3]
    assert upd == {"loss": 0.1, "version": 1}
    assert sync["mode"] == "weights" and sync["bytes"] == 16 and eng.loaded == [1]
    assert [r.stage for r in runner.records] == ["old_log_prob", "ref", "adv", "update_actor", "weight_sync"]
    assert runner.records[0].samples == 4 and runner.records[0].tokens == 14
    assert runner.latest_weights(p)[0] == 1 and ("p", 0) not in runner._state


def test_stage_runner_records_when_an_engine_cannot_take_weights():
    tr = _FakeTrainer()
    runner = ReferenceStageRunner({"e": tr, "x": tr, "n": tr})
    emulated = EmulatedEngine()

    async def step(p, k):
        await runner.run(p, k, "update_actor", (0,), BATCH)  # old log-probs and rewards on demand
        return await runner.run(p, k, "weight_sync", (0,))

    assert asyncio.run(step(_pipeline("e", [emulated]), 0))["mode"] == "version-only"
    assert emulated.version == 1
    x = asyncio.run(step(_pipeline("x", [object()]), 0))
    assert x["mode"] == "unsupported" and "not supported" in x["note"]
    assert asyncio.run(step(_pipeline("n", []), 0))["mode"] == "no-engines"
    with pytest.raises(ValueError, match="needs the step's samples"):
        asyncio.run(runner.run("z", 0, "old_log_prob", (0,)))
    with pytest.raises(ValueError, match="unknown stage"):
        asyncio.run(runner.run("e", 5, "bogus", (0,), BATCH))


def test_live_world_hands_each_step_s_tokens_to_the_stage_runner():
    """The live executor (EMULATED engines) calls the runner for every training stage with the
    step's samples: the prompt shared by a prompt's samples, the generated tokens, the
    group, and a response mask with observations at 0 (agentic pipeline)."""
    from jigsaw_plugin.costmodel import CostModel, hardware_profile
    from jigsaw_plugin.runtime.live import LiveExecutor
    from jigsaw_plugin.scheduler import get_policy
    from sim_helpers import small_workload

    cost = CostModel(hardware_profile("h100"))
    wl = small_workload(gpus=4, pipelines=2, prompts=2, samples=3, steps=2, median=40, algorithms=("grpo", "dapo"))
    seen = []

    class Recorder(ReferenceStageRunner):
        async def run(self, pipeline, step, stage, devices, samples):
            seen.append((pipeline.name, step, stage, tuple(devices), samples))
            return await super().run(pipeline, step, stage, devices, samples)

    trainers = {"p0": _FakeTrainer(), "p1": _FakeTrainer()}
    runner = Recorder(trainers)
    factory = lambda p, d: EmulatedEngine(cost, p.model, tp=len(d), time_scale=0.02)  # noqa: E731
    live = LiveExecutor(wl, get_policy("verl-sync"), factory, seed=0, time_scale=0.02, stage_runner=runner)
    asyncio.run(asyncio.wait_for(live.run(), 60))

    order = {"p0": ["old_log_prob", "ref", "adv", "update_actor", "weight_sync"],
             "p1": ["old_log_prob", "adv", "update_actor", "weight_sync"]}
    for name, stages in order.items():
        assert [(s, st) for n, s, st, _, _ in seen if n == name] == [(k, st) for k in (0, 1) for st in stages]
        assert trainers[name].version == 2 and runner.sync[name]["mode"] in ("version-only", "no-engines")
    for name, step, stage, devices, samples in seen:
        smp = live.pipelines[name].steps[step].samples
        assert len(samples) == 6 and [g for _, _, g, _ in samples] == [0, 0, 0, 1, 1, 1]
        assert (devices == ()) == (stage == "adv")
        for i, (prompt, response, group, mask) in enumerate(samples):
            assert prompt == samples[3 * group][0] and len(prompt) == smp.prompt_len[i]
            assert len(mask) == len(response) and sum(mask) == smp.generated_per_sample()[i]
        assert samples[0][0] != samples[3][0]
    agentic = [m for n, _, _, _, smp in seen if n == "p1" for _, _, _, m in smp]
    assert any(0 in m for m in agentic)  # p1 is multi-turn: observations are masked out
    assert live.trajectories == {}


# ---- micro-batch plans and resizable stages (microbatch.py, micro_stage.py) ------------------
from jigsaw_plugin.errors import SpecError  # noqa: E402
from jigsaw_plugin.runtime.reference.microbatch import (  # noqa: E402
    DEFAULT_MICRO_BATCH_SIZE,
    DeviceGrant,
    check_devices,
    forward_plan,
    trained_tokens,
    update_plan,
)


def test_forward_plan_cuts_the_batch_in_order():
    plan = forward_plan(10, 4)
    assert [m.samples for m in plan.micro_batches] == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9)]
    assert [m.index for m in plan.micro_batches] == [0, 1, 2] and plan.mini_batches == 1
    assert [m.samples for m in forward_plan(3, None).micro_batches] == [(0, 1, 2)]  # None: no split
    assert forward_plan(32).micro_batch_size == DEFAULT_MICRO_BATCH_SIZE == 4


def test_update_plan_shuffles_splits_into_mini_batches_then_micro_batches():
    plan = update_plan(32, 4, mini_batches=4, seed=0, version=0)
    assert plan.mini_batches == 4 and len(plan.micro_batches) == 8
    assert [m.index for m in plan.micro_batches] == list(range(8))
    assert [m.mini_batch for m in plan.micro_batches] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(len(g) == 2 for g in plan.groups())
    flat = [i for m in plan.micro_batches for i in m.samples]
    assert sorted(flat) == list(range(32)) and flat != list(range(32))  # every sample once, shuffled
    assert plan == update_plan(32, 4, mini_batches=4, seed=0, version=0)  # fixed order
    assert plan != update_plan(32, 4, mini_batches=4, seed=0, version=1)  # reshuffled per update
    assert [m.samples for m in update_plan(5, 2, mini_batches=1).micro_batches] == [(0, 1), (2, 3), (4,)]
    # fewer samples than mini-batches: one sample per step, none empty
    assert [m.samples for m in update_plan(2, 4, mini_batches=4).micro_batches] in ([(0,), (1,)], [(1,), (0,)])
    batch = [([1], [5, 6, 7], 0, [1, 0, 1]), ([1], [5, 6], 0)]
    assert trained_tokens(batch, [0, 1]) == 4


@pytest.mark.parametrize("bad", [0, -2, 2.5, "4", True])
def test_a_bad_micro_batch_size_names_the_field(bad):
    with pytest.raises(SpecError) as e:
        forward_plan(8, bad)
    assert e.value.field == "micro_batch_size" and repr(bad) in str(e.value) and "positive integer" in str(e.value)
    with pytest.raises(SpecError, match="micro_batch_size"):
        update_plan(8, bad)


def test_bad_plan_inputs_and_grant_answers_name_the_field():
    with pytest.raises(SpecError, match="mini_batches: got 0"):
        update_plan(8, 2, mini_batches=0)
    with pytest.raises(SpecError, match="n_samples: got 0"):
        forward_plan(0, 2)
    for bad in ("01", (0, 0), (-1,), (1.5,), 3, None):
        with pytest.raises(SpecError) as e:
            check_devices(bad)
        assert e.value.field == "grant" and "() pauses the stage" in str(e.value)
    assert check_devices([1, np.int64(0)]) == (1, 0) and check_devices(()) == ()


class _MicroTrainer(_FakeTrainer):
    """A torch-free stand-in with the micro-batch methods: a micro-batch's "gradient" is
    the list of its samples; optimizer_step records what it was asked to sum."""

    micro_batch_size, mini_batches, seed = 2, 2, 0

    def __init__(self, wait_for=None):
        import collections
        import threading

        super().__init__()
        self.kept, self.steps, self.threads, self.finished = {}, [], {}, []
        self.wait_for = wait_for or {}  # index -> the index whose end it waits for (concurrency)
        self.ended = collections.defaultdict(threading.Event)

    def update_plan(self, n):
        return update_plan(n, self.micro_batch_size, self.mini_batches, self.seed, self.version)

    def micro_grad(self, index, samples, old, adv, ref, normalizer):
        import threading

        if index in self.wait_for:  # only ends if the other one runs beside it (else: a timeout)
            assert self.ended[self.wait_for[index]].wait(10), f"micro-batch {self.wait_for[index]} never ran beside"
        self.threads[index] = threading.current_thread().name
        self.kept[index] = (len(samples), list(np.round(adv, 3)), normalizer, ref is not None)
        self.finished.append(index)
        self.ended[index].set()
        return {"loss": float(index), "pg_loss": 0.0, "clip_frac": 0.0, "approx_kl": 0.0, "kl": 0.0}

    def optimizer_step(self, indices):
        self.steps.append(list(indices))
        return 1.0

    def finish_update(self, stats, norms, mini_batches, tokens, time_s):
        self.version += 1
        return {"losses": [s["loss"] for s in stats], "norms": norms, "tokens": tokens, "version": self.version}


def test_update_actor_runs_micro_batch_by_micro_batch_on_granted_devices_with_a_pause():
    tr = _MicroTrainer(wait_for={2: 3})  # micro-batch 2 ends after 3, which runs beside it
    answers = iter([(0,), (0,), (0, 1), (), (), (1,), (1,), (0,), (0,)])
    seen = []

    def grant(request):
        seen.append((request.next_micro_batch, request.remaining, request.current))
        return next(answers)

    runner = ReferenceStageRunner(tr, grant=grant, pause_poll_s=0.001)
    batch = BATCH * 2  # 8 samples: 2 mini-batches x 2 micro-batches of 2

    async def main():
        await runner.run("p", 0, "adv", (), batch)
        return await runner.run("p", 0, "update_actor", (0,))

    metrics = asyncio.run(main())
    runner.close()
    rec = runner.records[-1]
    assert [m.index for m in rec.micro_batches] == [0, 1, 2, 3]
    assert [m.width for m in rec.micro_batches] == [1, 1, 2, 2]
    assert [m.device for m in rec.micro_batches] == [0, 0, 0, 1]
    assert [m.mini_batch for m in rec.micro_batches] == [0, 0, 1, 1]
    assert tr.finished == [0, 1, 3, 2]  # out of order ...
    assert tr.steps == [[0, 1], [2, 3]] and metrics["losses"] == [0.0, 1.0, 2.0, 3.0]  # ... summed in order
    assert tr.threads[2] != tr.threads[3] and tr.threads[0] == tr.threads[2]  # one worker per device
    assert metrics["tokens"] == 16 and metrics["version"] == 1
    assert all(k[2] == 8 for k in tr.kept.values())  # each micro-batch normalised by its mini-batch's tokens
    # asked before micro-batches 0, 1, 2 (a width-2 wave runs 2 and 3); the mini-batch boundary is
    # a boundary: micro-batch 0 of the next update would be asked again. No pause here yet.
    assert [s[0] for s in seen] == [0, 1, 2] and seen[2][2] == (0,) and seen[0][1] == 4
    # a second update: paused twice (width 0), then resumed on device 1
    asyncio.run(runner.run("p", 1, "update_actor", (0,), batch))
    rec = runner.records[-1]
    assert [m.pauses for m in rec.micro_batches] == [2, 0, 0, 0]
    assert rec.micro_batches[0].waited_s > 0 and [m.device for m in rec.micro_batches] == [1, 1, 0, 0]


def test_a_grant_needs_a_micro_batch_trainer_and_a_valid_answer():
    runner = ReferenceStageRunner(_FakeTrainer(), grant=lambda r: (0,))
    with pytest.raises(TypeError, match="micro-batch methods"):
        asyncio.run(runner.run("p", 0, "update_actor", (0,), BATCH))
    runner = ReferenceStageRunner(_MicroTrainer(), grant=lambda r: "0")
    with pytest.raises(SpecError, match="grant: got '0'"):
        asyncio.run(runner.run("p", 0, "update_actor", (0,), BATCH))
    # the default (no grant): one whole-stage call, as before, no micro-batch records
    runner = ReferenceStageRunner(_MicroTrainer())
    asyncio.run(runner.run("p", 0, "update_actor", (0,), BATCH))
    assert runner.records[-1].micro_batches == () and runner.records[-1].metrics["version"] == 1


def test_device_grant_answers_what_the_scheduler_set_last():
    g = DeviceGrant((0,))
    runner = ReferenceStageRunner(_MicroTrainer(), grant=g, pause_poll_s=0.001)

    async def main():
        await runner.run("p", 0, "adv", (), BATCH * 2)
        g.set(())  # paused until the scheduler hands devices back

        async def resume():  # 30 ms after the stage first asked
            while not g.asked:
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.03)
            g.set((0, 1))

        _, out = await asyncio.gather(resume(), runner.run("p", 0, "update_actor", (0,)))
        return out

    asyncio.run(main())
    runner.close()
    rec = runner.records[-1].micro_batches
    assert rec[0].pauses > 0 and rec[0].waited_s >= 0.02 and [m.width for m in rec] == [2, 2, 2, 2]
    with pytest.raises(SpecError, match="grant"):
        g.set((0, 0))


def test_the_live_executor_resizes_a_training_stage_through_the_runners_grant():
    """ResizeStage on the live executor: the update of step 0 shrinks from 2 devices to 1 at
    a micro-batch boundary; the freed device goes back to the pool there, and the update is
    whole (every micro-batch ran once, summed in order)."""
    from jigsaw_plugin.costmodel import CostModel, hardware_profile
    from jigsaw_plugin.hookspecs import hookimpl
    from jigsaw_plugin.manager import get_plugin_manager, register
    from jigsaw_plugin.runtime.live import LiveExecutor
    from jigsaw_plugin.scheduler import ResizeStage, get_policy
    from sim_helpers import small_workload

    cost = CostModel(hardware_profile("h100"))
    wl = small_workload(gpus=2, pipelines=1, prompts=2, samples=4, steps=1, median=20, algorithms=("grpo",),
                        agentic=(False,))
    trainer = _MicroTrainer()
    runner = ReferenceStageRunner({"p0": trainer}, pause_poll_s=0.001)
    asked = []

    class Shrink:
        @hookimpl(tryfirst=True)
        def jigsaw_schedule(self, state):
            p = state.order[0]
            if p.stage_running and p.stages[p.stage_next] == "update_actor" and not asked:
                asked.append(state.t)
                return [ResizeStage("p0", 0, "update_actor", (1,))]
            return None

    pm = get_plugin_manager(load_entrypoints=False)
    register(pm, Shrink(), "shrink")
    live = LiveExecutor(wl, get_policy("verl-sync"), lambda p, d: EmulatedEngine(cost, p.model, tp=len(d),
                                                                                 time_scale=0.02),
                        time_scale=0.02, stage_runner=runner, pm=pm, resize_stages=True)
    asyncio.run(asyncio.wait_for(live.run(), 60))
    runner.close()
    rec = [r for r in runner.records if r.stage == "update_actor"][0]
    assert asked and rec.micro_batches
    assert sorted(m.index for m in rec.micro_batches) == list(range(len(rec.micro_batches)))
    assert {m.device for m in rec.micro_batches[-2:]} == {1}  # after the boundary: device 1 only
    assert trainer.steps == [[0, 1], [2, 3]] and live.pipelines["p0"].done
    assert live.free == {0, 1}
