"""The step checkpoint of the reference runner (runtime/reference/resume.py): what a
restarted driver resumes from. The trainer-state round trip needs torch and runs in the
soak (integration_tests/test_soak.py)."""

from __future__ import annotations

import json

from jigsaw_plugin.runtime.reference.resume import TrainedSample, load_checkpoint, save_checkpoint


def _rows(step, n=3):
    return [TrainedSample("a", step, i, 16, 10 + i) for i in range(n)]


def test_the_checkpoint_keeps_completed_steps_and_ignores_an_uncommitted_one(tmp_path):
    assert load_checkpoint(tmp_path) is None  # nothing completed yet: start at step 0
    save_checkpoint(tmp_path, 1, {"a": b"state0"}, _rows(0))
    ck = save_checkpoint(tmp_path, 2, {"a": b"state1"}, _rows(1))
    assert ck.completed_steps == 2 and ck.ledger == tuple(_rows(0) + _rows(1))
    assert open(ck.trainers["a"], "rb").read() == b"state1"
    assert sorted(p.name for p in tmp_path.glob("trainer-*")) == ["trainer-a-step1.pt"]  # older states dropped

    # a driver killed after writing step 2's ledger and trainer file but before the commit
    (tmp_path / "ledger-step2.json").write_text(json.dumps([{"pipeline": "a", "step": 2, "index": 0,
                                                              "prompt_tokens": 16, "response_tokens": 1}]))
    (tmp_path / "trainer-a-step2.pt").write_bytes(b"half")
    (tmp_path / "state.json.tmp").write_text("{")
    ck = load_checkpoint(tmp_path)
    assert ck.completed_steps == 2 and all(r.step < 2 for r in ck.ledger)
    assert open(ck.trainers["a"], "rb").read() == b"state1"

    # the restarted driver redoes step 2 and commits it: its own rows replace the stale ones
    ck = save_checkpoint(tmp_path, 3, {"a": b"state2"}, _rows(2, 2))
    assert ck.completed_steps == 3 and [r for r in ck.ledger if r.step == 2] == _rows(2, 2)
