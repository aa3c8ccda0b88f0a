"""Cost model: hardware and model profiles, roofline predictors, calibrated factors."""

from jigsaw_plugin.costmodel.predictor import CostModel, EfficiencyFactors
from jigsaw_plugin.costmodel.profiles import (
    HARDWARE,
    MODELS,
    HardwareProfile,
    ModelProfile,
    hardware_profile,
    model_profile,
    with_train_offload,
)

__all__ = [
    "CostModel",
    "EfficiencyFactors",
    "HARDWARE",
    "MODELS",
    "HardwareProfile",
    "ModelProfile",
    "hardware_profile",
    "model_profile",
    "with_train_offload",
]
