"""A sub-stage: the unit of work below a pipeline stage (a turn, a tool call, a shard)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["SubStage", "KINDS", "RESOURCES"]

KINDS = (
    "rollout_request",  # one trajectory: groups its turns and tool calls
    "gen_turn",  # one generation turn of a trajectory on a rollout replica
    "tool_call",  # a tool call between two turns (host)
    "reward",  # one sample's reward (host, or a reward model)
    "old_log_prob_shard",
    "ref_shard",
    "values_shard",
    "adv",  # advantages (host)
    "update_actor",
    "update_critic",
    "weight_sync",
    "context_switch",  # a pipeline's state brought onto devices where it was not resident
    "migration",  # a request moved between replicas (re-prefill on the destination)
    "barrier",  # zero-work join: every reward of a step is in, its training may start
)
RESOURCES = ("rollout", "train", "host")


@dataclass(frozen=True, slots=True)
class SubStage:
    """One unit of work of one pipeline's step.

    ``resource`` is where it runs (``rollout`` replicas, ``train`` gangs, or the ``host``
    CPU for tool calls, rule rewards, advantages and joins); ``devices`` how many devices it
    holds (0 only on the host); ``sizes`` what it processes (``samples``, ``tokens``,
    ``prompt_tokens``...); ``start_s``/``end_s`` are known for a recorded run, ``None`` in a
    plan; ``attrs`` carries identities (``request_id``, ``turn``, ``replica``, ``version``).
    """

    id: str
    pipeline: str
    step: int
    kind: str
    resource: str
    devices: int  # devices it occupies (0 only for host work)
    sizes: dict = field(default_factory=dict)  # samples, tokens, prompt_tokens ...
    start_s: float | None = None
    end_s: float | None = None
    attrs: dict = field(default_factory=dict)  # request_id, turn, replica, version ...

    @property
    def duration_s(self) -> float | None:
        if self.start_s is None or self.end_s is None:
            return None
        return self.end_s - self.start_s

    def to_dict(self) -> dict:
        return asdict(self)
