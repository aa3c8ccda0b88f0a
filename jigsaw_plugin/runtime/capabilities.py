"""What a host can carry out of a policy's decisions (declared by each adapter at registration).

A host trainer (verl, OpenRLHF) runs its own stages; the coordinator's policy only decides
*when* and *where*. Each adapter declares, once, what it can do on the policy's say:

- ``stage_grants``: ``"stage"`` (the host's hook blocks before each training stage until the
  stage's devices are granted, and reports the stage's end), ``"phase"`` (one grant for the
  rollout, one for all of a step's training stages: OpenRLHF's trainer), or ``"none"``;
- ``rollout_replicas``: how many rollout servers the host has, and ``replicas_elastic``
  whether servers can be woken, slept, added and removed on the policy's say (verl:
  ``CheckpointEngineManager`` + the balancer's server set; OpenRLHF: the jigsaw engine pool);
- ``migration``: whether the coordinator can abort a chosen request and resume it with its
  prefix on another server of the host (through the host's balancer);
- ``replica_release``: whether the host gives a rollout server's devices back on its own
  before the rollout ends, server by server, as its share drains (OpenRLHF: the rollout
  controller migrates an engine's tail away and switches it off); the policy gets those
  devices at once. A host without it gives the rollout's devices back together at its end;
- ``training_resizable`` / ``training_width``: whether a training stage's gang can change
  width; verl's FSDP gangs are fixed when its worker groups are built (not resizable: the
  policy time-shares them, on exactly ``training_width`` devices).

``refusal(caps, decision)`` says why a decision is outside them (``None`` when it is not);
the coordinator records the refusal as an event and, if a host waits on the refused
decision, fails that wait with the reason rather than letting it hang.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Mapping

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.scheduler.decisions import LaunchReplica, Migrate, ResizeStage, RetireReplica, RunStage

__all__ = ["HostCapabilities", "GRANT_KINDS", "refusal", "CapabilityRefused"]

GRANT_KINDS = ("stage", "phase", "none")


class CapabilityRefused(RuntimeError):
    """A host waited on a decision its capabilities cannot carry out."""


@dataclass(frozen=True)
class HostCapabilities:
    """One host pipeline's declared capabilities (see the module docstring)."""

    framework: str
    stage_grants: str = "stage"
    rollout_replicas: int = 1
    replicas_elastic: bool = False
    migration: bool = False
    replica_release: bool = False
    training_resizable: bool = False
    training_width: int = 1

    def __post_init__(self):
        if not isinstance(self.framework, str) or not self.framework:
            raise SpecError("capabilities.framework", self.framework, "a non-empty string (verl, openrlhf, ...)")
        if self.stage_grants not in GRANT_KINDS:
            raise SpecError("capabilities.stage_grants", self.stage_grants, " | ".join(GRANT_KINDS))
        for name in ("rollout_replicas", "training_width"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SpecError(f"capabilities.{name}", v, "an integer >= 1")
        for name in ("replicas_elastic", "migration", "replica_release", "training_resizable"):
            if not isinstance(getattr(self, name), bool):
                raise SpecError(f"capabilities.{name}", getattr(self, name), "true | false")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping) -> "HostCapabilities":
        if not isinstance(raw, Mapping):
            raise SpecError("capabilities", raw, "a mapping of " + ", ".join(f.name for f in fields(cls)))
        known = {f.name for f in fields(cls)}
        for key in raw:
            if key not in known:
                raise SpecError(f"capabilities.{key}", raw[key], "one of " + ", ".join(sorted(known)))
        if "framework" not in raw:
            raise SpecError("capabilities.framework", "<missing>", "a non-empty string (verl, openrlhf, ...)")
        return cls(**dict(raw))


def refusal(caps: HostCapabilities, decision, live_replicas: int = 0, rollout_granted: bool = False) -> str | None:
    """Why ``decision`` (for a pipeline with these capabilities) cannot be carried out, or
    ``None``. ``live_replicas``: the pipeline's replicas launched and not yet closed;
    ``rollout_granted``: its host already runs its rollout on the servers it was granted."""
    if isinstance(decision, RunStage):
        n = len(decision.devices)
        if decision.alongside:
            return (f"{caps.framework} runs its training stages in its own order: {decision.stage} cannot run "
                    f"alongside the next (RunStage.alongside; the simulator's executor only)")
        if n and caps.stage_grants == "none":
            return f"{caps.framework} takes no stage grants (stage_grants=none)"
        if n and not caps.training_resizable and decision.stage != "weight_sync" and n != caps.training_width:
            return (f"{caps.framework}'s training gang is fixed at {caps.training_width} device(s) "
                    f"(training_resizable=false); RunStage {decision.stage} asked for {n}")
    elif isinstance(decision, ResizeStage):
        if not caps.training_resizable:
            return (f"{caps.framework} cannot resize a running training stage (training_resizable=false: "
                    f"its gang is fixed when its worker groups are built)")
    elif isinstance(decision, LaunchReplica):
        if decision.absorb and not caps.migration:
            return f"{caps.framework} cannot migrate requests (migration=false): LaunchReplica absorb={decision.absorb}"
        if decision.spread and not caps.migration:
            return f"{caps.framework} cannot migrate requests (migration=false): LaunchReplica spread=True"
        if rollout_granted and not caps.replicas_elastic:
            # the host took its servers when the rollout was granted: a later one would hold
            # devices it never uses
            return (f"{caps.framework}'s rollout already runs on the servers granted at its start and cannot "
                    f"take one more (replicas_elastic=false)")
        if live_replicas >= caps.rollout_replicas and not caps.replicas_elastic:
            return (f"{caps.framework} has {caps.rollout_replicas} rollout server(s), all in use, and cannot add "
                    f"one (replicas_elastic=false)")
    elif isinstance(decision, Migrate):
        if not caps.migration:
            return f"{caps.framework} cannot migrate requests (migration=false): Migrate {decision.src}->{decision.dst}"
    elif isinstance(decision, RetireReplica):
        return None  # a server slept early is always possible (it is woken for the next step)
    return None
