"""Workload spec (YAML v1): loading, validation, distributions, trace replay, sampling.

See docs/workload.md for the file format and docs/architecture.md for the contract.
"""

from jigsaw_plugin.workload.distributions import (
    DISTRIBUTIONS,
    Categorical,
    Const,
    Distribution,
    Lognormal,
    Mixture,
    Normal,
    Quantiles,
    Trace,
    Uniform,
    build_distribution,
)
from jigsaw_plugin.workload.sampling import StepSamples, sample_step, step_rng
from jigsaw_plugin.workload.spec import (
    ALGORITHMS,
    KNOWN_GPUS,
    KNOWN_MODELS,
    MODES,
    REWARD_KINDS,
    TRAIN_OFFLOAD,
    ClusterSpec,
    PipelineSpec,
    RewardSpec,
    WorkloadSpec,
    default_reward_latency,
    load_workload,
    parse_workload,
)
from jigsaw_plugin.workload.traces import ROLES, clear_trace_cache, load_trace, resolve_trace_path

__all__ = [
    "ALGORITHMS",
    "DISTRIBUTIONS",
    "KNOWN_GPUS",
    "KNOWN_MODELS",
    "MODES",
    "REWARD_KINDS",
    "ROLES",
    "TRAIN_OFFLOAD",
    "Categorical",
    "ClusterSpec",
    "Const",
    "Distribution",
    "Lognormal",
    "Mixture",
    "Normal",
    "PipelineSpec",
    "Quantiles",
    "RewardSpec",
    "StepSamples",
    "Trace",
    "Uniform",
    "WorkloadSpec",
    "build_distribution",
    "clear_trace_cache",
    "default_reward_latency",
    "load_trace",
    "load_workload",
    "parse_workload",
    "resolve_trace_path",
    "sample_step",
    "step_rng",
]
