"""Early forward passes (``RunStage(early=True)``): the executor's bookkeeping and checks,
and the jigsaw policy's choice on a hand-built state (docs/simulator.md, "Early forward
passes")."""

import dataclasses
from collections import defaultdict

import pytest

from jigsaw_plugin.core.executor import PolicyViolation
from jigsaw_plugin.scheduler import RunStage, get_policy
from jigsaw_plugin.scheduler.jigsaw import Jigsaw
from jigsaw_plugin.sim.engine import Simulation
from sim_helpers import HookLog, small_workload
from test_jigsaw_decide import COST, MODEL, _busy_with_replicas, pipeline, replica, state, step


def _long_tail(**kw):
    # one synchronous GRPO pipeline with a heavy tail on a pool much wider than its rollout
    # needs at the end: the devices its rollout lets go can read finished trajectories
    return small_workload(gpus=8, pipelines=1, prompts=16, samples=8, steps=2, agentic=(False,),
                          algorithms=("grpo",), median=400, **kw)


class _Probe(Jigsaw):
    """The jigsaw policy (early passes and in-place re-shards off) that sends one RunStage of its own, built by
    ``make(state, pipeline, step_view)``, the first time a step to train next has some
    trajectories finished and is still generating, on the devices free then."""

    def __init__(self, make, **options):
        # no in-place re-shard: the tail must leave devices free for the probe's pass; no
        # idle_spread (the pipeline is alone): its rollout would hold the whole pool
        super().__init__(early_passes=False, reshard_in_place=False, idle_spread=False, **options)
        self.make, self.sent = make, False

    def decide(self, state):
        out = super().decide(state)
        if self.sent:
            return out
        taken = {d for x in out for d in getattr(x, "devices", ())}
        free = tuple(sorted(set(state.free) - taken))
        for p in state.order:
            s = p.steps.get(p.train_next)
            if free and s is not None and 0 < s.gen_done and s.rewarded < s.samples and not p.stage_running:
                self.sent = True
                return out + [self.make(p, s, free)]
        return out


def _run(policy, hooks=None, early=True):
    sim = Simulation(_long_tail(), policy, hooks=hooks)
    sim.world.supports_early_passes = early
    return sim, sim.run()


def test_every_forward_stage_reads_each_token_once_across_its_passes():
    log = HookLog()
    sim, result = _run(_Probe(lambda p, s, free: RunStage(p.name, p.train_next, "old_log_prob", free, False,
                                                          early=True)), hooks=log)
    assert result["pipelines"]["p0"]["early_passes"] == 1
    read = defaultdict(int)
    for kw in log.by("jigsaw_stage_start"):
        read[(kw["step"], kw["stage"])] += kw["tokens"]
    for k, s in sim.world.pipelines["p0"].steps.items():
        assert read[(k, "old_log_prob")] == s.tokens  # early + own pass: the batch, once
        assert read[(k, "ref")] == s.tokens
    # the early pass read only trajectories finished before it started
    first = sim.world.pipelines["p0"].steps[0]
    assert 0 < first.covered["old_log_prob"] < first.tokens
    starts = [kw for kw in log.by("jigsaw_stage_start") if kw["step"] == 0 and kw["stage"] == "old_log_prob"]
    assert len(starts) == 2 and starts[0]["t"] < first.gen_end_t <= starts[1]["t"]


def test_an_early_pass_shortens_the_stage_after_the_tail():
    plain, _ = _run(_Probe(lambda p, s, free: RunStage(p.name, p.train_next, "ref", free, False, early=True)))
    base, _ = _run(get_policy("jigsaw", early_passes=False))
    s_early, s_base = plain.world.pipelines["p0"].steps[0], base.world.pipelines["p0"].steps[0]
    own_early = s_early.stage_t["ref"][1] - s_early.stage_t["ref"][0]
    own_base = s_base.stage_t["ref"][1] - s_base.stage_t["ref"][0]
    assert own_early < own_base


def test_an_early_pass_reads_at_most_its_tokens():
    log = HookLog()
    sim, _ = _run(_Probe(lambda p, s, free: RunStage(p.name, p.train_next, "old_log_prob", free, False,
                                                     early=True, tokens=100)), hooks=log)
    first = sim.world.pipelines["p0"].steps[0]
    assert first.covered["old_log_prob"] == 100  # of the 401 finished when it started
    read = sum(kw["tokens"] for kw in log.by("jigsaw_stage_start") if kw["step"] == 0 and kw["stage"] == "old_log_prob")
    assert read == first.tokens


