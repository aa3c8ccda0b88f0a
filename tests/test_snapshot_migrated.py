"""A migrated request keeps the prediction it had on the replica it left (core/snapshot.py,
``_adopt_moved``): it is not asked of the predictor again."""

import numpy as np
import pytest

from jigsaw_plugin.core.snapshot import ReplicaObs, _adopt_moved, _ReplicaRows
from jigsaw_plugin.ids import RequestId


class _Engine:
    """An engine whose rows are given (only ``request_rows`` and ``version`` are read)."""

    def __init__(self, rows, version=0):
        self.rows, self.version = rows, version

    def request_rows(self, t):
        return list(self.rows)


def _row(sample, generated, step=1):
    return (RequestId("p", step, sample, 0), sample // 4, None, 100, generated, 4096, 1.0, False)


OBS = ReplicaObs(8, 0, 0.0, 1e6, 256, 0.01, 0.0)


def test_a_moved_request_takes_its_prediction_from_the_replica_it_left():
    src = _ReplicaRows(_Engine([_row(i, 10 + i) for i in range(8)]), OBS, 0.0, None)
    src.predicted_now(np.arange(8) * 100.0 + 50.0)  # final = 10 + i + 50 + 100 i
    # sample 5 moved to a replica that already held samples 20 and 21 (asked) and now also
    # holds sample 30, which nobody asked about
    old = _ReplicaRows(_Engine([_row(20, 3), _row(21, 4)]), OBS, 0.0, None)
    old.predicted_now(np.array([7.0, 9.0]))
    dst = _ReplicaRows(_Engine([_row(20, 5), _row(21, 6), _row(5, 17), _row(30, 0)], version=1), OBS, 0.2, old)
    assert dst.unseen and np.isnan(dst.final[2]) and np.isnan(dst.final[3])
    _adopt_moved({0: src, 1: old}, {1: dst})  # replica 0 (the source) is gone
    assert dst.final[2] == src.final[5] == pytest.approx(15 + 550.0)
    assert dst.g0[2] == src.g0[5]
    assert np.isnan(dst.final[3]) and dst.unseen  # still to be asked: nobody predicted it
    assert dst.final[:2].tolist() == pytest.approx([3 + 7.0, 4 + 9.0])  # its own rows as they were
    # remaining is final less what it generated since: 565 - 17
    assert dst.pred[2] == pytest.approx(565.0 - 17.0)
    assert dst.decoded == pytest.approx((5 - 3) + (6 - 4) + (17 - 15))


def test_rows_still_on_their_replica_are_not_a_source():
    """Only rows of replicas read again or gone are looked up: a replica kept as it was
    (same rows object) still holds its requests, which did not move."""
    a = _ReplicaRows(_Engine([_row(1, 10)]), OBS, 0.0, None)
    a.predicted_now(np.array([40.0]))
    b = _ReplicaRows(_Engine([_row(1, 10)]), OBS, 0.0, None)  # the same key, never asked
    _adopt_moved({0: a}, {0: a, 1: b})
    assert np.isnan(b.final[0]) and b.unseen
