"""The coordinator's event log when its spill file cannot be written (a full disk).

``/dev/full`` is a real device whose every write fails with ENOSPC: no mock. Before the
fix, the failed append raised inside the coordinator's ``emit`` (the drivers' hook calls
failed with ``RayTaskError(OSError)``) and the chunk being spilled was lost.
"""

from __future__ import annotations

import os

import pytest

from jigsaw_plugin.runtime.coordinator import SpillingEventLog

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")


def _fill(log, lo, hi):
    for k in range(lo, hi):
        log.append({"hook": "jigsaw_step_end", "pipeline": "p", "step": k, "t": float(k)})


def test_a_full_disk_keeps_the_events_in_memory_and_spills_them_once_it_can(tmp_path, capsys):
    log = SpillingEventLog(max_in_memory=10, spill_path="/dev/full")
    _fill(log, 0, 100)  # no exception reaches the caller
    assert len(log) == 100 and log.spilled == 0 and len(log.events) == 100
    assert [e["step"] for e in log.all_events()] == list(range(100))  # nothing lost
    assert 1 <= log.spill_errors <= 100 // 5  # retried every max_in_memory / 2 events, not every event
    err = capsys.readouterr().err
    assert err.count("WARNING: cannot append to the event log's spill file /dev/full") == 1
    assert "No space left on device" in err

    log.spill_path = tmp_path / "events.jsonl"  # space again (another disk)
    _fill(log, 100, 130)
    assert len(log.events) <= 10 and log.spilled == 130 - len(log.events)
    assert [e["step"] for e in log.all_events()] == list(range(130))  # in order, none twice
