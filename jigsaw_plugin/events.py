"""EventRecorder: a plugin that records every observation hook call as a plain dict.

Record first, analyse later: the graph builder, the trace export and the tests all read
these records. A record is ``{"hook": name, **kwargs}`` with JSON-friendly values (tuples
become lists). Not registered by default; register it yourself::

    rec = EventRecorder()
    register(pm, rec)
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from jigsaw_plugin.hookspecs import HOOK_NAMES, hookimpl

__all__ = ["EventRecorder", "OBSERVATION_HOOKS"]

# firstresult hooks answer questions; recording them would also mean answering them.
_QUESTION_HOOKS = ("jigsaw_schedule", "jigsaw_predict_duration", "jigsaw_predict_remaining")
#: The hooks an EventRecorder implements: every hook except the firstresult ones.
OBSERVATION_HOOKS = tuple(h for h in HOOK_NAMES if h not in _QUESTION_HOOKS)
_PROGRESS = "jigsaw_request_progress"


def _plain(value: Any) -> Any:
    """A JSON-friendly copy: tuples/sets -> lists, numpy values -> Python values."""
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(v) for v in value), key=repr)  # deterministic, any types
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value))
    tolist = getattr(value, "tolist", None)  # numpy scalars and arrays, without importing numpy
    if tolist is not None and type(value).__module__ == "numpy":
        return tolist()
    return value


class EventRecorder:
    """Records observation hook calls into ``self.events`` (a list of plain dicts).

    :param include_progress: Record ``jigsaw_request_progress`` (high volume).
    :param hooks: Record only these hook names (default: every observation hook).
    """

    def __init__(self, include_progress: bool = True, hooks: Iterable[str] | None = None):
        selected = OBSERVATION_HOOKS if hooks is None else tuple(hooks)
        unknown = [h for h in selected if h not in OBSERVATION_HOOKS]
        if unknown:
            raise ValueError(
                f"EventRecorder(hooks=...): got {unknown!r}; allowed: {', '.join(OBSERVATION_HOOKS)}"
            )
        self._hooks = frozenset(h for h in selected if include_progress or h != _PROGRESS)
        self.events: list[dict] = []

    def _record(self, hook_name: str, arguments: dict) -> None:
        # ``arguments`` is the impl's locals(): its parameters in spec order, plus self.
        if hook_name in self._hooks:
            kwargs = {k: v for k, v in arguments.items() if k != "self"}
            self.events.append({"hook": hook_name, **_plain(kwargs)})

    def clear(self) -> None:
        self.events.clear()

    def to_jsonl(self, path: str | Path) -> None:
        """Write one JSON object per line (fails loudly on a non-JSON value)."""
        with open(path, "w", encoding="utf-8") as f:
            for event in self.events:
                f.write(json.dumps(event) + "\n")

    @classmethod
    def from_jsonl(cls, path: str | Path) -> list[dict]:
        """Read events written by :meth:`to_jsonl` (blank lines are skipped)."""
        events = []
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{lineno}: not a JSON object: {e}") from None
                if not isinstance(event, dict) or "hook" not in event:
                    raise ValueError(f"{path}:{lineno}: not an event (no 'hook' key)")
                events.append(event)
        return events

    # One impl per observation hook, written out: pluggy reads the parameter names from
    # the code object, and tests/test_events.py checks them against the specs.

    # lifecycle
    @hookimpl
    def jigsaw_register_pipeline(self, pipeline, spec):
        self._record("jigsaw_register_pipeline", locals())

    @hookimpl
    def jigsaw_pipeline_start(self, pipeline, t):
        self._record("jigsaw_pipeline_start", locals())

    @hookimpl
    def jigsaw_pipeline_end(self, pipeline, t):
        self._record("jigsaw_pipeline_end", locals())

    # steps and stages
    @hookimpl
    def jigsaw_step_start(self, pipeline, step, t):
        self._record("jigsaw_step_start", locals())

    @hookimpl
    def jigsaw_step_end(self, pipeline, step, t):
        self._record("jigsaw_step_end", locals())

    @hookimpl
    def jigsaw_stage_start(self, pipeline, step, stage, devices, samples, tokens, t):
        self._record("jigsaw_stage_start", locals())

    @hookimpl
    def jigsaw_stage_end(self, pipeline, step, stage, devices, samples, tokens, t):
        self._record("jigsaw_stage_end", locals())

    # rollout requests
    @hookimpl
    def jigsaw_request_submitted(
        self, pipeline, step, request_id, turn, replica, prompt_tokens, max_tokens, t
    ):
        self._record("jigsaw_request_submitted", locals())

    @hookimpl
    def jigsaw_request_progress(self, pipeline, step, request_id, generated_tokens, t):
        self._record("jigsaw_request_progress", locals())

    @hookimpl
    def jigsaw_request_finished(
        self, pipeline, step, request_id, turn, replica, generated_tokens, t
    ):
        self._record("jigsaw_request_finished", locals())

    @hookimpl
    def jigsaw_request_aborted(
        self, pipeline, step, request_id, turn, replica, generated_tokens, reason, t
    ):
        self._record("jigsaw_request_aborted", locals())

    @hookimpl
    def jigsaw_request_migrated(
        self, pipeline, step, request_id, turn, src_replica, dst_replica, generated_tokens, t
    ):
        self._record("jigsaw_request_migrated", locals())

    @hookimpl
    def jigsaw_tool_call_start(self, pipeline, step, request_id, turn, t):
        self._record("jigsaw_tool_call_start", locals())

    @hookimpl
    def jigsaw_tool_call_end(self, pipeline, step, request_id, turn, observation_tokens, t):
        self._record("jigsaw_tool_call_end", locals())

    # leases and context switches
    @hookimpl
    def jigsaw_lease_granted(self, pipeline, devices, purpose, t):
        self._record("jigsaw_lease_granted", locals())

    @hookimpl
    def jigsaw_lease_released(self, pipeline, devices, t):
        self._record("jigsaw_lease_released", locals())

    @hookimpl
    def jigsaw_context_switch(self, devices, from_pipeline, to_pipeline, duration_s, t):
        self._record("jigsaw_context_switch", locals())

    # weight sync
    @hookimpl
    def jigsaw_weight_sync_start(self, pipeline, step, version, devices, bytes, t):
        self._record("jigsaw_weight_sync_start", locals())

    @hookimpl
    def jigsaw_weight_sync_end(self, pipeline, step, version, devices, t):
        self._record("jigsaw_weight_sync_end", locals())
