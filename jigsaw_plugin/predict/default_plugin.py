"""The built-in length predictor as a module-level plugin: list
``"jigsaw_plugin.predict.default_plugin"`` in ``manager.DEFAULT_PLUGINS``.

One ``HistoryPredictor`` with the default ``PriorConfig`` answers for every pipeline (its
fitted models are cached per ``LengthHistory``, so pipelines do not mix).
"""

from __future__ import annotations

from jigsaw_plugin.hookspecs import hookimpl
from jigsaw_plugin.predict.history_predictor import HistoryPredictor

__all__ = ["PREDICTOR", "jigsaw_predict_remaining"]

PREDICTOR = HistoryPredictor()


@hookimpl
def jigsaw_predict_remaining(pipeline: str, requests, history):
    return PREDICTOR.jigsaw_predict_remaining(pipeline=pipeline, requests=requests, history=history)
