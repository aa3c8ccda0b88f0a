"""What a run did on each device, over time: the timeline the report draws.

Two sources, one shape (:class:`Timeline`):

- :func:`spans_of` reads a finished simulation's per-device record (``sim.world.trace``).
  It is the ONLY place that knows that record's layout, so a change of the executor is
  adapted here and nowhere else.
- :func:`timeline_from_events` rebuilds the same spans from a run's recorded hook events
  (the ray backend's runs happen in the coordinator; their events come back, the
  simulator objects do not).

A timeline is saved to and loaded from ``spans.json`` (:func:`timeline_to_dict`,
:func:`timeline_from_dict`) so that ``jigsaw report`` needs no simulator.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

__all__ = [
    "Span",
    "Migration",
    "Timeline",
    "ROLLOUT",
    "spans_of",
    "migrations_of",
    "timeline_of",
    "timeline_from_events",
    "timeline_to_dict",
    "timeline_from_dict",
    "MIGRATION_HOOKS",
]

ROLLOUT = "rollout"  # the kind of a rollout replica's span (its devices, from start to close)
_GEN = "gen"  # a step's generation stage: drawn as its rollout replicas (leases), not as one span
#: The hook events :func:`migrations_of` needs recorded during a simulation.
MIGRATION_HOOKS = ("jigsaw_request_migrated",)


@dataclass(frozen=True)
class Span:
    """One piece of work holding ``devices`` from ``start_s`` to ``end_s`` (run clock)."""

    pipeline: str
    kind: str  # "rollout" or a training stage (old_log_prob, update_actor, weight_sync, ...)
    devices: tuple[int, ...]
    start_s: float
    end_s: float
    label: str  # e.g. "rollout r3", "update_actor s2"

    @property
    def replica(self) -> int | None:
        """The rollout replica's id, when the label carries one (``rollout r<id>``)."""
        tag = self.label.rsplit(" ", 1)[-1]
        return int(tag[1:]) if self.kind == ROLLOUT and tag[:1] == "r" and tag[1:].isdigit() else None


@dataclass(frozen=True)
class Migration:
    """Requests of one pipeline moved between two replicas at one instant.

    ``src_devices`` / ``dst_devices`` are empty when the run did not say which devices
    the replicas were on (hook events name replicas, not devices)."""

    t_s: float
    pipeline: str
    src_devices: tuple[int, ...]
    dst_devices: tuple[int, ...]
    requests: int


@dataclass(frozen=True)
class Timeline:
    """Everything the figures and the Perfetto trace draw of one run."""

    gpus: int
    gpus_per_node: int
    spans: tuple[Span, ...]
    migrations: tuple[Migration, ...]
    source: str  # "sim-trace" or "hook-events": where the spans came from


def spans_of(sim) -> list[Span]:
    """The per-device spans of a finished :class:`~jigsaw_plugin.sim.Simulation`.

    ``sim.world.trace`` holds ``(name, category, devices, start_s, end_s)``; ``name`` is
    ``"<pipeline> <what> <tag>"`` and ``category`` the stage kind or ``"rollout"``."""
    out = []
    for name, category, devices, start_s, end_s in sim.world.trace:
        pipeline, _, label = name.partition(" ")
        out.append(Span(pipeline, category, tuple(int(d) for d in devices), float(start_s), float(end_s), label))
    return out


def migrations_of(events: list[dict], spans: list[Span]) -> list[Migration]:
    """Group ``jigsaw_request_migrated`` events by (time, pipeline, source, destination);
    replica ids become devices through the rollout spans that carry them."""
    replica_devices = {(s.pipeline, s.replica): s.devices for s in spans if s.replica is not None}
    groups: Counter = Counter()
    for e in events:
        if e.get("hook") == "jigsaw_request_migrated":
            groups[(float(e["t"]), e["pipeline"], e["src_replica"], e["dst_replica"])] += 1
    return [
        Migration(t, p, replica_devices.get((p, src), ()), replica_devices.get((p, dst), ()), n)
        for (t, p, src, dst), n in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1]))
    ]