@pytest.mark.parametrize("make, match", [
    (lambda p, s, free: RunStage(p.name, p.train_next, "old_log_prob", free, False, early=True, tokens=-5),
     "RunStage.tokens=-5"),
    (lambda p, s, free: RunStage(p.name, p.train_next, "update_actor", free, False, early=True),
     "only old_log_prob, ref"),
    (lambda p, s, free: RunStage(p.name, p.train_next + 1, "old_log_prob", free, False, early=True),
     "only the step to train next"),
    (lambda p, s, free: RunStage(p.name, p.train_next, "old_log_prob", (), False, early=True), "needs devices"),
])
def test_bad_early_passes_are_refused_naming_what_is_allowed(make, match):
    with pytest.raises(PolicyViolation, match=match):
        _run(_Probe(make))


def test_an_executor_without_the_capability_refuses_an_early_pass():
    probe = _Probe(lambda p, s, free: RunStage(p.name, p.train_next, "old_log_prob", free, False, early=True))
    with pytest.raises(PolicyViolation, match="capability 'early_passes'"):
        _run(probe, early=False)


# ---- the policy's choice on a hand-built state ------------------------------------------
def _tail_state(done, early_passes=True, covered=None, tokens_each=750, started=(300.0, 200.0), left=20000):
    """p0 generates step 1, its rollout down to one replica on device 0 (devices 1-3 of its
    home free); p1 waits for its step 1. ``started``: when each started its step 1, after
    one step each: the later one is on the job set's critical path at its observed pace."""
    reps = [replica("p0", 1, (0,), generated=[3000], predicted=[left])]
    view = step(1, samples=32, done=done)
    view = type(view)(**{**{f: getattr(view, f) for f in view.__slots__}, "gen_start_t": started[0],
                         "finished_tokens": done * tokens_each, "covered": covered or {}})
    other = step(1)
    other = type(other)(**{**{f: getattr(other, f) for f in other.__slots__}, "gen_start_t": started[1]})
    p0 = pipeline(0, range(4), replicas=reps, gen_next=2, train_next=1, version=1, generating=True,
                  steps={1: view})
    p1 = pipeline(1, range(4, 8), gen_next=1, train_next=1, version=1, steps={1: other})
    st = state([p0, p1], busy=_busy_with_replicas([p0]), t=max(started) + 30.0)
    return type(st)(**{**{f: getattr(st, f) for f in st.__dataclass_fields__}, "early_passes": early_passes})


def _early(out):
    return [d for d in out if isinstance(d, RunStage) and d.early]


def test_policy_reads_finished_trajectories_on_devices_the_tail_let_go():
    out = get_policy("jigsaw", migration=False).decide(_tail_state(done=31))
    (early,) = _early(out)
    assert early.pipeline == "p0" and early.step == 1 and early.stage == "old_log_prob"
    assert set(early.devices) <= {1, 2, 3}  # its home's free devices, not the tail's


def test_policy_reads_what_the_free_devices_can_before_the_tail_ends():
    # a hundred times the finished tokens and a short tail: no free gang reads them all
    # before the tail's projected end, so the pass reads a part of them, ending by then
    st = _tail_state(done=31, tokens_each=75000, left=2000)
    (early,) = _early(get_policy("jigsaw", migration=False).decide(st))
    assert len(early.devices) == 3 and 0 < early.tokens < 31 * 75000
    drain = max(r.predicted_drain_s() for r in st.order[0].replicas)
    assert COST.forward_s(MODEL, len(early.devices), early.tokens) <= drain * 1.01


def test_policy_prices_loading_the_training_state_onto_devices_that_lack_it():
    # the tail's projected end (6.7 s) leaves one device time to read the finished tokens
    # (4.7 s) where it holds p0's training state, not where it holds another pipeline's
    # (the load onto one device, 4.9 s, comes first): then a wider gang, whose load is
    # shorter, and the pass with the load still ends by the tail's end
    st = _tail_state(done=31, tokens_each=3000, left=1000)
    drain = max(r.predicted_drain_s() for r in st.order[0].replicas)
    (early,) = _early(get_policy("jigsaw", migration=False).decide(st))
    assert len(early.devices) == 1 and early.tokens == 0
    foreign = dataclasses.replace(st, devices=tuple(dataclasses.replace(d, train_resident="p1") if d.id in (1, 2, 3)
                                                    else d for d in st.devices))
    (early,) = _early(get_policy("jigsaw", migration=False).decide(foreign))
    n = len(early.devices)
    assert n > 1 and early.tokens == 0
    assert COST.forward_s(MODEL, n, 31 * 3000) + COST.context_switch_s(MODEL, n, train_state=True) <= drain


