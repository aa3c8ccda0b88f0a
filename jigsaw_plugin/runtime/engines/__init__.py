"""Real rollout engines (vLLM). Importing this package imports neither vLLM nor Ray:
both are imported when an engine or an engine actor is created."""

from jigsaw_plugin.runtime.engines.vllm_engine import (
    ActorEngine,
    EngineDead,
    RequestAborted,
    RequestNotFound,
    VLLMEngine,
    engine_actor_class,
    make_engine_actor,
)

__all__ = [
    "ActorEngine",
    "EngineDead",
    "RequestAborted",
    "RequestNotFound",
    "VLLMEngine",
    "engine_actor_class",
    "make_engine_actor",
]
