"""The state build's fast paths give what the slow ones give.

* The simulator's replicas report their requests as columns (``Replica.request_columns``):
  at every decide round of a short run, every replica's columns equal those built from
  its ``request_rows`` tuples (same order, same dtypes, same values bit for bit), which is
  what keeps every prediction, and so every decision, unchanged.
* ``ReplicaView.build`` and ``PipelineView.build`` (one dict update, no per-field frozen
  setattr) give views equal to the constructor's, and the snapshot's replica views (the
  builder inlined in its loop) equal the builder's at every round of a run.
* A malformed ``RequestColumns`` names its field.
"""

import dataclasses

import numpy as np
import pytest

from jigsaw_plugin.core.snapshot import RequestColumns
from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.hookspecs import hookimpl
from jigsaw_plugin.ids import RequestId
from jigsaw_plugin.scheduler.state import PipelineView, ReplicaView
from sim_helpers import run_with_probe


class _CompareColumns:
    def __init__(self):
        self.sim, self.rows, self.running_rows = None, 0, 0

    @hookimpl(tryfirst=True)
    def jigsaw_schedule(self, state):
        w = self.sim.world
        for rep in w.replicas.values():
            a = rep.request_columns(w.t)
            b = RequestColumns.from_rows(rep.request_rows(w.t))
            for name in RequestColumns.__slots__:
                x, y = getattr(a, name), getattr(b, name)
                if isinstance(y, np.ndarray):
                    assert isinstance(x, np.ndarray) and x.dtype == y.dtype, name
                    assert np.array_equal(x, y), name
                    # the fixed fields come from one joined buffer: each its own writable row
                    assert x.flags.c_contiguous and x.flags.writeable, name
                else:
                    assert x == y, name
            self.rows += len(a.ids)
            self.running_rows += int((~a.queued & (a.generated > 0)).sum())
        return None


def test_replica_columns_equal_its_rows_at_every_round():
    cmp = _CompareColumns()
    run_with_probe(cmp, "compare-columns")
    assert cmp.rows > 1000 and cmp.running_rows > 100  # decoding rows seen, not only fresh ones


def test_columns_from_rows_and_a_bad_length():
    rows = [(RequestId("p", 2, i, None if i == 1 else 1), i // 4, "k", 100 + i, 7.0, 512, 0.5, i > 1)
            for i in range(3)]
    c = RequestColumns.from_rows(rows)
    assert c.turn.tolist() == [1, 0, 1] and c.sample.tolist() == [0, 1, 2] and c.step.tolist() == [2, 2, 2]
    assert c.queued.tolist() == [False, False, True] and c.prompt_key == ("k", "k", "k")
    assert len(RequestColumns.from_rows([]).ids) == 0
    with pytest.raises(SpecError, match="RequestColumns.group"):
        dataclasses.replace(c, group=np.zeros(2, np.int64))


def test_view_builders_equal_the_constructors():
    args = (3, "p", (0, 1), 5, 2, 100.0, 1e5, 256, False, 0.02, 0.0, None)
    built, made = ReplicaView.build(*args), ReplicaView(*args)
    # the builder sets the derived ``load`` and ``tp`` up front; the constructor's view
    # computes them on first read: the same values, then the same dict
    assert built == made and built.load == made.load == 7 and built.tp == made.tp == 2
    assert vars(built) == vars(made)
    values = {f.name: i for i, f in enumerate(dataclasses.fields(PipelineView))}
    assert PipelineView.build(**values) == PipelineView(**values)
    del values["history"]
    with pytest.raises(SpecError, match="PipelineView.build"):
        PipelineView.build(**values)


class _CompareSnapshotViews:
    """At every round, each replica view the snapshot built (``ReplicaView.build`` inlined
    in its loop over the reports) against ``ReplicaView.build`` of the same fields."""

    def __init__(self):
        self.sim, self.views = None, 0

    @hookimpl(tryfirst=True)
    def jigsaw_schedule(self, state):
        names = [f.name for f in dataclasses.fields(ReplicaView)]
        for p in state.order:
            for r in p.replicas:
                built = ReplicaView.build(*(getattr(r, n) for n in names))
                assert built == r and vars(built) == {k: v for k, v in vars(r).items() if k in vars(built)}
                assert set(vars(built)) <= set(vars(r))
                self.views += 1
        return None


def test_the_snapshots_replica_views_equal_the_builders():
    cmp = _CompareSnapshotViews()
    run_with_probe(cmp, "compare-snapshot-views")
    assert cmp.views > 100


class _CompareKvColumns:
    """At every round, each replica view's ``kv_columns`` against its request views."""

    def __init__(self):
        self.sim, self.rows, self.running = None, 0, 0

    @hookimpl(tryfirst=True)
    def jigsaw_schedule(self, state):
        for p in state.order:
            for r in p.replicas:
                held, left, running = r.kv_columns()
                views = r.requests
                assert held.dtype == left.dtype == np.float64
                assert held.tolist() == [float(q.context_tokens + q.generated) for q in views]
                assert left.tolist() == [q.predicted_remaining for q in views]
                assert running == sum(not q.queued for q in views)
                self.rows += len(views)
                self.running += running
        return None


def test_a_replicas_kv_columns_are_its_request_views_figures():
    # what admission limits read instead of building a view per request
    cmp = _CompareKvColumns()
    run_with_probe(cmp, "compare-kv-columns")
    assert cmp.rows > 1000 and cmp.running > 500


class _ReadTogether:
    """At every round, every replica's rows read together (``ReplicaView.read_together``),
    then each one's ``kv_columns`` against the simulator's own requests, with no further
    read."""

    def __init__(self):
        self.sim, self.together, self.after = None, 0, 0

    @hookimpl(tryfirst=True)
    def jigsaw_schedule(self, state):
        from jigsaw_plugin.core import snapshot

        w = self.sim.world
        views = [r for p in state.order for r in p.replicas if r.load]
        for r in views:
            r.predicted_work_tokens  # noqa: B018 - the round's gathers first (they carry rows)
        reads = []
        many, init = snapshot._read_many, snapshot._ReplicaRows.__init__

        def counted_many(reps, *a):
            reads.append(len(reps))
            return many(reps, *a)

        def counted_init(self, *a):
            reads.append(1)
            init(self, *a)

        snapshot._read_many, snapshot._ReplicaRows.__init__ = counted_many, counted_init
        try:
            ReplicaView.read_together(views)
            self.together += sum(reads)
            reads.clear()
            for r in views:
                held, _, running = r.kv_columns()
                truth = w.replicas[r.id].request_columns(w.t)
                # rows not read this round advanced by the engine's KV growth: within a token
                assert np.abs(held - (truth.context + truth.generated)).max(initial=0.0) <= 1.0
                assert running == int((~truth.queued).sum())
            self.after += sum(reads)
        finally:
            snapshot._read_many, snapshot._ReplicaRows.__init__ = many, init
        return None


def test_replicas_read_together_are_observations_read_once():
    from jigsaw_plugin.manager import get_plugin_manager, register
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.sim import Simulation
    from sim_helpers import small_workload

    # replicas of more than ``carry_min_rows`` requests, whose rows are carried between reads
    wl = small_workload(gpus=4, pipelines=2, prompts=48, samples=8, steps=1, median=400)
    probe = _ReadTogether()
    pm = get_plugin_manager(load_entrypoints=False)
    register(pm, probe, "read-together")
    probe.sim = Simulation(wl, get_policy("jigsaw"), seed=3, pm=pm)
    probe.sim.run()
    assert probe.together > 0  # carried rows were read again, together
    assert probe.after == 0
