"""An early pass that goes on as its stage's own pass (``ResizeStage.rest``): the
simulator's bookkeeping and checks, and the jigsaw policy's choice on a hand-built state
(docs/simulator.md, "Early forward passes")."""

import dataclasses

import pytest

from jigsaw_plugin.core.executor import PolicyViolation
from jigsaw_plugin.scheduler import ResizeStage, RunStage, get_policy
from jigsaw_plugin.scheduler.jigsaw import Jigsaw
from jigsaw_plugin.scheduler.state import DeviceTask, RunningStageView
from jigsaw_plugin.sim.engine import Simulation
from sim_helpers import HookLog
from test_early_passes import _long_tail
from test_jigsaw_decide import pipeline, state, step


class _SlowEarlyPass(Jigsaw):
    """The jigsaw policy (its own early passes and in-place re-shards off) that sends one
    early log-prob pass of every finished token on a single free device once all but one of
    step 0's trajectories are done (still running when the batch is complete), and
    then, if ``rest`` says so, ``rest(p, running_stage)`` once the batch is complete."""

    def __init__(self, rest=None, **options):
        super().__init__(early_passes=False, reshard_in_place=False, idle_spread=False, **options)
        self.rest, self.sent, self.rested = rest, False, False

    def decide(self, state):
        out = super().decide(state)
        taken = {d for x in out for d in getattr(x, "devices", ())}
        free = sorted(set(state.free) - taken)
        for p in state.order:
            s = p.steps.get(0)
            if s is None or p.train_next != 0:
                continue
            if not self.sent and free and s.gen_done >= s.samples - 1 and s.rewarded < s.samples \
                    and not p.stage_running:
                self.sent = True
                return out + [RunStage(p.name, 0, "old_log_prob", (free[0],), False, early=True)]
            rs = p.running_stage
            if self.rest and not self.rested and rs is not None and p.early_stage and s.rewarded >= s.samples:
                self.rested = True
                return out + [self.rest(p, rs)]
        return out


def _run(policy, hooks=None, early=True):
    sim = Simulation(_long_tail(), policy, hooks=hooks)
    sim.world.supports_early_passes = early
    return sim, sim.run()


def _own_pass(log, step=0, stage="old_log_prob"):
    """(start, end) events of the stage's own pass: its last start and end of ``step``."""
    starts = [kw for kw in log.by("jigsaw_stage_start") if kw["step"] == step and kw["stage"] == stage]
    ends = [kw for kw in log.by("jigsaw_stage_end") if kw["step"] == step and kw["stage"] == stage]
    return starts, ends


def _rest(p, rs):
    return ResizeStage(p.name, rs.step, rs.stage, rs.devices, rest=True)


def test_an_early_pass_goes_on_as_the_stages_own_pass_reading_each_token_once():
    log = HookLog()
    sim, result = _run(_SlowEarlyPass(rest=_rest), hooks=log)
    s = sim.world.pipelines["p0"].steps[0]
    starts, ends = _own_pass(log)
    assert len(starts) == 2 and len(ends) == 2  # the early part, then the stage's own pass
    early_read = ends[0]["tokens"]
    # the early part read only the micro-batches it ran (fewer than it was given) ...
    assert 0 < early_read < starts[0]["tokens"] and s.covered["old_log_prob"] == early_read
    # ... and the own pass, on the same gang from that boundary on, read the rest
    assert starts[1]["tokens"] == s.tokens - early_read
    assert starts[1]["devices"] == starts[0]["devices"] and starts[1]["t"] == ends[0]["t"]
    assert starts[1]["t"] >= s.gen_end_t
    assert result["pipelines"]["p0"]["early_passes"] == 1


def test_going_on_pays_one_fixed_cost_over_both_parts_and_ends_the_stage_sooner():
    log = HookLog()
    went_on, _ = _run(_SlowEarlyPass(rest=_rest), hooks=log)
    waited, _ = _run(_SlowEarlyPass(rest=None))  # the early pass reads its chunk, then the own pass
    a, b = went_on.world.pipelines["p0"].steps[0], waited.world.pipelines["p0"].steps[0]
    assert a.tokens == b.tokens and a.gen_end_t == b.gen_end_t
    assert a.stage_t["old_log_prob"][1] < b.stage_t["old_log_prob"][1]
    # the own pass (on the gang it grew to at that boundary) costs the tokens past those its
    # early part read and the share of the fixed cost that part left unpaid: more than the
    # tokens alone, less than a fresh pass over them
    starts, ends = _own_pass(log)
    world, p = went_on.world, went_on.world.pipelines["p0"]
    devices = next(devs for name, _, devs, t0, _ in world.trace if name == "p0 old_log_prob s0" and t0 == starts[1]["t"])
    read, rest = ends[0]["tokens"], starts[1]["tokens"]
    own = ends[1]["t"] - starts[1]["t"]
    price = lambda tokens: world.price_stage(p, a, "old_log_prob", devices, False, tokens)
    assert price(read + rest) - price(read) < own < price(rest)
    assert own == pytest.approx(price(read + rest) - price(read) + 0.75 * price(1))  # 2 of its 8 ran


