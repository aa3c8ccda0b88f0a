"""EventRecorder: faithful, JSON-friendly records of every observation hook."""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jigsaw_plugin import hookspecs
from jigsaw_plugin.events import OBSERVATION_HOOKS, EventRecorder
from jigsaw_plugin.hookspecs import HOOK_NAMES
from jigsaw_plugin.manager import call, get_plugin_manager, register


@pytest.fixture
def pm():
    return get_plugin_manager(load_entrypoints=False, default_plugins=False)


def _kwargs(hook_name):
    """Distinct values for every parameter, tuples where the spec has devices."""
    out = {}
    for i, p in enumerate(inspect.signature(getattr(hookspecs, hook_name)).parameters):
        if p == "devices":
            out[p] = (3, 1, 2)
        elif p == "spec":
            out[p] = {"name": "p0", "gpus": (0, 1), "nested": {"k": [1, (2, 3)]}}
        elif p == "t":
            out[p] = 12.25
        else:
            out[p] = f"{p}-{i}" if p in ("pipeline", "stage", "reason", "purpose") else i * 7 + 1
    return out


def test_observation_hooks_are_all_but_the_questions():
    assert set(OBSERVATION_HOOKS) == set(HOOK_NAMES) - {"jigsaw_schedule", "jigsaw_predict_duration",
                                                        "jigsaw_predict_remaining"}


def test_recorder_implements_exactly_the_observation_hooks(pm):
    rec = EventRecorder()
    register(pm, rec)
    implemented = {n for n in HOOK_NAMES if any(i.plugin is rec for i in getattr(pm.hook, n).get_hookimpls())}
    assert implemented == set(OBSERVATION_HOOKS)
    # and it never answers a firstresult question
    assert pm.hook.jigsaw_schedule(state=None) is None


@pytest.mark.parametrize("name", OBSERVATION_HOOKS)
def test_impl_takes_exactly_the_spec_parameters(name):
    # A subset would silently drop fields from every record.
    spec = tuple(inspect.signature(getattr(hookspecs, name)).parameters)
    impl = tuple(inspect.signature(getattr(EventRecorder(), name)).parameters)
    assert impl == spec


def test_records_every_hook_faithfully_in_call_order(pm):
    rec = EventRecorder()
    register(pm, rec)
    expected = []
    for name in OBSERVATION_HOOKS:
        kw = _kwargs(name)
        call(pm, name, **kw)
        expected.append({"hook": name, **json.loads(json.dumps(kw))})  # tuples -> lists
    assert rec.events == expected
    stage = next(e for e in rec.events if e["hook"] == "jigsaw_stage_start")
    assert stage["devices"] == [3, 1, 2] and isinstance(stage["devices"], list)
    assert list(stage) == ["hook", "pipeline", "step", "stage", "devices", "samples", "tokens", "t"]


def test_records_are_copies(pm):
    rec = EventRecorder()
    register(pm, rec)
    spec = {"name": "p", "gpus": [0, 1]}
    call(pm, "jigsaw_register_pipeline", pipeline="p", spec=spec)
    spec["gpus"].append(2)
    assert rec.events[0]["spec"] == {"name": "p", "gpus": [0, 1]}


def test_late_recorder_gets_historic_registrations(pm):
    call(pm, "jigsaw_register_pipeline", pipeline="early", spec={"name": "early"})
    rec = EventRecorder()
    register(pm, rec)
    assert rec.events == [{"hook": "jigsaw_register_pipeline", "pipeline": "early", "spec": {"name": "early"}}]


def test_progress_can_be_skipped(pm):
    rec = EventRecorder(include_progress=False)
    register(pm, rec)
    pm.hook.jigsaw_request_progress(pipeline="p", step=0, request_id=1, generated_tokens=5, t=0.1)
    pm.hook.jigsaw_request_finished(pipeline="p", step=0, request_id=1, turn=0, replica=0,
                                    generated_tokens=9, t=0.2)
    assert [e["hook"] for e in rec.events] == ["jigsaw_request_finished"]


def test_hook_filter(pm):
    rec = EventRecorder(hooks=["jigsaw_step_start"])
    register(pm, rec)
    pm.hook.jigsaw_step_start(pipeline="p", step=0, t=0.0)
    pm.hook.jigsaw_step_end(pipeline="p", step=0, t=1.0)
    assert rec.events == [{"hook": "jigsaw_step_start", "pipeline": "p", "step": 0, "t": 0.0}]


@pytest.mark.parametrize("bad", ["jigsaw_stepstart", "jigsaw_schedule"])
def test_hook_filter_rejects_unknown_names(bad):
    with pytest.raises(ValueError, match=bad) as info:
        EventRecorder(hooks=[bad])
    assert "jigsaw_step_start" in str(info.value)  # lists the allowed names


def test_numpy_values_become_python_values(pm, tmp_path):
    rec = EventRecorder()
    register(pm, rec)
    pm.hook.jigsaw_stage_end(pipeline="p", step=np.int64(2), stage="gen",
                             devices=tuple(np.arange(2)), samples=np.int64(8),
                             tokens=np.int64(100), t=np.float64(1.5))
    e = rec.events[0]
    assert e == {"hook": "jigsaw_stage_end", "pipeline": "p", "step": 2, "stage": "gen",
                 "devices": [0, 1], "samples": 8, "tokens": 100, "t": 1.5}
    assert all(type(v) in (str, int, float, list) for v in e.values())
    rec.to_jsonl(tmp_path / "e.jsonl")  # would raise on numpy values


def test_jsonl_round_trip(pm, tmp_path):
    rec = EventRecorder()
    register(pm, rec)
    for name in OBSERVATION_HOOKS:
        call(pm, name, **_kwargs(name))
    path = tmp_path / "events.jsonl"
    rec.to_jsonl(path)
    lines = path.read_text().splitlines()
    assert len(lines) == len(OBSERVATION_HOOKS)
    assert EventRecorder.from_jsonl(path) == rec.events


def test_from_jsonl_reports_bad_lines(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"hook": "jigsaw_step_start"}\n\n{not json\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:3"):
        EventRecorder.from_jsonl(path)
    path.write_text('{"hook": "x"}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        EventRecorder.from_jsonl(path)


def test_clear(pm):
    rec = EventRecorder()
    register(pm, rec)
    pm.hook.jigsaw_pipeline_start(pipeline="p", t=0.0)
    rec.clear()
    assert rec.events == []


_json_leaf = st.none() | st.booleans() | st.integers() | st.text(max_size=5) | st.floats(allow_nan=False)
_json_value = st.recursive(
    _json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=10,
)


@settings(deadline=None)  # a loaded machine makes single examples slow; the property is what matters
@given(spec=st.dictionaries(st.text(max_size=4), _json_value, max_size=4))
def test_any_json_like_spec_survives_jsonl(spec, tmp_path_factory):
    pm = get_plugin_manager(load_entrypoints=False, default_plugins=False)
    rec = EventRecorder()
    register(pm, rec)
    call(pm, "jigsaw_register_pipeline", pipeline="p", spec=spec)
    path = tmp_path_factory.mktemp("h") / "e.jsonl"
    rec.to_jsonl(path)
    assert EventRecorder.from_jsonl(path) == rec.events
    assert rec.events[0]["spec"] == json.loads(json.dumps(spec))