def timeline_of(sim, events: list[dict] | None = None) -> Timeline:
    """A finished simulation's timeline; ``events``: its recorded :data:`MIGRATION_HOOKS`."""
    spans = spans_of(sim)
    cluster = sim.workload.cluster
    return Timeline(cluster.gpus, cluster.gpus_per_node, tuple(spans),
                    tuple(migrations_of(events or [], spans)), "sim-trace")


def _key(e: dict, *fields) -> tuple:
    return tuple(tuple(e[f]) if isinstance(e[f], list) else e[f] for f in fields)


def timeline_from_events(events: list[dict], gpus: int, gpus_per_node: int) -> Timeline:
    """Spans from hook events: stages from ``jigsaw_stage_start``/``_end`` (on devices; not
    ``gen``, whose devices are its replicas'), rollout from ``jigsaw_lease_granted`` (purpose rollout) to ``jigsaw_lease_released``.
    Migrations are placed on the devices of the pipeline's rollout at that instant (the
    events name replicas, not devices): ``src_devices`` is that set, ``dst_devices`` empty."""
    spans: list[Span] = []
    open_stages: dict[tuple, dict] = {}
    open_leases: dict[tuple, list[dict]] = {}
    replicas = Counter()
    for e in sorted(events, key=lambda e: float(e.get("t", 0.0))):
        hook = e.get("hook")
        if hook == "jigsaw_stage_start" and e.get("devices") and e["stage"] != _GEN:
            open_stages[_key(e, "pipeline", "step", "stage")] = e
        elif hook == "jigsaw_stage_end":
            start = open_stages.pop(_key(e, "pipeline", "step", "stage"), None)
            if start is not None:
                spans.append(Span(e["pipeline"], e["stage"], tuple(start["devices"]), float(start["t"]),
                                  float(e["t"]), f"{e['stage']} s{e['step']}"))
        elif hook == "jigsaw_lease_granted" and e.get("purpose") == ROLLOUT:
            open_leases.setdefault(_key(e, "pipeline", "devices"), []).append(e)
        elif hook == "jigsaw_lease_released":
            starts = open_leases.get(_key(e, "pipeline", "devices"))
            if starts:
                start = starts.pop(0)
                replicas[e["pipeline"]] += 1
                spans.append(Span(e["pipeline"], ROLLOUT, tuple(start["devices"]), float(start["t"]),
                                  float(e["t"]), f"rollout #{replicas[e['pipeline']]}"))
    spans.sort(key=lambda s: (s.start_s, s.devices))
    groups: Counter = Counter()
    for e in events:
        if e.get("hook") == "jigsaw_request_migrated":
            groups[(float(e["t"]), e["pipeline"])] += 1
    migrations = []
    for (t, p), n in sorted(groups.items()):
        on = sorted({d for s in spans if s.pipeline == p and s.kind == ROLLOUT and s.start_s <= t <= s.end_s
                     for d in s.devices})
        migrations.append(Migration(t, p, tuple(on), (), n))
    return Timeline(gpus, gpus_per_node, tuple(spans), tuple(migrations), "hook-events")


def timeline_to_dict(tl: Timeline) -> dict:
    return {
        "gpus": tl.gpus, "gpus_per_node": tl.gpus_per_node, "source": tl.source,
        "spans": [[s.pipeline, s.kind, list(s.devices), round(s.start_s, 6), round(s.end_s, 6), s.label]
                  for s in tl.spans],
        "migrations": [[m.t_s, m.pipeline, list(m.src_devices), list(m.dst_devices), m.requests]
                       for m in tl.migrations],
    }


def timeline_from_dict(data: dict) -> Timeline:
    """The inverse of :func:`timeline_to_dict`; ``KeyError``/``ValueError`` on a bad file."""
    spans = tuple(Span(str(p), str(k), tuple(int(d) for d in devs), float(a), float(b), str(label))
                  for p, k, devs, a, b, label in data["spans"])
    migrations = tuple(Migration(float(t), str(p), tuple(int(d) for d in src), tuple(int(d) for d in dst), int(n))
                       for t, p, src, dst, n in data["migrations"])
    return Timeline(int(data["gpus"]), int(data["gpus_per_node"]), spans, migrations, str(data["source"]))
