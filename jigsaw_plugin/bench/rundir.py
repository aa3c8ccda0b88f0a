"""A saved A/B run: the folder ``jigsaw bench --out DIR`` writes and ``jigsaw report`` reads.

Records only (JSON); the report, figures and traces are rendered from them
(``bench/report.py``), so a saved run can be re-rendered without re-running:

- ``result.json``: the bench JSON (DESIGN.md section 5: baseline, candidate,
  throughput_ratio, plus the ray backend's fields) and ``command``, ``versions``,
  ``seed``, ``backend``;
- ``spans.json``: each side's :class:`~jigsaw_plugin.bench.spans.Timeline`;
- ``events_baseline.jsonl`` / ``events_candidate.jsonl``: a real run's hook events.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from jigsaw_plugin.bench.spans import Timeline, timeline_from_dict, timeline_to_dict
from jigsaw_plugin.errors import SpecError

__all__ = ["RESULT_FILE", "SPANS_FILE", "SIDES", "SavedRun", "save_run", "load_run", "bench_json"]

RESULT_FILE = "result.json"
SPANS_FILE = "spans.json"
SIDES = ("baseline", "candidate")


@dataclass(frozen=True)
class SavedRun:
    folder: Path
    bench: dict  # the contents of result.json
    baseline: Timeline
    candidate: Timeline


def bench_json(ab: dict) -> dict:
    """The bench JSON without the raw hook events (they go to their own JSONL files)."""
    return {k: v for k, v in ab.items() if k != "events"}


def save_run(folder, ab: dict, baseline: Timeline, candidate: Timeline, command: str, versions: dict) -> SavedRun:
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    bench = {**bench_json(ab), "command": command, "versions": versions,
             "seed": ab["candidate"].get("seed"), "backend": ab["candidate"].get("backend", "sim")}
    (d / RESULT_FILE).write_text(json.dumps(bench, indent=2))
    (d / SPANS_FILE).write_text(json.dumps({"baseline": timeline_to_dict(baseline),
                                            "candidate": timeline_to_dict(candidate)}))
    for side, events in ab.get("events", {}).items():  # `jigsaw graph --from-events` reads these
        with open(d / f"events_{side}.jsonl", "w") as f:
            f.writelines(json.dumps(e) + "\n" for e in events)
    return SavedRun(d, bench, baseline, candidate)


def load_run(folder) -> SavedRun:
    """Read a folder written by :func:`save_run`; a missing or broken file is a SpecError."""
    d = Path(folder)
    if not d.is_dir():
        raise SpecError("DIR", str(folder), "a folder written by `jigsaw bench ... --out DIR`")
    files = {}
    for name in (RESULT_FILE, SPANS_FILE):
        try:
            files[name] = json.loads((d / name).read_text())
        except FileNotFoundError:
            raise SpecError("DIR", str(folder), f"a folder holding {name} (written by `jigsaw bench --out DIR`)") from None
        except json.JSONDecodeError as e:
            raise SpecError(name, f"not JSON at line {e.lineno} ({e.msg})", "the file `jigsaw bench` writes",
                            where=str(d)) from None
    bench, spans = files[RESULT_FILE], files[SPANS_FILE]
    missing = [k for k in (*SIDES, "throughput_ratio") if k not in bench]
    if missing:
        raise SpecError(RESULT_FILE, "no " + ", ".join(missing), "a bench result (baseline, candidate, "
                        "throughput_ratio)", where=str(d))
    try:
        timelines = [timeline_from_dict(spans[side]) for side in SIDES]
    except (KeyError, TypeError, ValueError) as e:
        raise SpecError(SPANS_FILE, repr(e), "the spans.json that `jigsaw bench` writes", where=str(d)) from None
    return SavedRun(d, bench, *timelines)
