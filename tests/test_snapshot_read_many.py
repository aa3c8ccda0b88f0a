"""Reading a pipeline's replicas together (``core.snapshot._read_many``: one set of
columns for all of them, ``Replica.request_columns_of``) gives the rows reading them one
by one gives, bit for bit: at every decide round of a short run, for every pipeline, with
the rows its last gather kept as the old rows (so the last predictions are carried over
as the one-by-one read carries them), every array and scalar of every replica's rows is
equal; and the predictor's batch joined column by column (``_batch``) equals the one
joined replica by replica (as it was built before), whole and masked. The live runtime's
replicas report rows, not columns: their rows joined are read once (``_columns_of``),
checked here on hand-built engines."""

import math

import numpy as np

from jigsaw_plugin.core.snapshot import ReplicaObs, _batch, _columns_of, _read_many, _ReplicaRows
from jigsaw_plugin.hookspecs import hookimpl
from jigsaw_plugin.ids import RequestId
from sim_helpers import run_with_probe

_SCALARS = ("version", "t", "t_read", "kv", "running", "ids", "prompt_key", "n_decoding", "_shift", "_decoded_run",
            "unseen", "fresh", "decoded", "carried", "drift", "alive")
_ARRAYS = ("key", "group", "gkey", "step", "turn", "context", "max_tokens", "queued", "running_mask", "_gen",
           "in_flight_read", "g0", "final", "final_eff")


def _same(a: _ReplicaRows, b: _ReplicaRows) -> None:
    for name in _SCALARS:
        x, y = getattr(a, name), getattr(b, name)
        assert x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y)), name
    for name in _ARRAYS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True), name


class _CompareReads:
    def __init__(self):
        self.sim, self.rows, self.carried_over, self.rounds = None, 0, 0, 0

    @hookimpl(tryfirst=True)
    def jigsaw_schedule(self, state):
        w = self.sim.world
        self.rounds += 1
        for p in w.order:
            entry = w.request_cache.get(p.name)
            old = entry[2].rows if entry is not None else {}
            reps = list(p.replicas)
            if not reps:
                continue
            obs = [rep.observe(w.t) for rep in reps]
            olds = [old.get(rep.id) for rep in reps]
            together = _read_many(reps, obs, olds, w.t)
            for rep, o, r, got in zip(reps, obs, olds, together):
                _same(got, _ReplicaRows(rep, o, w.t, r))
                self.rows += len(got.ids)
                self.carried_over += int((~np.isnan(got.final)).sum())
            parts = [r for r in together if len(r.ids)]
            if parts:
                ids = [rep.id for rep, r in zip(reps, together) if len(r.ids)]
                masks = [np.arange(len(r.ids)) % 3 != 1 for r in parts]
                for rows in (None, masks):
                    _same_batch(_batch(parts, ids, rows), _batch_part_by_part(parts, ids, rows))
        return None


def _batch_part_by_part(parts, replica_ids, rows):
    """``_batch`` as it was built before: each column masked and worked on per part."""
    pick = rows or [slice(None)] * len(parts)
    cat = np.concatenate
    sizes = [len(r.ids) for r in parts] if rows is None else [int(m.sum()) for m in rows]
    return dict(
        ids=tuple(i for r, m in zip(parts, pick) for i in np.asarray(r.ids, object)[m]),
        group=cat([r.group[m] for r, m in zip(parts, pick)]), turn=cat([r.turn[m] for r, m in zip(parts, pick)]),
        step=cat([r.step[m] for r, m in zip(parts, pick)]),
        generated=cat([r.whole_generated()[m] for r, m in zip(parts, pick)]).astype(np.int64),
        max_tokens=cat([r.max_tokens[m] for r, m in zip(parts, pick)]),
        context_tokens=cat([r.context[m] for r, m in zip(parts, pick)]),
        in_flight_s=cat([r.in_flight_s()[m] for r, m in zip(parts, pick)]),
        replica=np.repeat(np.asarray(replica_ids, np.int64), sizes),
        queued=cat([r.queued[m] for r, m in zip(parts, pick)]))


def _same_batch(got, want: dict) -> None:
    assert got.ids == want.pop("ids")
    for name, y in want.items():
        x = getattr(got, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name


def test_read_together_equals_one_by_one_at_every_round():
    cmp = _CompareReads()
    run_with_probe(cmp, "compare-reads")
    # decoding rows seen, and predictions carried over from the last gather's rows
    assert cmp.rounds > 50 and cmp.rows > 1000 and cmp.carried_over > 300


class _Engine:
    """A live-style engine: rows as tuples, no ``version``."""

    def __init__(self, rows):
        self._rows = rows

    def request_rows(self, t):
        return list(self._rows)


def _row(sample, generated, queued=False):
    return (RequestId("p", 1, sample, None), sample // 4, None, 100 + sample, generated, 4096, 0.5, queued)


def test_row_engines_are_read_as_one_set_of_columns():
    a, b, empty = _Engine([_row(0, 5), _row(1, 7, True)]), _Engine([_row(4, 9)]), _Engine([])
    cols, sizes = _columns_of([a, empty, b], 1.0)
    assert sizes == [2, 0, 1] and cols.sample.tolist() == [0, 1, 4] and cols.queued.tolist() == [False, True, False]
    obs = ReplicaObs(1, 1, 300.0, 1e5, 256, 0.02, 0.0)
    together = _read_many([a, empty, b], [obs] * 3, [None] * 3, 1.0)
    for eng, got in zip((a, empty, b), together):
        _same(got, _ReplicaRows(eng, obs, 1.0, None))
