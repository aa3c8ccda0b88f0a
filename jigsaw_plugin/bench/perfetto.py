"""A run's timeline as Chrome trace JSON (opens in ui.perfetto.dev and chrome://tracing).

One process per node, one thread (track) per device, named ``device N``; a span on k
devices is drawn on each of them. A migration is an instant marker on its source devices
and, when both ends are known, a flow arrow from the source to the destination device.
"""

from __future__ import annotations

import json
from pathlib import Path

from jigsaw_plugin.bench.spans import Timeline

__all__ = ["perfetto_trace", "write_perfetto_trace"]

_US = 1e6  # trace timestamps are microseconds


def _pid(device: int, gpus_per_node: int) -> int:
    return device // max(1, gpus_per_node)


def perfetto_trace(tl: Timeline, title: str = "") -> dict:
    gpn = tl.gpus_per_node
    meta = []
    for node in sorted({_pid(d, gpn) for d in range(tl.gpus)}):
        name = f"{title} node {node}".strip()
        meta.append({"name": "process_name", "ph": "M", "pid": node, "tid": 0, "args": {"name": name}})
    for d in range(tl.gpus):
        meta.append({"name": "thread_name", "ph": "M", "pid": _pid(d, gpn), "tid": d, "args": {"name": f"device {d}"}})
        meta.append({"name": "thread_sort_index", "ph": "M", "pid": _pid(d, gpn), "tid": d, "args": {"sort_index": d}})
    events = []
    for s in tl.spans:
        for d in s.devices:
            events.append({"name": f"{s.pipeline} {s.label}", "cat": s.kind, "ph": "X", "pid": _pid(d, gpn), "tid": d,
                           "ts": round(s.start_s * _US, 1), "dur": round(max(0.0, s.end_s - s.start_s) * _US, 1),
                           "args": {"pipeline": s.pipeline, "kind": s.kind, "devices": list(s.devices)}})
    for i, m in enumerate(tl.migrations):
        ts = round(m.t_s * _US, 1)
        args = {"pipeline": m.pipeline, "requests": m.requests, "to_devices": list(m.dst_devices)}
        for d in m.src_devices:
            events.append({"name": f"{m.pipeline} migrate {m.requests}", "cat": "migration", "ph": "i", "s": "t",
                           "pid": _pid(d, gpn), "tid": d, "ts": ts, "args": args})
        if m.src_devices and m.dst_devices:  # an arrow from the first source to the first destination device
            src, dst = m.src_devices[0], m.dst_devices[0]
            flow = {"name": "migration", "cat": "migration", "id": i, "ts": ts}
            events.append({**flow, "ph": "s", "pid": _pid(src, gpn), "tid": src})
            events.append({**flow, "ph": "f", "bp": "e", "pid": _pid(dst, gpn), "tid": dst})
    return {"traceEvents": meta + events, "displayTimeUnit": "ms"}


def write_perfetto_trace(tl: Timeline, path, title: str = "") -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(perfetto_trace(tl, title)))
    return path
