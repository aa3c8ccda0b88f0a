"""``OraclePredictor``: ABLATION ONLY. It reads true final lengths, which no live engine
knows, to bound what a perfect predictor would gain. Never a default; its name, "oracle",
labels every result it produced."""

from __future__ import annotations

from typing import Callable

import numpy as np

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.hookspecs import hookimpl
from jigsaw_plugin.ids import RequestId

__all__ = ["OraclePredictor"]


class OraclePredictor:
    """Ablation: remaining = truth(request.id) - generated, clipped to the budget."""

    name = "oracle"

    def __init__(self, truth: Callable[[RequestId], int]):
        if not callable(truth):
            raise SpecError("OraclePredictor.truth", truth, "a callable RequestId -> final length of that turn")
        self._truth = truth

    @hookimpl(tryfirst=True)
    def jigsaw_predict_remaining(self, pipeline: str, requests, history) -> np.ndarray:
        return self.predict(requests, history)

    def predict(self, requests, history=None) -> np.ndarray:
        n = len(requests)
        truth = np.fromiter((self._truth(r.id) for r in requests), np.float64, n)
        generated = np.fromiter((r.generated for r in requests), np.float64, n)
        budget = np.fromiter((r.max_tokens for r in requests), np.float64, n) - generated
        return np.clip(truth - generated, 0.0, np.maximum(budget, 0.0))
