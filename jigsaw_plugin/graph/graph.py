"""SubStageGraph: sub-stages of one or more pipelines and their dependencies (networkx)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable

import networkx as nx

from jigsaw_plugin.graph.substage import KINDS, RESOURCES, SubStage

__all__ = ["SubStageGraph", "GraphError", "EDGE_KINDS", "GROUP_KINDS"]

#: ``data``: the target reads the source's output (tokens, observations, log-probs,
#: weights); ``barrier``: the target waits for a whole set (every reward of a step, every
#: shard of a stage); ``order``: sequencing without data (a request before its first turn,
#: the critic update before the actor's, a context switch before the work it makes room for).
EDGE_KINDS = ("data", "barrier", "order")
#: Kinds whose span covers other sub-stages (a request spans its turns and tool calls):
#: they weigh nothing on a critical path, which would otherwise count that time twice.
GROUP_KINDS = ("rollout_request",)
_ATTR = "substage"  # the networkx node attribute holding the SubStage


class GraphError(ValueError):
    """An invalid graph or event stream (the message names the node, edge or event)."""


class SubStageGraph:
    """A ``networkx.DiGraph`` (``.g``) whose node ``id`` carries its :class:`SubStage` under
    the node attribute ``"substage"`` and whose edges carry ``kind`` (:data:`EDGE_KINDS`)."""

    def __init__(self):
        self.g = nx.DiGraph()

    def __len__(self) -> int:
        return self.g.number_of_nodes()

    def __contains__(self, node_id: object) -> bool:
        return node_id in self.g

    # ---- building -----------------------------------------------------------------------
    def add(self, s: SubStage) -> SubStage:
        if s.kind not in KINDS:
            raise GraphError(f"sub-stage {s.id!r}: kind {s.kind!r}; allowed: {', '.join(KINDS)}")
        self.g.add_node(s.id, **{_ATTR: s})
        return s

    def add_many(self, substages: Iterable[SubStage]) -> None:
        """Add many sub-stages at once (what the builders use: one networkx call)."""
        items = []
        for s in substages:
            if s.kind not in KINDS:
                raise GraphError(f"sub-stage {s.id!r}: kind {s.kind!r}; allowed: {', '.join(KINDS)}")
            items.append((s.id, {_ATTR: s}))
        self.g.add_nodes_from(items)

    def add_edge(self, u: str, v: str, kind: str = "data") -> None:
        """Add ``u -> v``. Either end may be added later; :meth:`validate` reports an edge
        whose node never came."""
        if kind not in EDGE_KINDS:
            raise GraphError(f"edge {u!r} -> {v!r}: kind {kind!r}; allowed: {', '.join(EDGE_KINDS)}")
        self.g.add_edge(u, v, kind=kind)

    def add_edges(self, pairs: Iterable[tuple[str, str]], kind: str = "data") -> None:
        """Add many edges of one kind at once (what the builders use)."""
        if kind not in EDGE_KINDS:
            raise GraphError(f"edges of kind {kind!r}; allowed: {', '.join(EDGE_KINDS)}")
        self.g.add_edges_from(pairs, kind=kind)

    # ---- reading ------------------------------------------------------------------------
    def node(self, node_id: str) -> SubStage:
        try:
            return self.g.nodes[node_id][_ATTR]
        except KeyError:
            raise GraphError(f"no sub-stage {node_id!r} in the graph") from None

    def nodes(self, kind: str | None = None, pipeline: str | None = None, step: int | None = None) -> list[SubStage]:
        """The sub-stages (in insertion order), optionally only one kind, pipeline or step."""
        out = []
        for _, data in self.g.nodes(data=True):
            s = data.get(_ATTR)
            if s is None:
                continue
            if (kind is None or s.kind == kind) and (pipeline is None or s.pipeline == pipeline) and (
                    step is None or s.step == step):
                out.append(s)
        return out

    def edges(self, kind: str | None = None) -> list[tuple[str, str, str]]:
        """``(source, target, edge kind)`` triples, optionally of one edge kind."""
        return [(u, v, k) for u, v, k in self.g.edges(data="kind", default="data") if kind is None or k == kind]

    # ---- checks -------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise :class:`GraphError` unless every edge joins known nodes, the graph is
        acyclic (the message names a cycle) and every node is resourced: a known kind, a
        resource of :data:`RESOURCES`, at least one device on ``rollout``/``train``, none
        negative on ``host``, and ``end_s >= start_s`` where both are known."""
        nodes = self.g.nodes
        for u, v in self.g.edges():
            for n in (u, v):
                if _ATTR not in nodes[n]:
                    raise GraphError(f"edge {u!r} -> {v!r} references missing node {n!r}")
        if not nx.is_directed_acyclic_graph(self.g):
            cycle = nx.find_cycle(self.g)
            raise GraphError("cycle: " + " -> ".join(u for u, _ in cycle) + f" -> {cycle[0][0]}")
        for s in self.nodes():
            if s.kind not in KINDS:
                raise GraphError(f"sub-stage {s.id!r}: kind {s.kind!r}; allowed: {', '.join(KINDS)}")
            if s.resource not in RESOURCES:
                raise GraphError(f"sub-stage {s.id!r} ({s.kind}) is unresourced: resource {s.resource!r}; "
                                 f"allowed: {', '.join(RESOURCES)}")
            if s.resource != "host" and s.devices < 1:
                raise GraphError(f"sub-stage {s.id!r} ({s.kind}) is unresourced: it runs on {s.resource} "
                                 f"but has {s.devices} devices (needs >= 1)")
            if s.devices < 0:
                raise GraphError(f"sub-stage {s.id!r} ({s.kind}) has {s.devices} devices (needs >= 0)")
            if s.start_s is not None and s.end_s is not None and s.end_s < s.start_s:
                raise GraphError(f"sub-stage {s.id!r} ({s.kind}) ends at {s.end_s} before it starts at {s.start_s}")

    # ---- analysis -----------------------------------------------------------------------
    def _weights(self, by: str) -> tuple[dict, str]:
        subs = {n: d.get(_ATTR) for n, d in self.g.nodes(data=True)}
        if by == "auto":
            by = "duration" if any(s is not None and s.duration_s is not None for s in subs.values()) else "count"
        if by == "duration":
            w = {n: (0.0 if s is None or s.kind in GROUP_KINDS or s.duration_s is None else s.duration_s)
                 for n, s in subs.items()}
        elif by == "count":
            w = dict.fromkeys(subs, 1.0)
        else:
            raise GraphError(f"critical path by {by!r}; allowed: auto, duration, count")
        return w, by

    def _longest(self, by: str) -> tuple[list[str], float]:
        w, _ = self._weights(by)
        if not w:
            return [], 0.0
        try:
            order = list(nx.topological_sort(self.g))
        except nx.NetworkXUnfeasible:
            self.validate()  # names the cycle
            raise
        dist, back = {}, {}
        pred = self.g.pred
        for v in order:
            best, arg = 0.0, None
            for u in pred[v]:  # ties: the first predecessor added wins (deterministic)
                if arg is None or dist[u] > best:
                    best, arg = dist[u], u
            dist[v], back[v] = best + w[v], arg
        end = max(order, key=dist.__getitem__)
        path = [end]
        while back[path[-1]] is not None:
            path.append(back[path[-1]])
        return path[::-1], dist[end]

    def critical_path(self, by: str = "auto") -> list[str]:
        """The longest dependency chain, as node ids from source to sink.

        ``by="duration"`` weighs each node by ``end_s - start_s`` (unknown: 0; a
        :data:`GROUP_KINDS` node: 0, its parts carry its time); ``"count"`` weighs each node
        1; ``"auto"`` (default) uses durations when any node has both times (a recorded
        run), else counts (a plan from a spec)."""
        return self._longest(by)[0]

    def critical_path_length(self, by: str = "auto") -> float:
        """The critical path's weight: seconds (by duration) or nodes (by count)."""
        return self._longest(by)[1]

    def summary(self) -> dict:
        """Counts: ``nodes``, ``edges``, ``kinds`` (sub-stages by kind), ``pipelines``
        (sub-stages by pipeline), ``by_pipeline`` (pipeline -> kind -> count), ``edge_kinds``
        and ``steps`` (pipeline -> number of steps)."""
        kinds, pipes = Counter(), Counter()
        per = defaultdict(Counter)
        steps = defaultdict(set)
        for s in self.nodes():
            kinds[s.kind] += 1
            pipes[s.pipeline] += 1
            per[s.pipeline][s.kind] += 1
            steps[s.pipeline].add(s.step)
        edge_kinds = Counter(k for _, _, k in self.g.edges(data="kind", default="data"))
        return {"nodes": len(self), "edges": self.g.number_of_edges(), "kinds": dict(sorted(kinds.items())),
                "pipelines": dict(sorted(pipes.items())),
                "by_pipeline": {p: dict(sorted(c.items())) for p, c in sorted(per.items())},
                "edge_kinds": dict(sorted(edge_kinds.items())),
                "steps": {p: len(v) for p, v in sorted(steps.items())}}

    def kind_edges(self) -> Counter:
        """Edge counts by (kind of source, kind of target, edge kind): the graph's shape."""
        return Counter((self.node(u).kind, self.node(v).kind, k) for u, v, k in self.edges())
