"""The policy interface and the registry of policies.

A policy is pure: ``decide(state)`` reads a ``scheduler.state.SchedulerState`` (what a live
system observes) and returns decisions (``scheduler.decisions``); it holds no mutable
state of its own, imports no Ray, reads no clock and does no I/O. What it must remember
between rounds it declares once, at ``setup``, as a frozen memo the executors hand back in
``state.memo``. Both executors (the simulator's ``World`` and the runtime's
``LiveExecutor``) build the same state and execute the same decisions.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from jigsaw_plugin.errors import SpecError

__all__ = ["LIVE_RECHECK_S", "Policy", "PolicySetup", "register_policy", "get_policy", "parse_options",
           "policy_names"]

#: How often the live executors call ``decide`` when no event woke it (seconds,
#: ``runtime/live.py``): time passes for a live system between events (tokens decode,
#: drains near), so a policy that reads it acts between them too
LIVE_RECHECK_S = 0.05


@dataclass(frozen=True)
class PolicySetup:
    """What a policy declares before the run: where each pipeline's state is resident at
    the start, and a frozen memo of what it derives once (home shares, splits)."""

    residency: Mapping[str, tuple]
    memo: Any = None


class Policy:
    """Base class: override ``decide``; the defaults route like verl's balancer."""

    name = "base"
    config_class = None  # the dataclass of options ``get_policy`` accepts
    resident_slots = 1  # pipelines whose rollout weights a device keeps resident
    tail_threshold = 0  # call ``decide`` when a replica's load falls to this (0: only when empty)
    routes_by_predicted_length = False  # ask the predictor for each request's length at submission
    decides_on_preemption = False  # call ``decide`` when an engine preempts sequences (its KV cache overflowed)
    # the simulator calls ``decide`` on events that change what a policy may act on, and
    # also, with this > 0, at the first event this many simulated seconds after the last
    # round (0: events only). The live executors re-check every ``LIVE_RECHECK_S`` whatever
    # it says; a policy whose rounds read what moves between events (tokens generated,
    # predicted drains, paces, samples finished) sets it to that, so the simulator decides as
    # they do (jigsaw, streamrl). One whose rounds read only what events change may keep 0:
    # verl-sync's, one-step-off's, areal's and rollmux's runs of (a)-(d) end bit for bit
    # the same either way (docs/simulator.md, "Limits")
    decide_period_s = 0.0

    def staleness_bound(self, pipeline) -> int:
        """The largest policy-version lag this policy promises for ``pipeline``'s samples."""
        return 0

    def setup(self, state) -> PolicySetup:
        """Called once with the initial state; the default keeps each static share resident."""
        return PolicySetup({p.name: p.static_devices for p in state.order})

    def decide(self, state) -> list:  # pragma: no cover - interface
        raise NotImplementedError

    def order(self, requests: list) -> list:
        """The order in which a batch of new requests is submitted (verl: as given)."""
        return requests

    def route(self, replicas: list, request):
        """verl 0.9's GlobalRequestLoadBalancer: sticky per trajectory, else least in flight.

        ``replicas``: the pipeline's live (not retiring) replicas, each with ``id``,
        ``inflight`` and ``predicted_work``; ``request`` has ``replica`` (the trajectory's
        previous server, or None) and ``pred_tokens``. Returns a replica or None (wait).
        """
        prev = request.replica
        if prev is not None and prev in replicas:
            return prev
        if not replicas:
            return None
        return min(replicas, key=lambda r: (r.inflight, r.id))


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
    if config:
        _check_option_types(name, config, options)
    return factory(**options)


def parse_options(pairs: list[str] | None, flag: str = "--policy-opt") -> dict:
    """``KEY=VALUE`` pairs of a command line (``flag``) as policy options, each value read as
    JSON where it parses (``true``, ``4``, ``0.5``), else kept as text; ``get_policy`` then
    refuses an unknown field or a value of the wrong kind."""
    opts = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SpecError(flag, pair, "KEY=VALUE, e.g. rollout_gpus=4")
        try:
            opts[key] = json.loads(value)
        except json.JSONDecodeError:
            opts[key] = value
    return opts


def _check_option_types(name: str, config, options: dict) -> None:
    """Each option of the kind its field's default is (a switch true or false, a count an
    integer, a figure a number): ``--policy-opt migration=maybe`` is refused, not read as on."""
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    for key, value in options.items():
        default = defaults.get(key, dataclasses.MISSING)
        if isinstance(default, bool):
            ok, allowed = isinstance(value, bool), "true or false"
        elif isinstance(default, int):
            ok, allowed = isinstance(value, int) and not isinstance(value, bool), "an integer"
        elif isinstance(default, float):
            ok, allowed = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
        else:
            continue
        if not ok:
            raise SpecError(f"{name} option {key}", value, allowed)


def _load_builtins() -> None:
    # Importing the modules registers them; kept lazy so `scheduler` imports cheaply.
    from jigsaw_plugin.scheduler import baselines, jigsaw  # noqa: F401
