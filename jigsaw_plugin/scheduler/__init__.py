"""Pure scheduling policies (state in, decisions out) and their registry."""

from jigsaw_plugin.scheduler.base import Policy, get_policy, parse_options, policy_names, register_policy
from jigsaw_plugin.scheduler.decisions import (
    AdmissionLimit,
    LaunchReplica,
    Migrate,
    ResizeStage,
    RetireReplica,
    RunStage,
    StartGen,
)

__all__ = [
    "Policy",
    "get_policy",
    "parse_options",
    "policy_names",
    "register_policy",
    "AdmissionLimit",
    "LaunchReplica",
    "Migrate",
    "ResizeStage",
    "RetireReplica",
    "RunStage",
    "StartGen",
]
