"""Remaining-length prediction: what the scheduler believes about in-flight requests.

No engine knows when a response will end, so the scheduling policy reads predicted
remaining tokens (``RequestView.predicted_remaining``), answered through the firstresult
hook ``jigsaw_predict_remaining`` (docs/predictor.md):

* ``LengthHistory``: one per pipeline, written by its executor (``record_finished``);
* ``HistoryPredictor``: the built-in predictor (capped log-normal learned online, conditioned
  on tokens so far, GRPO siblings, earlier epochs of a prompt); registered through
  ``jigsaw_plugin.predict.default_plugin``;
* ``OraclePredictor``: ABLATION ONLY, reads true lengths;
* ``PredictionLog``: prediction accuracy as executors record it.

Imports numpy only (no host framework).
"""

from jigsaw_plugin.predict.accuracy import PredictionLog, spearman
from jigsaw_plugin.predict.batch import RequestBatch
from jigsaw_plugin.predict.config import PriorConfig
from jigsaw_plugin.predict.history import GroupTable, LengthHistory, LogStats, PromptEvidence
from jigsaw_plugin.predict.history_predictor import HistoryPredictor, PredictorFeatures, clip_to_budget
from jigsaw_plugin.predict.model import LengthModel, fit_model
from jigsaw_plugin.predict.oracle import OraclePredictor

#: The import path of the built-in predictor plugin (for manager.DEFAULT_PLUGINS).
DEFAULT_PLUGIN = "jigsaw_plugin.predict.default_plugin"

__all__ = [
    "DEFAULT_PLUGIN",
    "GroupTable",
    "HistoryPredictor",
    "LengthHistory",
    "LengthModel",
    "LogStats",
    "OraclePredictor",
    "PredictionLog",
    "PredictorFeatures",
    "PriorConfig",
    "PromptEvidence",
    "RequestBatch",
    "clip_to_budget",
    "fit_model",
    "spearman",
]
