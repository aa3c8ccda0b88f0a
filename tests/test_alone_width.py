"""``alone_width``: the run's last synchronous pipeline launches its rollout at the width
that ends its bulk soonest over the whole pool, not the one whose token is cheapest; a
hand-built state (docs/simulator.md, the `alone_width` row of the switch table)."""

import dataclasses

import pytest

from jigsaw_plugin.scheduler import LaunchReplica, get_policy
from jigsaw_plugin.scheduler.jigsaw.round import batch_held
from jigsaw_plugin.scheduler.state import LengthSummary
from sim_helpers import small_workload
from test_jigsaw_decide import COST, MODEL, pipeline, state, step

# 1,024 samples of a 7B a step (128 prompts x 8) on 8 H100, p0's home devices 0-3
BIG = small_workload(gpus=8, pipelines=2, prompts=128, samples=8, algorithms=("grpo", "grpo"),
                     agentic=(False, False)).pipelines[0]


def _launched(context: float, others_done: bool = True, **options) -> set:
    """Widths of the replicas p0's step launches at an observed mean ``context`` (150-token
    prompts), p1 finished (``others_done``) or waiting for its step."""
    p0 = dataclasses.replace(pipeline(0, range(4), spec=BIG),
                             lengths=LengthSummary(100, 150.0, context - 150.0, context, 1.0, 16000.0))
    p1 = dataclasses.replace(pipeline(1, range(4, 8), gen_next=1, train_next=1, version=1, steps={1: step(1)}),
                             done=others_done)
    out = get_policy("jigsaw", **options).decide(state([p0, p1]))
    return {len(d.devices) for d in out if isinstance(d, LaunchReplica) and d.pipeline == "p0"}


def _bulk_s(width: int, context: float) -> float:
    """The bulk's end on 8 devices at ``width``, as the rule projects it."""
    st = state([])
    per = 1024 / (8 // width)
    b = max(1.0, min(batch_held(st, MODEL, width, context), per))
    return (per * (context - 150.0) / b * COST.decode_step_s(MODEL, width, round(b), b * context)
            + COST.prefill_s(MODEL, width, per * 150.0))


def test_alone_a_rollout_launches_at_the_width_that_ends_its_bulk_soonest():
    # at a 4,000-token context 8 one-device replicas run 128 each (a 16.3 ms step) and 4
    # two-device replicas 256 each (14.5 ms): the bulk ends about 11% sooner at tp2
    assert _bulk_s(2, 4000.0) < 0.9 * _bulk_s(1, 4000.0) and _bulk_s(2, 4000.0) < _bulk_s(4, 4000.0)
    assert _launched(4000.0) == {2}


@pytest.mark.parametrize("context, others_done, options", [
    (4000.0, False, {}),  # another pipeline still to run: the cheapest token, as before
    (4000.0, True, {"alone_width": False}),  # the switch
    (4000.0, True, {"idle_spread": False}),  # (the last pipeline's rules go together)
])
def test_otherwise_the_rollout_keeps_the_width_whose_token_is_cheapest(context, others_done, options):
    assert _launched(context, others_done, **options) == {1}


def test_alone_at_a_short_context_the_narrowest_is_also_the_fastest():
    # 750 tokens: every width's cache holds its share, and a wider replica's step is no faster
    # per sequence than its devices apart
    assert _launched(750.0) == {1}
