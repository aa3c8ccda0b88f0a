"""SubStageGraph: sub-stages of one or more pipelines and their dependencies (networkx)."""

from __future__ import annotations

from collections import Counter

import networkx as nx

from jigsaw_plugin.graph.substage import KINDS, RESOURCES, SubStage

__all__ = ["SubStageGraph", "GraphError", "EDGE_KINDS"]

EDGE_KINDS = ("data", "barrier", "order")


class GraphError(ValueError):
    """An invalid graph or event stream (the message names the node, edge or event)."""


class SubStageGraph:
    def __init__(self):
        self.g = nx.DiGraph()

    def __len__(self) -> int:
        return self.g.number_of_nodes()

    def add(self, s: SubStage) -> SubStage:
        if s.kind not in KINDS:
            raise GraphError(f"sub-stage {s.id!r}: kind {s.kind!r}; allowed: {', '.join(KINDS)}")
        self.g.add_node(s.id, s=s)
        return s

    def add_edge(self, u: str, v: str, kind: str = "data") -> None:
        if kind not in EDGE_KINDS:
            raise GraphError(f"edge {u!r} -> {v!r}: kind {kind!r}; allowed: {', '.join(EDGE_KINDS)}")
        self.g.add_edge(u, v, kind=kind)

    def node(self, node_id: str) -> SubStage:
        return self.g.nodes[node_id]["s"]

    def nodes(self, kind: str | None = None, pipeline: str | None = None) -> list[SubStage]:
        out = []
        for _, data in self.g.nodes(data=True):
            s = data.get("s")
            if s is None:
                continue
            if (kind is None or s.kind == kind) and (pipeline is None or s.pipeline == pipeline):
                out.append(s)
        return out

    def edges(self) -> list[tuple[str, str, str]]:
        return [(u, v, d.get("kind", "data")) for u, v, d in self.g.edges(data=True)]

    def validate(self) -> None:
        """Acyclic, every edge between known nodes, every node resourced."""
        for u, v in self.g.edges():
            for n in (u, v):
                if "s" not in self.g.nodes[n]:
                    raise GraphError(f"edge {u!r} -> {v!r} references missing node {n!r}")
        if not nx.is_directed_acyclic_graph(self.g):
            cycle = nx.find_cycle(self.g)
            raise GraphError("cycle: " + " -> ".join(u for u, _ in cycle) + f" -> {cycle[0][0]}")
        for s in self.nodes():
            if s.resource not in RESOURCES:
                raise GraphError(f"sub-stage {s.id!r} has resource {s.resource!r}; allowed: {', '.join(RESOURCES)}")
            if s.resource != "host" and s.devices < 1:
                raise GraphError(f"sub-stage {s.id!r} ({s.kind}) runs on {s.resource} but has {s.devices} devices")

    def critical_path(self) -> list[str]:
        """Longest path: weighted by durations where known, else by node count."""
        def w(n):
            d = self.node(n).duration_s
            return d if d is not None else 1.0

        h = nx.DiGraph()
        h.add_nodes_from(self.g.nodes)
        for u, v in self.g.edges():
            h.add_edge(u, v, weight=w(v))
        path = nx.dag_longest_path(h, weight="weight")
        return path

    def summary(self) -> dict:
        kinds = Counter(s.kind for s in self.nodes())
        pipes = Counter(s.pipeline for s in self.nodes())
        return {"nodes": len(self), "edges": self.g.number_of_edges(), "kinds": dict(sorted(kinds.items())),
                "pipelines": dict(sorted(pipes.items()))}

    def kind_edges(self) -> Counter:
        """Edge counts by (kind of source, kind of target, edge kind): the graph's shape."""
        return Counter((self.node(u).kind, self.node(v).kind, k) for u, v, k in self.edges())
