"""verl-sync against jigsaw on the bundled workloads (e) long-tail DAPO and (f) agentic.

    python3 benchmarks/workloads_ef.py            # both runs of both workloads, then the block
    python3 benchmarks/workloads_ef.py --no-doc   # print the block, leave docs/benchmarks.md

Each run is a fresh process (two at a time, benchmarks/common.py), seed 0, default
predictor. Writes its marked block ``workloads-ef`` of docs/benchmarks.md (the first time
before the figures section; nothing else in the file changes) and the result JSONs to
benchmarks/results/workloads_ef.json. The same cells come from
``jigsaw bench examples/workloads/e_dapo_longtail_32gpu.yaml --baseline verl-sync --out DIR``.
"""

from __future__ import annotations

import argparse
import os
import sys

from common import GAP_HEAD, ROOT, dump, gap_row, md_table, run_many, write_doc_block

sys.path.insert(0, str(ROOT))
from jigsaw_plugin.bench.bundled import benchmark_workload  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "workloads_ef.json"
BLOCK = "workloads-ef"
KEYS = ("e", "f")
POLICIES = ("verl-sync", "jigsaw")


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} / {five:.1f} / {fifteen:.1f}"


def section(results: dict, load_before: str, load_after: str) -> str:
    rows, steps, gaps = [], [], []
    for key in KEYS:
        base, cand = results[key]["verl-sync"], results[key]["jigsaw"]
        gaps += [row for name in POLICIES if (row := gap_row(f"({key})", name, results[key][name]))]
        lb = base["bounds"]["makespan_lower_bound_s"]
        span = base["makespan_s"] - lb
        gap = (base["makespan_s"] - cand["makespan_s"]) / span if span > 0 else None
        rows.append([f"({key}) {benchmark_workload(key).title}", f"{base['makespan_s']:.0f}", f"{cand['makespan_s']:.0f}",
                     f"{base['makespan_s'] / cand['makespan_s']:.2f}x", f"{base['bounds']['work_s']:.0f}",
                     f"{base['bounds']['critical_path_s']:.0f}", f"{base['bounds']['chain_work_s']:.0f}", f"{lb:.0f}",
                     "-" if gap is None else f"{gap:.0%}",
                     f"{base['effective_utilisation']:.2f} / {cand['effective_utilisation']:.2f}",
                     f"{base['wall_s']:.1f} / {cand['wall_s']:.1f}"])
        for name, p in base["pipelines"].items():
            q = cand["pipelines"][name]
            steps.append([f"({key})", name, f"{p['mean_step_s']:.0f}", f"{p['stage_s']['gen']:.0f}",
                          f"{q['mean_step_s']:.0f}", f"{q['mean_step_s'] / p['mean_step_s']:.2f}", q["migrations"]])
    table = md_table(["workload", "verl-sync makespan s", "jigsaw makespan s", "jigsaw / verl-sync", "work_s",
                      "critical_path_s", "chain_work_s", "makespan lower bound s", "gap recovered",
                      "effective utilisation verl-sync / jigsaw", "sim wall s verl-sync / jigsaw"], rows)
    per = md_table(["workload", "pipeline", "verl-sync step s", "of it generation s", "jigsaw step s", "ratio",
                    "migrations"], steps)
    return f"""## Long-tail and agentic workloads (e), (f) (`benchmarks/workloads_ef.py`)

(e) `e_dapo_longtail_32gpu.yaml`: DAPO 7B and 32B with responses to 32K tokens and a
DeepCoder 14B code pipeline; (f) `f_agentic_32gpu.yaml`: two Search-R1 agents and a SWE
agent with tool calls up to 2 minutes and a sandboxed reward of about a minute
(docs/workload.md gives the provenance of every figure). Seed 0, default predictor, each
run its own process. Load average (1 / 5 / 15 min) before {load_before}, after {load_after}
on 2 shared cores: the sim wall times move with it.

{table}

Where the rest goes (`gap_breakdown`, as in the table of (a)-(d) above: average devices
above the ideal over the makespan, split into devices with no task, rollout replicas above
the ideal decode and prefill, training passes above their compute and fixed cost on the
fewest devices, and weight syncs):

{md_table(GAP_HEAD, gaps)}

{per}
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-doc", action="store_true", help="print the block; do not touch docs/benchmarks.md")
    args = ap.parse_args(argv)
    load_before = _load()
    jobs = [(benchmark_workload(k).file, p, None, 0) for k in KEYS for p in POLICIES]
    out = run_many(jobs)
    results = {k: {p: out[i * len(POLICIES) + j] for j, p in enumerate(POLICIES)} for i, k in enumerate(KEYS)}
    dump(results, RESULTS)
    text = section(results, load_before, _load())
    print(text)
    if not args.no_doc:
        write_doc_block(BLOCK, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
