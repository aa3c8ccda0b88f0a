"""The policy interface and the registry of policies.

A policy is pure: it reads the state it is handed and returns decisions; it holds no
mutable state of its own, imports no Ray, reads no clock and does no I/O. The simulator's
``World`` and the Ray runtime's coordinator both present the same state shape
(``pipelines``, ``order``, ``free``, ``replicas``, ``cost``, ``t``) and execute the same
decisions (``scheduler.decisions``).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from jigsaw_plugin.errors import SpecError

__all__ = ["Policy", "register_policy", "get_policy", "policy_names"]


class Policy:
    """Base class: override ``decide``; the defaults route like verl's balancer."""

    name = "base"
    config_class = None  # the dataclass of options ``get_policy`` accepts
    resident_slots = 1  # pipelines whose rollout weights a device keeps resident
    tail_threshold = 0  # call ``decide`` when a replica's load falls to this (0: only when empty)

    def staleness_bound(self, pipeline) -> int:
        """The largest policy-version lag this policy promises for ``pipeline``'s samples."""
        return 0

    def initial_residency(self, state) -> dict:
        """Pipeline name -> devices where its state is resident before the run starts."""
        return {p.name: p.static_devices for p in state.order}

    def decide(self, state) -> list:  # pragma: no cover - interface
        raise NotImplementedError

    def order(self, state, pipeline, requests: list) -> list:
        """The order in which a batch of new requests is submitted (verl: as given)."""
        return requests

    def route(self, state, pipeline, request):
        """verl 0.9's GlobalRequestLoadBalancer: sticky per trajectory, else least in flight."""
        prev = request.replica
        live = [r for r in pipeline.replicas if not r.retiring]
        if prev is not None and not prev.retiring and prev in live:
            return prev
        if not live:
            return None
        return min(live, key=lambda r: (r.inflight, r.id))


_REGISTRY: dict[str, Callable[..., Policy]] = {}


def register_policy(name: str):
    """Class decorator: register a policy factory under ``name`` (duplicates are errors)."""

    def deco(factory):
        if name in _REGISTRY:
            raise ValueError(f"policy {name!r} is already registered")
        _REGISTRY[name] = factory
        return factory

    return deco


def policy_names() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def get_policy(name: str, **options) -> Policy:
    """A fresh policy by registered name, configured with ``options`` (its config fields)."""
    _load_builtins()
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise SpecError("--policy", name, ", ".join(sorted(_REGISTRY))) from None
    config = getattr(factory, "config_class", None)
    allowed = [f.name for f in dataclasses.fields(config)] if config else []
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise SpecError(f"{name} option {unknown[0]}", options[unknown[0]],
                        "config fields " + ", ".join(allowed) if allowed else f"none ({name} takes no options)")
    return factory(**options)


def _load_builtins() -> None:
    # Importing the modules registers them; kept lazy so `scheduler` imports cheaply.
    from jigsaw_plugin.scheduler import baselines, jigsaw  # noqa: F401
