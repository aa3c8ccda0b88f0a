"""Fuzzing ``jigsaw graph --from-events``: every mutation of a recorded run's event log
(events dropped, duplicated, reordered, fields removed or retyped, lines corrupted) builds
a graph (exit 0) or fails with one line naming the event and the field (exit 2).
Never a traceback, never a hang.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jigsaw_plugin.cli import main as jigsaw_main
from jigsaw_plugin.events import EventRecorder
from jigsaw_plugin.hookspecs import HOOK_NAMES

#: ``JIGSAW_FUZZ_EXAMPLES=N`` for a longer hunt than CI's.
SCALE = int(os.environ.get("JIGSAW_FUZZ_EXAMPLES", "0")) or None
FUZZ = settings(max_examples=SCALE or 200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: Two small pipelines (one agentic) under jigsaw: leases, migrations, tool calls, syncs.
TINY = """
version: 1
cluster: {gpus: 4, gpu: h100, gpus_per_node: 4}
pipelines:
  - {name: a, model: qwen2.5-1.5b, algorithm: grpo, mode: sync, prompts_per_step: 2, samples_per_prompt: 2,
     max_response_len: 512, prompt_len: {dist: const, value: 16},
     response_len: {dist: lognormal, median: 60, sigma: 1}, steps: 2}
  - {name: b, model: qwen2.5-1.5b, algorithm: dapo, mode: sync, prompts_per_step: 2, samples_per_prompt: 2,
     max_response_len: 512, prompt_len: {dist: const, value: 16},
     response_len: {dist: lognormal, median: 60, sigma: 1}, turns: {dist: const, value: 2},
     tool_latency_s: {dist: const, value: 0.5}, observation_len: {dist: const, value: 8}, steps: 2}
"""


def _run(argv) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = jigsaw_main(argv)
    return rc, err.getvalue()


@pytest.fixture(scope="module")
def recorded() -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "w.yaml").write_text(TINY)
        rc, err = _run(["sim", str(Path(tmp) / "w.yaml"), "--policy", "jigsaw", "--events",
                        str(Path(tmp) / "e.jsonl"), "--json", str(Path(tmp) / "r.json"), "-q"])
        assert rc == 0, err
        events = EventRecorder.from_jsonl(Path(tmp) / "e.jsonl")
    # what a live run adds and this simulated one lacks: an abort and a context switch
    events.insert(-2, {"hook": "jigsaw_context_switch", "devices": [0], "from_pipeline": "a", "to_pipeline": "b",
                       "duration_s": 0.1, "t": 1.0})
    sub = next(e for e in events if e["hook"] == "jigsaw_request_submitted")
    events.insert(events.index(sub) + 1, {**{k: sub[k] for k in ("pipeline", "step", "request_id", "turn")},
                                          "hook": "jigsaw_request_aborted", "replica": sub["replica"],
                                          "generated_tokens": 3, "reason": "fault", "t": sub["t"] + 0.01})
    return events


odd = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
              st.text(max_size=6), st.sampled_from(["gen", "rollout", "train", "update_actor", "a", "b", "migrate"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=2)),
    max_leaves=4)


def _mutate(draw, events: list) -> list:
    i = draw(st.integers(0, len(events) - 1))
    kind = draw(st.sampled_from(["drop", "duplicate", "swap", "retype", "unset", "rehook", "foreign"]))
    ev = events[i]
    if kind == "drop":
        del events[i]
    elif kind == "duplicate":
        events.insert(draw(st.integers(0, len(events))), copy.deepcopy(ev))
    elif kind == "swap":
        j = draw(st.integers(0, len(events) - 1))
        events[i], events[j] = events[j], events[i]
    elif kind in ("retype", "unset") and isinstance(ev, dict) and ev:
        key = draw(st.sampled_from(sorted(ev, key=str)))
        if kind == "retype":
            ev[key] = draw(odd)
        else:
            del ev[key]
    elif kind == "rehook" and isinstance(ev, dict):
        ev["hook"] = draw(st.one_of(st.sampled_from(HOOK_NAMES), st.text(max_size=8)))
    elif kind == "foreign":
        events[i] = draw(odd)
    return events


def _check_graph(events, tmp: str, lines: list[str] | None = None) -> None:
    path = Path(tmp) / "e.jsonl"
    if lines is None:
        lines = [json.dumps(e) for e in events]
    path.write_text("\n".join(lines) + "\n")
    rc, err = _run(["graph", "--from-events", str(path), "--out", str(Path(tmp) / "g.json")])
    assert rc in (0, 2), err
    if rc == 2:
        assert err.count("\n") == 1 and err.startswith("jigsaw graph: error: --from-events"), err


def test_the_recorded_log_builds(recorded):
    with tempfile.TemporaryDirectory() as tmp:
        rc, err = _run(["graph", "--from-events", _write(recorded, tmp), "--out", str(Path(tmp) / "g.json")])
        assert rc == 0, err


def _write(events, tmp) -> str:
    path = Path(tmp) / "e.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return str(path)


@FUZZ
@given(data=st.data())
def test_a_mutated_event_log_builds_or_exits_2_naming_the_event(recorded, data):
    events = copy.deepcopy(recorded)
    for _ in range(data.draw(st.integers(1, 4))):
        events = _mutate(data.draw, events)
    with tempfile.TemporaryDirectory() as tmp:
        _check_graph(events, tmp)


@settings(max_examples=SCALE or 60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_corrupted_event_file_exits_2(recorded, data):
    lines = [json.dumps(e) for e in recorded]
    i = data.draw(st.integers(0, len(lines) - 1))
    lines[i] = data.draw(st.one_of(st.just(lines[i][: len(lines[i]) // 2]), st.just("[1, 2]"), st.just("3"),
                                   st.just('"jigsaw_step_end"'), st.just("{}"), st.text(max_size=10)))
    with tempfile.TemporaryDirectory() as tmp:
        _check_graph(None, tmp, lines)
