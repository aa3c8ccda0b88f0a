"""Shared helpers of the benchmark scripts: workloads built in code, runs in subprocesses."""

from __future__ import annotations

import json
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
EXAMPLES = ROOT / "examples" / "workloads"
# the bundled workloads (a)-(f), by letter (docs/benchmarks.md names them so)
BUNDLED = {"a": "a_sync4_32gpu.yaml", "b": "b_sync8_64gpu.yaml", "c": "c_async2_16gpu.yaml",
           "d": "d_hetero_32gpu.yaml", "e": "e_dapo_longtail_32gpu.yaml", "f": "f_agentic_32gpu.yaml"}

from jigsaw_plugin.scheduler import get_policy  # noqa: E402
from jigsaw_plugin.sim import Simulation  # noqa: E402
from jigsaw_plugin.workload import load_workload, parse_workload  # noqa: E402


def load(name_or_dict):
    if isinstance(name_or_dict, dict):
        return parse_workload(name_or_dict, base_dir=EXAMPLES)
    return load_workload(EXAMPLES / name_or_dict)


def run_one(job: tuple) -> dict:
    """(workload, policy, options, seed[, predictor]) -> result JSON plus wall time and peak
    RSS. ``predictor``: "history" (default) or "oracle" (the labelled ablation)."""
    workload, policy, options, seed, *rest = job
    predictor = rest[0] if rest else "history"
    t0 = time.perf_counter()
    result = Simulation(load(workload), get_policy(policy, **(options or {})), seed, predictor=predictor).run()
    result["wall_s"] = time.perf_counter() - t0
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["options"] = options or {}
    return result


def run_many(jobs: list, workers: int = 2, fn=run_one) -> list:
    """Each job (``fn`` of it: ``run_one`` unless said) in a fresh process (honest peak
    memory), two at a time on this machine."""
    with ProcessPoolExecutor(max_workers=workers, max_tasks_per_child=1) as ex:
        return list(ex.map(fn, jobs))


def md_table(head: list, rows: list) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


GAP_HEAD = ["workload", "policy", "devices above ideal (avg)", "idle", "rollout above ideal", "training above ideal",
            "weight sync"]


def gap_row(label: str, policy: str, result: dict) -> list | None:
    """One row of the "where the rest goes" table (``GAP_HEAD``): a result's
    ``gap_breakdown`` as average devices over its makespan and its four fractions."""
    g = result.get("gap_breakdown")
    if not g:
        return None
    f = g["fractions"]
    return [label, policy, f"{g['gap_device_s'] / result['makespan_s']:.1f}", f"{f['idle']:.0%}",
            f"{f['rollout_above_ideal']:.0%}", f"{f['training_above_ideal']:.0%}", f"{f['weight_sync']:.0%}"]


def dump(obj, path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(obj, indent=2))


BENCHMARKS_DOC = ROOT / "docs" / "benchmarks.md"
_FIGURES_MARK = "<!-- report-figures:start -->"


def write_doc_block(name: str, text: str) -> None:
    """Put ``text`` in docs/benchmarks.md's block ``<!-- name:start -->`` ... ``<!-- name:end -->``
    (``text`` may carry the markers itself): in place when it exists, else before the
    figures section. Nothing else in the file changes; report.py keeps every such block."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    body = text.strip("\n")
    if body.startswith(start) and body.endswith(end):
        body = body[len(start):-len(end)].strip("\n")
    block = f"{start}\n{body}\n{end}"
    doc = BENCHMARKS_DOC.read_text()
    if start in doc and end in doc:
        doc = doc[: doc.index(start)] + block + doc[doc.index(end) + len(end):]
    elif _FIGURES_MARK in doc:
        at = doc.index(_FIGURES_MARK)
        doc = doc[:at] + block + "\n\n" + doc[at:]
    else:
        doc = doc.rstrip("\n") + "\n\n" + block + "\n"
    BENCHMARKS_DOC.write_text(doc)


def measure_and_write(name: str, results, measure, render, full, quick_args) -> dict:
    """The measured-block scripts' command line: ``--render`` re-renders the saved results,
    ``--quick`` measures ``quick_args`` and writes nothing, otherwise ``full`` is measured,
    saved to ``results`` and written as docs/benchmarks.md's block ``name``. Returns the data."""
    import sys

    quick = "--quick" in sys.argv
    if "--render" in sys.argv:
        data = json.loads(Path(results).read_text())
    else:
        data = measure(quick_args if quick else full)
        if not quick:
            dump(data, results)
    block = render(data)
    print(block)
    if not quick:
        write_doc_block(name, block)
    return data