@pytest.mark.parametrize("make, match", [
    # asked of a stage that is no early pass: the pass of step 0 is its own by then
    (lambda p, rs: ResizeStage(p.name, rs.step, "ref", rs.devices, rest=True), "runs no early pass"),
])
def test_rest_of_what_is_no_early_pass_is_refused(make, match):
    with pytest.raises(PolicyViolation, match=match):
        _run(_SlowEarlyPass(rest=make))


def test_rest_before_the_batch_is_complete_is_refused():
    class _Early(_SlowEarlyPass):
        def decide(self, state):
            out = super().decide(state)
            p = state.order[0]
            rs = p.running_stage
            if rs is not None and p.early_stage and not self.rested:
                self.rested = True
                out = out + [ResizeStage(p.name, rs.step, rs.stage, rs.devices, rest=True)]
            return out

    with pytest.raises(PolicyViolation, match="before its batch is complete"):
        _run(_Early())


def test_an_executor_without_early_passes_refuses_rest():
    # a probe that sends it once the pass of step 0 runs as its own, on an executor that
    # runs no early pass: refused for the capability before anything else
    class _Own(Jigsaw):
        def __init__(self):
            super().__init__(early_passes=False)
            self.sent = False

        def decide(self, state):
            out = super().decide(state)
            for p in state.order:
                rs = p.running_stage
                if rs is not None and not self.sent:
                    self.sent = True
                    out = out + [ResizeStage(p.name, rs.step, rs.stage, rs.devices, rest=True)]
            return out

    with pytest.raises(PolicyViolation, match="capability 'early_passes'"):
        _run(_Own(), early=False)


def test_rest_must_be_a_bool():
    with pytest.raises(Exception, match="ResizeStage.rest"):
        ResizeStage("p0", 0, "old_log_prob", (1,), rest="yes")


# ---- the policy's choice on a hand-built state ------------------------------------------
def _early_running(rewarded=32, rest=False, left=5, stage="old_log_prob"):
    """p0's early log-prob pass of step 1 runs on devices 1-3 (``left`` micro-batches of 8
    to go), its step's 32 trajectories generated and ``rewarded`` of them rewarded."""
    rs = RunningStageView(1, stage, (1, 2, 3), None, left, 8, 101.0, True, rest)
    p0 = pipeline(0, range(4), steps={1: step(1, samples=32, done=32, rewarded=rewarded, tokens=24000)},
                  gen_next=2, train_next=1, version=1, stage_running=True, running_end=103.0, running_stage=rs)
    p0 = dataclasses.replace(p0, early_stage=stage)
    p1 = pipeline(1, range(4, 8), gen_next=1, train_next=1, version=1, steps={1: step(1)})
    busy = {d: DeviceTask("stage", "p0", stage=stage) for d in (1, 2, 3)}
    return dataclasses.replace(state([p0, p1], busy=busy), early_passes=True)


def _rests(out):
    return [d for d in out if isinstance(d, ResizeStage) and d.rest]


def test_policy_lets_an_early_pass_go_on_once_its_batch_is_complete():
    out = get_policy("jigsaw").decide(_early_running())
    assert _rests(out) == [ResizeStage("p0", 1, "old_log_prob", (1, 2, 3), rest=True)]


@pytest.mark.parametrize("kw, options", [
    ({"rewarded": 31}, {}),  # a reward still to come: the stage's own pass may not start yet
    ({"rest": True}, {}),  # asked already
    ({"left": 1}, {}),  # its last micro-batch: it ends at the boundary anyway
    ({"stage": "ref"}, {}),  # the pass is not of the stage that runs next (old_log_prob)
    ({}, {"early_rest": False}),  # the switch
])
def test_policy_leaves_an_early_pass_be_otherwise(kw, options):
    assert not _rests(get_policy("jigsaw", **options).decide(_early_running(**kw)))
