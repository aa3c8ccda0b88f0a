"""The state build's shared computations give what each replica's own gave.

* ``_finished_keys``: the finished requests' keys of all replicas computed at once and
  sliced equal each replica's own ``_id_keys`` (and a replica whose ids do not fit the
  packed key still gets None, the others theirs);
* ``ReplicaView``'s predicted figures, kept in the view after the first read, are the
  source's, read once; a later round's view reads its own source again.
"""

from __future__ import annotations

import numpy as np

from jigsaw_plugin.core.snapshot import _finished_keys, _id_keys
from jigsaw_plugin.ids import RequestId
from jigsaw_plugin.scheduler.state import ReplicaView


def _ids(step, samples, turn=0):
    return [RequestId("p", step, s, turn) for s in samples]


def test_finished_keys_equal_each_replicas_own():
    finished = {3: _ids(1, [4, 9]), None: _ids(2, [1], turn=None), 7: [], 5: _ids(1, range(20, 26), turn=2)}
    got = _finished_keys(finished)
    assert set(got) == {3, None, 5}
    for rep, ids in finished.items():
        if ids:
            assert np.array_equal(got[rep], _id_keys(ids)), rep
    assert _finished_keys({}) == {} and _finished_keys({4: []}) == {}


def test_finished_keys_of_an_id_past_its_bits():
    finished = {1: _ids(1, [2, 3]), 2: _ids(1 << 40, [0])}  # a step past the key's bits
    got = _finished_keys(finished)
    assert got[2] is None and _id_keys(finished[2]) is None
    assert np.array_equal(got[1], _id_keys(finished[1]))


class _Source:
    def __init__(self, work, left):
        self.reads, self.figures = 0, (work, left)

    def work_and_left(self, replica=None):
        self.reads += 1
        return self.figures

    def predicted(self, replica=None):
        return np.asarray([self.figures[1]])

    def views(self, replica=None):
        return ()


def _view(source):
    return ReplicaView.build(1, "p", (0,), 3, 0, 10.0, 100.0, 8, False, 0.01, 0.0, source)


def test_view_keeps_its_predicted_figures_after_one_read():
    src = _Source(120.0, 50.0)
    v = _view(src)
    assert v.predicted_tokens_left == 50.0 and v.predicted_work_tokens == 120.0
    assert v.predicted_drain_s() == 0.01 * max(50.0, 120.0 / 3) and src.reads == 1
    src.figures = (1.0, 1.0)  # the next round's figures: a new view reads them
    assert v.predicted_tokens_left == 50.0
    w = _view(src)
    assert w.predicted_work_tokens == 1.0 and w.predicted_tokens_left == 1.0 and src.reads == 2
    assert ReplicaView.build(2, "p", (0,), 0, 0, 0.0, 1.0, 8, False, 0.0, 0.0, None).predicted_tokens_left == 0.0


def test_view_load_and_width_are_its_fields_own():
    import dataclasses

    v = _view(None)
    assert (v.load, v.tp) == (3, 1) and vars(v)["load"] == 3  # kept after the first read
    w = dataclasses.replace(v, running=5, queued=2, devices=(0, 1))
    assert (w.load, w.tp) == (7, 2) and (v.load, v.tp) == (3, 1)
    made = ReplicaView(1, "p", (0, 1, 2, 3), 4, 1, 10.0, 100.0, 8, False, 0.01, 0.0, None)
    assert made.load == 5 and made.tp == 4 and made == dataclasses.replace(made)


def test_length_summary_is_kept_until_a_trajectory_finishes():
    from types import SimpleNamespace

    from jigsaw_plugin.core.pipelines import ObservedLengths
    from jigsaw_plugin.core.snapshot import _lengths, _PipelineCache, prior_summary

    p = SimpleNamespace(observed=ObservedLengths(), spec=SimpleNamespace(max_response_len=1000))
    cache = _PipelineCache()
    first = _lengths(p, cache)
    assert first == prior_summary(p.spec) and _lengths(p, cache) is first
    p.observed.record(100, 400, 600, 2)
    second = _lengths(p, cache)
    assert (second.observed, second.generated_tokens, second.turns) == (1, 400.0, 2.0)
    assert _lengths(p, cache) is second
    p.observed.record(50, 200, 300, 1)  # a stale summary would keep 400 and 2
    third = _lengths(p, cache)
    assert (third.observed, third.generated_tokens, third.turns, third.longest_generated) == (2, 300.0, 1.5, 400.0)
    p.observed = ObservedLengths()  # another record of lengths: not the kept one's
    assert _lengths(p, cache) == first
