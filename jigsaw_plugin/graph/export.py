"""Export a SubStageGraph: JSON (round-trips), DOT (Graphviz text), PNG (matplotlib).

No Graphviz binding is needed: the DOT text is written here. The PNG draws every node of
a small graph (``max_nodes``, default 400) in a layered layout, one layer per topological
generation; a bigger graph is collapsed to one box per (pipeline, step, kind) with its
count and the real dependencies between boxes, so that a graph of hundreds of thousands of
sub-stages stays readable and draws in a second or two.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from pathlib import Path

import networkx as nx

from jigsaw_plugin.graph.graph import GraphError, SubStageGraph
from jigsaw_plugin.graph.substage import KINDS, SubStage

__all__ = ["to_json", "from_json", "to_dot", "to_png", "COLORS", "FORMAT"]

FORMAT = "jigsaw-substage-graph"
_VERSION = 1

#: Fill colour of each kind (DOT and PNG).
COLORS = {
    "rollout_request": "#9ecae1",
    "gen_turn": "#3182bd",
    "tool_call": "#fdae6b",
    "reward": "#74c476",
    "old_log_prob_shard": "#9e9ac8",
    "ref_shard": "#bcbddc",
    "values_shard": "#dadaeb",
    "adv": "#bdbdbd",
    "update_actor": "#e6550d",
    "update_critic": "#fd8d3c",
    "weight_sync": "#31a354",
    "context_switch": "#636363",
    "migration": "#de2d26",
    "barrier": "#f0f0f0",
}
assert set(COLORS) == set(KINDS), "every kind needs a colour"
_EDGE_STYLE = {"data": "solid", "barrier": "bold", "order": "dotted"}


# ---------------------------------------------------------------------------------- JSON
def to_json(graph: SubStageGraph, path) -> None:
    """Node-link JSON: ``{"format", "version", "nodes": [SubStage fields...], "edges":
    [[source, target, kind]...], "summary"}``. :func:`from_json` reads it back."""
    data = {"format": FORMAT, "version": _VERSION,
            "nodes": [s.to_dict() for s in graph.nodes()],
            "edges": [[u, v, k] for u, v, k in graph.edges()],
            "summary": graph.summary()}
    Path(path).write_text(json.dumps(data))


def from_json(path) -> SubStageGraph:
    """The graph :func:`to_json` wrote (a :class:`GraphError` if the file is not one)."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or data.get("format", FORMAT) != FORMAT or "nodes" not in data:
        raise GraphError(f"{path}: not a sub-stage graph JSON (expected format {FORMAT!r})")
    g = SubStageGraph()
    fields = set(SubStage.__dataclass_fields__)
    for n in data["nodes"]:
        extra = set(n) - fields
        if extra:
            raise GraphError(f"{path}: node {n.get('id')!r} has unknown fields {sorted(extra)}")
        g.add(SubStage(**n))
    for u, v, k in data["edges"]:
        g.add_edge(u, v, k)
    return g


# ----------------------------------------------------------------------------------- DOT
def _esc(s) -> str:
    return str(s).replace("\\", "\\\\").replace('"', '\\"')


def _q(s) -> str:
    return '"' + _esc(s) + '"'


def to_dot(graph: SubStageGraph, path) -> None:
    """Graphviz text: nodes labelled with kind and sizes, filled by kind, one cluster per
    (pipeline, step); edges solid (data), bold (barrier) or dotted (order)."""
    clusters = defaultdict(list)
    for s in graph.nodes():
        clusters[(s.pipeline, s.step)].append(s)
    lines = ["digraph substages {", "  rankdir=LR;", "  node [shape=box, style=filled, fontsize=9];"]
    for i, ((pipe, step), nodes) in enumerate(sorted(clusters.items())):
        lines.append(f"  subgraph cluster_{i} {{ label={_q(f'{pipe} step {step}')};")
        for s in nodes:
            size = ", ".join(f"{k}={v}" for k, v in s.sizes.items())
            label = _esc(s.kind) + (f"\\n{_esc(size)}" if size else "")  # \n: a DOT line break
            lines.append(f'    {_q(s.id)} [label="{label}", fillcolor={_q(COLORS[s.kind])}];')
        lines.append("  }")
    for u, v, k in graph.edges():
        lines.append(f"  {_q(u)} -> {_q(v)} [style={_EDGE_STYLE.get(k, 'solid')}];")
    lines.append("}")
    Path(path).write_text("\n".join(lines) + "\n")


# ----------------------------------------------------------------------------------- PNG
# where a kind sits in a step's flow (x) and a small vertical offset so parallel kinds
# (tool calls beside turns) do not hide each other's arrows
_FLOW = {"context_switch": (-1, 0.0), "rollout_request": (0, 0.0), "gen_turn": (1, 0.0), "migration": (1, -0.45),
         "tool_call": (2, -0.45), "reward": (3, 0.0), "barrier": (4, 0.0), "old_log_prob_shard": (5, 0.0),
         "ref_shard": (6, 0.0), "values_shard": (7, 0.0), "adv": (8, 0.0), "update_critic": (9, -0.45),
         "update_actor": (9, 0.0), "weight_sync": (10, 0.0)}


