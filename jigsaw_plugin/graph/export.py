"""Export a SubStageGraph: JSON (round-trips), DOT (Graphviz text), PNG (matplotlib)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

from jigsaw_plugin.graph.graph import SubStageGraph
from jigsaw_plugin.graph.substage import KINDS, SubStage

__all__ = ["to_json", "from_json", "to_dot", "to_png", "COLORS"]

COLORS = dict(zip(KINDS, (
    "#9ecae1", "#3182bd", "#fdae6b", "#74c476", "#9e9ac8", "#bcbddc", "#dadaeb", "#bdbdbd",
    "#e6550d", "#fd8d3c", "#31a354", "#636363", "#de2d26",
)))


def to_json(graph: SubStageGraph, path) -> None:
    data = {"nodes": [s.to_dict() for s in graph.nodes()],
            "edges": [[u, v, k] for u, v, k in graph.edges()],
            "summary": graph.summary()}
    Path(path).write_text(json.dumps(data))


def from_json(path) -> SubStageGraph:
    data = json.loads(Path(path).read_text())
    g = SubStageGraph()
    for n in data["nodes"]:
        g.add(SubStage(**n))
    for u, v, k in data["edges"]:
        g.add_edge(u, v, k)
    return g


def _q(s: str) -> str:
    return '"' + s.replace('"', '\\"') + '"'


def to_dot(graph: SubStageGraph, path) -> None:
    """Nodes coloured by kind and labelled with their sizes, one cluster per (pipeline, step)."""
    clusters = defaultdict(list)
    for s in graph.nodes():
        clusters[(s.pipeline, s.step)].append(s)
    lines = ["digraph substages {", "  rankdir=LR;", '  node [shape=box, style=filled, fontsize=9];']
    for i, ((pipe, step), nodes) in enumerate(sorted(clusters.items())):
        lines.append(f"  subgraph cluster_{i} {{ label={_q(f'{pipe} step {step}')};")
        for s in nodes:
            size = ", ".join(f"{k}={v}" for k, v in s.sizes.items())
            label = f"{s.kind}\\n{size}" if size else s.kind
            lines.append(f"    {_q(s.id)} [label={_q(label)}, fillcolor={_q(COLORS[s.kind])}];")
        lines.append("  }")
    for u, v, k in graph.edges():
        style = {"barrier": "bold", "order": "dotted"}.get(k, "solid")
        lines.append(f"  {_q(u)} -> {_q(v)} [style={style}];")
    lines.append("}")
    Path(path).write_text("\n".join(lines) + "\n")


def to_png(graph: SubStageGraph, path, max_steps: int = 4) -> None:
    """A summary picture: one box per (step, kind) with its count, laid out by dependency
    order, so that graphs of hundreds of thousands of sub-stages stay readable and fast."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = Counter((s.pipeline, s.step, s.kind) for s in graph.nodes())
    order = {k: i for i, k in enumerate(KINDS)}
    steps = sorted({(p, st) for p, st, _ in counts})[:max_steps]
    fig, ax = plt.subplots(figsize=(2.2 * len(KINDS) / 2, 1.0 + 0.9 * len(steps)))
    for row, (pipe, st) in enumerate(steps):
        kinds = sorted((k for p, s, k in counts if (p, s) == (pipe, st)), key=order.get)
        for col, kind in enumerate(kinds):
            ax.add_patch(plt.Rectangle((col * 1.6, -row), 1.4, 0.6, color=COLORS[kind]))
            ax.text(col * 1.6 + 0.7, -row + 0.3, f"{kind}\n{counts[(pipe, st, kind)]}", ha="center", va="center",
                    fontsize=7)
            if col:
                ax.annotate("", (col * 1.6, -row + 0.3), (col * 1.6 - 0.2, -row + 0.3),
                            arrowprops={"arrowstyle": "->"})
        ax.text(-0.2, -row + 0.3, f"{pipe}\nstep {st}", ha="right", va="center", fontsize=8)
    ax.set_xlim(-2.5, 1.6 * 9)
    ax.set_ylim(-len(steps) + 0.2, 1.0)
    ax.axis("off")
    ax.set_title(f"sub-stage graph: {len(graph)} sub-stages (counts per step and kind)", fontsize=9)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