def test_policy_moves_on_to_the_next_forward_stage_once_one_is_read():
    out = get_policy("jigsaw", migration=False).decide(_tail_state(done=31, covered={"old_log_prob": 31 * 750}))
    (early,) = _early(out)
    assert early.stage == "ref"


@pytest.mark.parametrize("kw", [dict(done=8), dict(done=31, early_passes=False),
                                dict(done=31, covered={"old_log_prob": 31 * 700, "ref": 31 * 700})])
def test_policy_sends_no_early_pass_too_soon_unsupported_or_with_little_left(kw):
    assert not _early(get_policy("jigsaw", migration=False).decide(_tail_state(**kw)))


def test_off_the_critical_path_an_early_pass_takes_only_its_own_free_home_devices():
    # p0 started its step first: p1 is on the critical path, p0 off it. With
    # ``early_merges`` p0 reads its finished trajectories on its own home's free devices
    # (1-3), never on devices it would borrow (the default); without it, not at all
    off = _tail_state(done=31, started=(200.0, 300.0), tokens_each=75000, left=2000)
    (early,) = _early(get_policy("jigsaw", migration=False, early_merges=True).decide(off))
    assert early.pipeline == "p0" and set(early.devices) <= {1, 2, 3}
    assert not _early(get_policy("jigsaw", migration=False, early_merges=False).decide(off))


def _merge_slack(state, **options):
    """The stretch a tail merge of p0 may make, as a fraction of its tail's projected end:
    the bound ``Ends`` derives from ``_slack`` and ``_early_stretch``, over the latest end."""
    from jigsaw_plugin.scheduler.jigsaw.round import Ends, Round

    policy = Jigsaw(**options)
    home, owner = policy._homes(state)
    rnd = Round(state, home, owner)
    p = state.order[0]
    live = [r for r in p.replicas if not r.retiring]
    bound, _ = Ends(policy._slack(rnd, p), extra=policy._early_stretch(rnd, p)).latest(live)
    return bound / max(r.predicted_drain_s() for r in live) - 1


def _home_taken(st):
    """``st`` with p0's free home devices (1-3) held by a stage of p1: an early pass of p0
    has no device to run on unless a merge frees one."""
    from jigsaw_plugin.scheduler.state import DeviceTask

    task = DeviceTask("stage", "p1", stage="update_actor")
    return dataclasses.replace(st, free=frozenset(d for d in st.free if d not in (1, 2, 3)),
                               devices=tuple(dataclasses.replace(d, task=task) if d.id in (1, 2, 3) else d
                                             for d in st.devices))


def test_a_tail_merge_may_stretch_a_step_by_what_its_early_pass_would_take_off_the_chain():
    # p0's step 1: 31 of 32 trajectories finished, log-prob and reference passes to run,
    # its home's other devices taken: the devices a merge frees would read them, so with
    # ``early_merges`` a merge may stretch its generation by what that pass would take off
    # the chain after the tail (the pass over them on p0's 4-device home, less its fixed
    # cost), as a fraction of the tail's projected end, at most ``merge_for_early`` more
    # than ``latency_slack``
    big = _home_taken(_tail_state(done=31, tokens_each=75000))
    tail = max(r.predicted_drain_s() for r in big.order[0].replicas)
    saved = COST.forward_s(MODEL, 4, 31 * 75000) - COST.f.train_stage_overhead_s
    assert _merge_slack(big, early_merges=True) == pytest.approx(0.05 + min(0.2, saved / tail))
    assert 0.05 < _merge_slack(big, early_merges=True) <= 0.25 + 1e-12
    assert _merge_slack(big, early_merges=True, merge_for_early=0.01) == pytest.approx(0.06)
    assert _merge_slack(big, early_merges=False) == pytest.approx(0.05)
    # its home's free devices can read them now, or a pass of p0 already runs: no merge
    # is needed for the pass, so no stretch
    assert _merge_slack(_tail_state(done=31, tokens_each=75000), early_merges=True) == pytest.approx(0.05)
    running = dataclasses.replace(big, order=(dataclasses.replace(big.order[0], stage_running=True), big.order[1]))
    assert _merge_slack(running, early_merges=True) == pytest.approx(0.05)
    # little to read early: the pass would take about its fixed cost off, no more stretch
    assert _merge_slack(_home_taken(_tail_state(done=31, tokens_each=10)), early_merges=True) == pytest.approx(
        0.05, abs=1e-3)
    # before ``early_from`` of the step has finished, all read early already, or early passes off or unsupported
    assert _merge_slack(_home_taken(_tail_state(done=8, tokens_each=75000)), early_merges=True) == pytest.approx(0.05)
    read = _home_taken(_tail_state(done=31, tokens_each=75000, covered={"old_log_prob": 31 * 75000,
                                                                        "ref": 31 * 75000}))
    assert _merge_slack(read, early_merges=True) == pytest.approx(0.05)
    assert _merge_slack(big, early_merges=True, early_passes=False) == pytest.approx(0.05)
    unsupported = _tail_state(done=31, tokens_each=75000, early_passes=False)
    assert _merge_slack(unsupported, early_merges=True) == pytest.approx(0.05)


