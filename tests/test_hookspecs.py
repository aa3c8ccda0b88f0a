"""The hook contract: names, parameters, documentation and result semantics."""

from __future__ import annotations

import inspect

import pytest

from jigsaw_plugin import hookspecs
from jigsaw_plugin.hookspecs import HOOK_NAMES, STAGES, hookimpl
from jigsaw_plugin.manager import call, get_plugin_manager, register

# The contract other code relies on: hook name -> parameter names, in order.
CONTRACT = {
    "jigsaw_register_pipeline": ("pipeline", "spec"),
    "jigsaw_pipeline_start": ("pipeline", "t"),
    "jigsaw_pipeline_end": ("pipeline", "t"),
    "jigsaw_step_start": ("pipeline", "step", "t"),
    "jigsaw_step_end": ("pipeline", "step", "t"),
    "jigsaw_stage_start": ("pipeline", "step", "stage", "devices", "samples", "tokens", "t"),
    "jigsaw_stage_end": ("pipeline", "step", "stage", "devices", "samples", "tokens", "t"),
    "jigsaw_request_submitted": (
        "pipeline", "step", "request_id", "turn", "replica", "prompt_tokens", "max_tokens", "t",
    ),
    "jigsaw_request_progress": ("pipeline", "step", "request_id", "generated_tokens", "t"),
    "jigsaw_request_finished": (
        "pipeline", "step", "request_id", "turn", "replica", "generated_tokens", "t",
    ),
    "jigsaw_request_aborted": (
        "pipeline", "step", "request_id", "turn", "replica", "generated_tokens", "reason", "t",
    ),
    "jigsaw_request_migrated": (
        "pipeline", "step", "request_id", "turn", "src_replica", "dst_replica",
        "generated_tokens", "t",
    ),
    "jigsaw_tool_call_start": ("pipeline", "step", "request_id", "turn", "t"),
    "jigsaw_tool_call_end": ("pipeline", "step", "request_id", "turn", "observation_tokens", "t"),
    "jigsaw_schedule": ("state",),
    "jigsaw_predict_duration": ("kind", "pipeline", "sizes", "devices"),
    "jigsaw_predict_remaining": ("pipeline", "requests", "history"),
    "jigsaw_lease_granted": ("pipeline", "devices", "purpose", "t"),
    "jigsaw_lease_released": ("pipeline", "devices", "t"),
    "jigsaw_context_switch": ("devices", "from_pipeline", "to_pipeline", "duration_s", "t"),
    "jigsaw_weight_sync_start": ("pipeline", "step", "version", "devices", "bytes", "t"),
    "jigsaw_weight_sync_end": ("pipeline", "step", "version", "devices", "t"),
}


@pytest.fixture
def pm():
    return get_plugin_manager(load_entrypoints=False, default_plugins=False)


def test_hook_names_and_parameters_are_the_contract():
    assert set(HOOK_NAMES) == set(CONTRACT)
    assert len(HOOK_NAMES) == len(set(HOOK_NAMES))
    for name in HOOK_NAMES:
        params = tuple(inspect.signature(getattr(hookspecs, name)).parameters)
        assert params == CONTRACT[name], name


def test_all_exports_exist():
    for name in hookspecs.__all__:
        assert hasattr(hookspecs, name), name
    assert set(HOOK_NAMES) <= {n for n in dir(hookspecs) if n.startswith("jigsaw_")}


@pytest.mark.parametrize("name", HOOK_NAMES)
def test_every_hook_documents_when_parameters_and_results(name):
    doc = inspect.getdoc(getattr(hookspecs, name))
    assert doc and len(doc.splitlines()[0]) > 10, f"{name} has no summary line"
    for param in CONTRACT[name]:
        assert f":param {param}:" in doc, f"{name} does not document {param!r}"
    # How results combine must be stated.
    assert any(w in doc for w in ("firstresult", "Historic", "Return values are ignored")), name


def test_stages():
    assert STAGES == (
        "gen", "reward", "old_log_prob", "ref", "values", "adv",
        "update_critic", "update_actor", "weight_sync",
    )


def test_result_semantics_flags(pm):
    firstresult = {n for n in HOOK_NAMES if getattr(pm.hook, n).spec.opts["firstresult"]}
    historic = {n for n in HOOK_NAMES if getattr(pm.hook, n).spec.opts["historic"]}
    assert firstresult == {"jigsaw_schedule", "jigsaw_predict_duration", "jigsaw_predict_remaining"}
    assert historic == {"jigsaw_register_pipeline"}


class _Policy:
    def __init__(self, answer):
        self.answer = answer
        self.calls = 0

    @hookimpl
    def jigsaw_schedule(self, state):
        self.calls += 1
        return self.answer(state) if callable(self.answer) else self.answer


def test_schedule_is_firstresult(pm):
    # pluggy calls the most recently registered plugin first.
    abstain = _Policy(None)
    first = _Policy(["a"])
    second = _Policy(["b"])
    register(pm, first)
    register(pm, second)
    register(pm, abstain)
    assert pm.hook.jigsaw_schedule(state={"t": 0}) == ["b"]
    assert abstain.calls == 1 and second.calls == 1
    assert first.calls == 0  # never asked once an answer was given


def test_schedule_empty_list_is_an_answer(pm):
    # An empty list means "wait", not "no opinion": later plugins are not consulted.
    wait = _Policy([])
    other = _Policy(["x"])
    register(pm, other)
    register(pm, wait)
    assert pm.hook.jigsaw_schedule(state=None) == []
    assert other.calls == 0


def test_schedule_with_no_answer_is_none(pm):
    register(pm, _Policy(None))
    assert pm.hook.jigsaw_schedule(state=None) is None


def test_predict_duration_firstresult_and_subset_of_args(pm):
    class OnlyGen:
        @hookimpl
        def jigsaw_predict_duration(self, kind, sizes):  # a subset of the spec's args
            return 0.5 * sizes["tokens"] if kind == "gen" else None

    class Fallback:
        @hookimpl
        def jigsaw_predict_duration(self, kind):
            return 1.0

    register(pm, Fallback())
    register(pm, OnlyGen())
    args = dict(pipeline="p", sizes={"tokens": 4}, devices=(0,))
    assert pm.hook.jigsaw_predict_duration(kind="gen", **args) == 2.0
    assert pm.hook.jigsaw_predict_duration(kind="ref", **args) == 1.0


def test_register_pipeline_is_historic(pm):
    seen_early, seen_late = [], []

    class Early:
        @hookimpl
        def jigsaw_register_pipeline(self, pipeline, spec):
            seen_early.append((pipeline, spec))

    class Late:
        @hookimpl
        def jigsaw_register_pipeline(self, pipeline):
            seen_late.append(pipeline)

    register(pm, Early())
    call(pm, "jigsaw_register_pipeline", pipeline="a", spec={"name": "a"})
    pm.hook.jigsaw_register_pipeline.call_historic(kwargs=dict(pipeline="b", spec={}))
    assert seen_early == [("a", {"name": "a"}), ("b", {})]
    assert seen_late == []
    register(pm, Late())  # replayed on registration, in call order
    assert seen_late == ["a", "b"]
    assert len(seen_early) == 2  # not replayed twice to the early plugin


def test_historic_hook_cannot_be_called_directly(pm):
    # Why manager.call / Emitter exist: pluggy refuses a direct call of a historic hook.
    with pytest.raises(Exception, match="historic"):
        pm.hook.jigsaw_register_pipeline(pipeline="a", spec={})
