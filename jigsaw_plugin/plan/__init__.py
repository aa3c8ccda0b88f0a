"""``jigsaw plan``: ECHO-2's capacity model and provisioning rule (docs/plan.md)."""

from jigsaw_plugin.plan.capacity import CapacityInputs, ClassRate, Provision, evaluate, plan_pipeline
from jigsaw_plugin.plan.command import format_provision, run_plan

__all__ = ["CapacityInputs", "ClassRate", "Provision", "evaluate", "plan_pipeline", "format_provision", "run_plan"]
