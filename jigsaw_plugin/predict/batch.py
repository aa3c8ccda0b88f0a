"""``RequestBatch``: the in-flight requests of one pipeline as columns.

Predictors compute on arrays; this is the one place the per-request views are read. An
executor that already keeps its requests in arrays may build a ``RequestBatch`` itself and
pass it to ``jigsaw_predict_remaining`` in place of the tuple of views (about 1.6 ms of the
cost for 10,000 views is this conversion, docs/predictor.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from jigsaw_plugin.errors import SpecError

__all__ = ["RequestBatch"]

_MIN = np.minimum.reduce  # ndarray.min without its wrapper: every predictor call checks three
_ID = attrgetter("id")
_STEP = attrgetter("step")
_TURN = attrgetter("turn")
_GROUP = attrgetter("group")
_GENERATED = attrgetter("generated")
_MAX = attrgetter("max_tokens")
_KEY = attrgetter("prompt_key")


@dataclass(frozen=True, eq=False)
class RequestBatch:
    """Columns of N in-flight generation turns (all of one pipeline)."""

    step: np.ndarray  # int64[N]
    group: np.ndarray  # int64[N]: GRPO group within the step
    turn: np.ndarray  # int64[N]
    generated: np.ndarray  # float64[N]: tokens of this turn so far
    max_tokens: np.ndarray  # float64[N]: this turn's budget
    prompt_keys: tuple[str | None, ...] | None = None  # None: no request has one

    def __post_init__(self) -> None:
        n = len(self.step)
        for name in ("group", "turn", "generated", "max_tokens"):
            if len(getattr(self, name)) != n:
                raise SpecError(f"RequestBatch.{name}", f"length {len(getattr(self, name))}",
                                f"one entry per request ({n})")
        if self.prompt_keys is not None and len(self.prompt_keys) != n:
            raise SpecError("RequestBatch.prompt_keys", f"length {len(self.prompt_keys)}",
                            f"one entry per request ({n}) or None")
        if n and (_MIN(self.step) < 0 or _MIN(self.group) < 0 or _MIN(self.turn) < 0):
            raise SpecError("RequestBatch", "a negative step, group or turn", "integers >= 0")

    def __len__(self) -> int:
        return len(self.step)

    @classmethod
    def of(cls, requests) -> "RequestBatch":
        """From a ``RequestBatch`` (returned as is) or a sequence of ``RequestView``-like
        records (``id.step``, ``id.turn``, ``group``, ``generated``, ``max_tokens``,
        ``prompt_key``)."""
        if isinstance(requests, RequestBatch):
            return requests
        if isinstance(getattr(requests, "generated", None), np.ndarray):  # columns already
            # (scheduler.state.RequestBatch, what the executors pass)
            keys = tuple(requests.prompt_key)
            return cls(np.asarray(requests.step, np.int64), np.asarray(requests.group, np.int64),
                       np.asarray(requests.turn, np.int64), np.asarray(requests.generated, np.float64),
                       np.asarray(requests.max_tokens, np.float64),
                       keys if keys.count(None) < len(keys) else None)  # C-level: thousands a call
        n = len(requests)
        ids = list(map(_ID, requests))
        step = np.fromiter(map(_STEP, ids), np.int64, n)
        turn = np.fromiter((t or 0 for t in map(_TURN, ids)), np.int64, n)
        group = np.fromiter(map(_GROUP, requests), np.int64, n)
        generated = np.fromiter(map(_GENERATED, requests), np.float64, n)
        max_tokens = np.fromiter(map(_MAX, requests), np.float64, n)
        keys = tuple(map(_KEY, requests))
        has_key = any(k is not None for k in keys)
        return cls(step, group, turn, generated, max_tokens, keys if has_key else None)
