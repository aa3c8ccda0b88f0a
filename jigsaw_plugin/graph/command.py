"""`jigsaw graph WORKLOAD --pipeline NAME --out FILE` (.json, .dot or .png)."""

from __future__ import annotations

from pathlib import Path

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.graph.export import to_dot, to_json, to_png
from jigsaw_plugin.graph.from_spec import build_from_spec

__all__ = ["run_graph", "run_graph_from_events", "WRITERS"]

WRITERS = {".json": to_json, ".dot": to_dot, ".png": to_png}


def run_graph(workload_path: str, pipeline: str, out: str, steps: int | None = None, seed: int = 0,
              max_samples: int | None = None) -> int:
    from jigsaw_plugin.workload import load_workload

    writer = WRITERS.get(Path(out).suffix.lower())
    if writer is None:
        raise SpecError("--out", out, ", ".join(WRITERS))
    workload = load_workload(workload_path)
    graph = build_from_spec(workload, pipeline, steps=steps, seed=seed, max_samples=max_samples)
    return _write(graph, out, writer)


def run_graph_from_events(events_path: str, out: str, pipeline: str | None = None) -> int:
    """The graph of a recorded run (``jigsaw sim --events FILE`` or a host's recorder)."""
    from jigsaw_plugin.events import EventRecorder
    from jigsaw_plugin.graph.from_events import build_from_events

    writer = WRITERS.get(Path(out).suffix.lower())
    if writer is None:
        raise SpecError("--out", out, ", ".join(WRITERS))
    try:
        events = EventRecorder.from_jsonl(events_path)
    except (OSError, ValueError) as e:
        raise SpecError("--from-events", events_path, f"a readable JSONL file of hook events ({e})") from None
    if pipeline:
        events = [e for e in events if e.get("pipeline") in (pipeline, None) or e.get("to_pipeline") == pipeline]
    return _write(build_from_events(events), out, writer)


def _write(graph, out: str, writer) -> int:
    graph.validate()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    writer(graph, out)
    s = graph.summary()
    kinds = ", ".join(f"{k} {v}" for k, v in s["kinds"].items())
    print(f"{out}: {s['nodes']} sub-stages, {s['edges']} edges ({kinds})")
    return 0