def _reward_wait_state(waits, gen_end=320.0, reward_s=0.0):
    """p0's step 1 generated all 32 trajectories at ``gen_end`` and waits on 22 rewards
    (a sandbox), no replica left, its home (0-3) free; p1 waits for its step 1; p0 is on the
    critical path at its observed pace (it started its step 1 later). ``waits``: the reward
    waits its earlier steps saw (``stage_history_s["reward"]``); ``reward_s``: the mean
    reward of its trajectories so far (``LengthSummary.reward_s``)."""
    import dataclasses

    view = dataclasses.replace(step(1, samples=32, done=32, rewarded=10), gen_start_t=300.0,
                               finished_tokens=32 * 750, gen_end_t=gen_end)
    other = dataclasses.replace(step(1), gen_start_t=200.0)
    p0 = pipeline(0, range(4), gen_next=2, train_next=1, version=1, steps={1: view})
    p0 = dataclasses.replace(p0, stage_history_s={"reward": tuple(waits)} if waits else {},
                             lengths=dataclasses.replace(p0.lengths, reward_s=reward_s))
    p1 = pipeline(1, range(4, 8), gen_next=1, train_next=1, version=1, steps={1: other})
    st = state([p0, p1], t=gen_end + 5.0)
    return dataclasses.replace(st, early_passes=True)


def test_policy_runs_the_passes_that_need_no_reward_while_a_sandbox_scores_the_step():
    # earlier steps waited at least 200 s on their rewards after their last trajectory: the
    # log-prob pass over the whole step runs now, on the idle home, as verl's
    # launch_reward_fn_async overlaps it; not before any wait was seen, nor with the switch off
    (early,) = _early(get_policy("jigsaw").decide(_reward_wait_state([200.0, 260.0])))
    assert early.stage == "old_log_prob" and early.tokens == 0 and set(early.devices) <= {0, 1, 2, 3}
    assert not _early(get_policy("jigsaw").decide(_reward_wait_state([])))
    assert not _early(get_policy("jigsaw", early_in_reward_wait=False).decide(_reward_wait_state([200.0])))
    # the wait seen is nearly over: too little time left to read a pass's fixed cost's worth
    assert not _early(get_policy("jigsaw").decide(_reward_wait_state([6.0])))
    # no step's wait seen yet (a pipeline's first step), but its trajectories' rewards have
    # taken 200 s each on average: the step's last one will too
    (early,) = _early(get_policy("jigsaw").decide(_reward_wait_state([], reward_s=200.0)))
    assert early.stage == "old_log_prob" and early.tokens == 0


def test_policy_runs_a_pass_while_trajectories_are_in_tool_calls():
    # 28 of 32 trajectories finished, one request on the replica and three in tool calls of
    # 60 s on average (3 turns a trajectory): the rollout runs at least until those are back,
    # so the pass reads every finished token by then, where the replica's own short drain
    # would let it read only a part; with early_in_tool_calls off, no pass
    st = _tail_state(done=28, tokens_each=75000, left=2000)
    p0 = st.order[0]
    p0 = dataclasses.replace(p0, lengths=dataclasses.replace(p0.lengths, tool_s=60.0, turns=3.0))
    st = dataclasses.replace(st, order=(p0, st.order[1]))
    assert p0.steps[1].samples - p0.steps[1].gen_done > p0.load()
    (early,) = _early(get_policy("jigsaw", migration=False).decide(st))
    assert early.stage == "old_log_prob" and early.tokens == 0 and set(early.devices) <= {1, 2, 3}
    assert not _early(get_policy("jigsaw", migration=False, early_in_tool_calls=False).decide(st))
