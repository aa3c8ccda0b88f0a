"""Chrome-trace (Perfetto) export of a simulated run: one track per device.

Recorded first (``World.trace``: name, category, devices, start, end), written here; open
the file in ui.perfetto.dev or chrome://tracing.
"""

from __future__ import annotations

import json

__all__ = ["chrome_trace", "write_chrome_trace"]


def chrome_trace(records, gpus_per_node: int = 8) -> dict:
    events = []
    nodes = set()
    for name, cat, devices, start, end in records:
        for d in devices:
            node = d // max(1, gpus_per_node)
            nodes.add(node)
            events.append({
                "name": name, "cat": cat, "ph": "X", "pid": node, "tid": d,
                "ts": round(start * 1e6, 1), "dur": round(max(0.0, end - start) * 1e6, 1),
            })
    meta = [{"name": "process_name", "ph": "M", "pid": n, "args": {"name": f"node {n}"}} for n in sorted(nodes)]
    return {"traceEvents": meta + events, "displayTimeUnit": "ms"}


def write_chrome_trace(records, path, gpus_per_node: int = 8) -> None:
    with open(path, "w") as f:
        json.dump(chrome_trace(records, gpus_per_node), f)