def to_png(graph: SubStageGraph, path, max_nodes: int = 400, max_rows: int = 12) -> None:
    """A picture: every node (layered by topological generation) when the graph has at most
    ``max_nodes`` nodes, else a per-(pipeline, step, kind) summary of at most ``max_rows``
    steps with the counts and the dependencies between the groups."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if len(graph) <= max_nodes:
        fig = _draw_nodes(graph, plt)
    else:
        fig = _draw_summary(graph, plt, max_rows)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _legend(ax, kinds) -> None:
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=COLORS[k], label=k) for k in KINDS if k in kinds], fontsize=7,
              loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)


def _draw_nodes(graph: SubStageGraph, plt):
    if not nx.is_directed_acyclic_graph(graph.g):
        graph.validate()  # names the cycle
    rank = {k: i for i, k in enumerate(KINDS)}
    layer_of = {n: x for x, layer in enumerate(nx.topological_generations(graph.g)) for n in layer}
    for n in list(layer_of):  # a source sits just before its first successor (a request before its turn)
        if graph.g.in_degree(n) == 0 and graph.g.out_degree(n):
            layer_of[n] = min(layer_of[v] for v in graph.g.successors(n)) - 1
    by_layer = defaultdict(list)
    for n, x in layer_of.items():
        by_layer[x].append(n)
    layers = [sorted(by_layer[x], key=lambda n: _node_key(graph, n, rank)) for x in sorted(by_layer)]
    pos = {n: (x, -(y - (len(layer) - 1) / 2)) for x, layer in enumerate(layers) for y, n in enumerate(layer)}
    widest = max((len(layer) for layer in layers), default=1)
    fig, ax = plt.subplots(figsize=(min(40.0, 2.0 + 0.9 * len(layers)), min(40.0, 1.5 + 0.35 * widest)))
    for u, v, k in graph.edges():
        (x0, y0), (x1, y1) = pos[u], pos[v]
        ax.annotate("", (x1, y1), (x0, y0), arrowprops={
            "arrowstyle": "-|>", "lw": 1.2 if k == "barrier" else 0.6, "color": "#555555",
            "linestyle": ":" if k == "order" else "-", "shrinkA": 5, "shrinkB": 5})
    subs = graph.nodes()
    ax.scatter([pos[s.id][0] for s in subs], [pos[s.id][1] for s in subs], s=120, zorder=3,
               c=[COLORS[s.kind] for s in subs], edgecolors="#333333", linewidths=0.5)
    if len(subs) <= 80:
        for s in subs:
            ax.text(pos[s.id][0], pos[s.id][1] - 0.3, s.id.split("/", 1)[-1], ha="center", va="top", fontsize=5)
    _legend(ax, {s.kind for s in subs})
    ax.axis("off")
    ax.set_title(f"sub-stage graph: {len(graph)} sub-stages, {graph.g.number_of_edges()} edges "
                 "(left to right: topological generations)", fontsize=9)
    return fig


def _node_key(graph, n, rank):
    s = graph.node(n) if n in graph else None
    return (s.pipeline, s.step, rank[s.kind], n) if s is not None else ("", 0, 0, n)


def _draw_summary(graph: SubStageGraph, plt, max_rows: int):
    group = {}
    counts = Counter()
    for s in graph.nodes():
        key = (s.pipeline, s.step, s.kind)
        group[s.id] = key
        counts[key] += 1
    flows = Counter()
    for u, v in graph.g.edges():
        a, b = group.get(u), group.get(v)
        if a is not None and b is not None and a != b:
            flows[(a, b)] += 1
    rows_all = sorted({(p, st) for p, st, _ in counts})
    rows = rows_all[:max_rows]
    row_of = {r: i for i, r in enumerate(rows)}
    pos = {}
    for (p, st, kind) in counts:
        if (p, st) in row_of:
            x, dy = _FLOW[kind]
            pos[(p, st, kind)] = (x * 1.6, -row_of[(p, st)] * 1.4 + dy)
    fig, ax = plt.subplots(figsize=(19.0, 1.2 + 1.1 * len(rows)))
    for (a, b), n in sorted(flows.items()):
        if a in pos and b in pos:
            (x0, y0), (x1, y1) = pos[a], pos[b]
            ax.annotate("", (x1 + 0.7, y1 + 0.3), (x0 + 0.7, y0 + 0.3), arrowprops={
                "arrowstyle": "-|>", "color": "#777777", "lw": 0.5 + 0.35 * math.log10(n + 1),
                "shrinkA": 14, "shrinkB": 14, "connectionstyle": "arc3,rad=0.08"})
    for key, (x, y) in pos.items():
        ax.add_patch(plt.Rectangle((x, y), 1.4, 0.6, facecolor=COLORS[key[2]], edgecolor="#333333", lw=0.5))
        ax.text(x + 0.7, y + 0.3, f"{key[2]}\n{counts[key]}", ha="center", va="center", fontsize=6.5)
    for (p, st), i in row_of.items():
        ax.text(-2.0, -i * 1.4 + 0.3, f"{p}\nstep {st}", ha="right", va="center", fontsize=8)
    ax.set_xlim(-4.5, 11 * 1.6 + 0.2)
    ax.set_ylim(-len(rows) * 1.4 + 0.4, 1.0)
    ax.axis("off")
    shown = "" if len(rows) == len(rows_all) else f"; first {len(rows)} of {len(rows_all)} steps shown"
    ax.set_title(f"sub-stage graph: {len(graph)} sub-stages, {graph.g.number_of_edges()} edges "
                 f"(one box per step and kind with its count{shown})", fontsize=9)
    _legend(ax, {k for _, _, k in counts})
    return fig
