"""The simulated replica: continuous batching, KV limit and preemption, migration."""

from jigsaw_plugin.costmodel import CostModel, hardware_profile, model_profile
from jigsaw_plugin.sim.replica import Replica, Request


def _replica(model="qwen2.5-7b", gpu="h100"):
    return Replica(0, "p", (0,), model_profile(model), CostModel(hardware_profile(gpu)))


def _drain(rep, t=0.0):
    done = []
    for _ in range(100_000):
        nxt = rep.next_event_t()
        if nxt is None:
            break
        t = nxt
        rep.sync(t)
        done += rep.pop_finished()
        rep.preempt_overflow()
        rep.admit(t)
    return done, t


def test_requests_finish_with_their_full_length_in_length_order():
    rep = _replica()
    reqs = [Request("p", 0, i, 0, 100, n, 0) for i, n in enumerate([50, 10, 400, 200])]
    for r in reqs:
        rep.enqueue(r, 0.0)
    rep.admit(0.0)
    done, t = _drain(rep)
    assert [r.target for r in done] == [10, 50, 200, 400]
    assert all(r.done == r.target for r in done)
    assert rep.load == 0 and rep.kv_tokens == 0
    # one replica decoding 400 tokens takes at least 400 memory-bound steps
    assert t >= 400 * rep.cost.decode_step_s(rep.model, 1, 1, 100)


def test_full_cache_preempts_and_recomputes_without_losing_tokens():
    rep = _replica()
    rep.cap = 2_000  # a tiny cache: 4 prompts fit, then growth forces preemption
    reqs = [Request("p", 0, i, 0, 500, 2_000, 0) for i in range(6)]
    for r in reqs:
        rep.enqueue(r, 0.0)
    rep.admit(0.0)
    assert rep.n == 4  # admission respects the cache
    preempted = []
    orig = rep.preempt_overflow
    rep.preempt_overflow = lambda: preempted.append(orig()) or preempted[-1]
    done, _ = _drain(rep)
    assert sum(preempted) > 0
    assert sorted(r.sample for r in done) == list(range(6))
    assert all(r.done == r.target == 2_000 for r in done)


def test_take_keeps_the_generated_prefix_for_migration():
    src, dst = _replica(), _replica()
    dst.id = 1
    r = Request("p", 0, 0, 0, 100, 1_000, 0)
    src.enqueue(r, 0.0)
    src.admit(0.0)
    src.next_event_t()  # plans the segment: sets the step time
    t = src.busy_until + 300 * src.cost.decode_step_s(src.model, 1, 1, 400)
    src.sync(t)
    src.take(r)
    assert 250 <= r.done <= 300 and r.remaining == 1_000 - r.done
    assert src.load == 0 and r.cached == 0
    dst.enqueue(r, t)
    dst.admit(t)
    assert dst.busy_until > t  # the destination re-prefills prompt + generated tokens
    done, _ = _drain(dst)
    assert done == [r] and r.done == 1_000
