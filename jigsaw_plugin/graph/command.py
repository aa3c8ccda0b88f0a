"""`jigsaw graph WORKLOAD --pipeline NAME --out FILE` (.json, .dot or .png), or
`jigsaw graph --from-events EVENTS.jsonl --out FILE` for a recorded run."""

from __future__ import annotations

from pathlib import Path

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.graph.export import to_dot, to_json, to_png
from jigsaw_plugin.graph.from_spec import build_from_spec

__all__ = ["run_graph", "run_graph_from_events", "add_graph_arguments", "WRITERS"]

WRITERS = {".json": to_json, ".dot": to_dot, ".png": to_png}


def add_graph_arguments(parser) -> None:
    """The arguments of ``jigsaw graph`` on an ``argparse`` (sub)parser."""
    parser.add_argument("workload", nargs="?", help="workload YAML (not with --from-events)")
    parser.add_argument("--pipeline", help="the pipeline to graph (required with WORKLOAD)")
    parser.add_argument("--from-events", help="build from a run's recorded hook events (jigsaw sim --events)")
    parser.add_argument("--out", required=True, help="output file: .json, .dot or .png")
    parser.add_argument("--steps", type=int, help="the first N steps (default: the spec's steps)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-samples", type=int, help="at most N samples per step")


def _writer(out: str):
    writer = WRITERS.get(Path(out).suffix.lower())
    if writer is None:
        raise SpecError("--out", out, ", ".join(WRITERS))
    return writer


def run_graph(workload_path: str, pipeline: str, out: str, steps: int | None = None, seed: int = 0,
              max_samples: int | None = None) -> int:
    """Build ``pipeline``'s plan from the workload, validate it, write ``out`` (format by
    suffix) and print a one-line summary. Bad input raises :class:`SpecError`."""
    from jigsaw_plugin.workload import load_workload

    writer = _writer(out)
    workload = load_workload(workload_path)
    graph = build_from_spec(workload, pipeline, steps=steps, seed=seed, max_samples=max_samples)
    return _write(graph, out, writer)


def run_graph_from_events(events_path: str, out: str, pipeline: str | None = None) -> int:
    """The graph of a recorded run (``jigsaw sim --events FILE`` or a host's recorder)."""
    from jigsaw_plugin.events import EventRecorder
    from jigsaw_plugin.graph.from_events import build_from_events
    from jigsaw_plugin.graph.graph import GraphError

    writer = _writer(out)
    try:
        events = EventRecorder.from_jsonl(events_path)
    except (OSError, ValueError) as e:
        raise SpecError("--from-events", events_path, f"a readable JSONL file of hook events ({e})") from None
    try:
        graph = build_from_events(events, pipeline=pipeline or None)
        graph.validate()  # times out of order in the log show here (end before start)
    except GraphError as e:
        raise SpecError("--from-events", events_path, f"hook events of the jigsaw contract ({e})") from None
    if pipeline and not len(graph):
        names = sorted({e["pipeline"] for e in events if isinstance(e.get("pipeline"), str)})
        raise SpecError("--pipeline", pipeline, ", ".join(names) or "(no pipeline in the events)")
    return _write(graph, out, writer)


def _write(graph, out: str, writer) -> int:
    graph.validate()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    writer(graph, out)
    s = graph.summary()
    kinds = ", ".join(f"{k} {v}" for k, v in s["kinds"].items())
    print(f"{out}: {s['nodes']} sub-stages, {s['edges']} edges ({kinds})")
    return 0
