"""Each bundled workload's pipelines run alone on the whole pool, beside the job.

    python3 benchmarks/alone.py            # measure, save, write the block
    python3 benchmarks/alone.py --render   # re-render the saved results
    python3 benchmarks/alone.py --quick    # (d) only; print, write nothing

Splits the gap between jigsaw's makespan and the makespan lower bound in two. A pipeline
alone on every GPU of the pool, under the same policy, has no one to share with: its
makespan there less its own critical chain (``critical_path_s``: each step's longest
trajectory decoded alone at batch 1 from its first token, as only an order that knew the
lengths could run it) is what the policy's mechanisms leave on its own chain; the job's
makespan less the longest of those is what sharing the pool costs. Neither figure is a
bound (a policy is not monotone in the devices it gets): they say where to look.

Each run is a fresh process (two at a time), jigsaw with its defaults, seed 0, the default
predictor. A pipeline alone keeps its samples (they are drawn per pipeline by name), its
mode and staleness; its static share becomes the whole pool. Writes the block ``alone``
of docs/benchmarks.md and benchmarks/results/alone.json.
"""

from __future__ import annotations

import copy
import sys

import yaml
from common import EXAMPLES, ROOT, md_table, measure_and_write, run_many

sys.path.insert(0, str(ROOT))
from jigsaw_plugin.bench.bundled import benchmark_workload  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "alone.json"
BLOCK = "alone"
KEYS = ("a", "b", "c", "d", "e", "f")


def alone_spec(spec: dict, name: str) -> dict:
    """``spec`` with only pipeline ``name``, on the whole pool (no static share)."""
    out = copy.deepcopy(spec)
    out["pipelines"] = [p for p in out["pipelines"] if p["name"] == name]
    if len(out["pipelines"]) != 1:
        raise SystemExit(f"alone_spec: pipeline {name!r} not in the workload; allowed: "
                         f"{', '.join(p['name'] for p in spec['pipelines'])}")
    out["pipelines"][0].pop("gpus", None)
    return out


def _finish_s(pipeline_result: dict) -> float:
    """When the pipeline finished its run: its samples over its own samples per second."""
    return pipeline_result["samples"] / pipeline_result["samples_per_s"]


def measure(keys) -> dict:
    specs = {k: yaml.safe_load((EXAMPLES / benchmark_workload(k).file).read_text()) for k in keys}
    jobs, where = [], []
    for k in keys:
        jobs.append((specs[k], "jigsaw", None, 0))
        where.append((k, None))
        for p in specs[k]["pipelines"]:
            jobs.append((alone_spec(specs[k], p["name"]), "jigsaw", None, 0))
            where.append((k, p["name"]))
    out = run_many(jobs)
    data: dict = {k: {"job": None, "alone": {}} for k in keys}
    for (k, name), r in zip(where, out):
        slim = {"makespan_s": r["makespan_s"], "bounds": r["bounds"],
                "finish_s": {n: _finish_s(p) for n, p in r["pipelines"].items()}}
        if name is None:
            data[k]["job"] = slim
        else:
            data[k]["alone"][name] = slim
    return data


def render(data: dict) -> str:
    rows, summary = [], []
    for k, d in data.items():
        job = d["job"]
        lb, ms = job["bounds"]["makespan_lower_bound_s"], job["makespan_s"]
        for name, a in d["alone"].items():
            chain = a["bounds"]["critical_path_s"]
            rows.append([f"({k})", name, f"{job['finish_s'][name]:.0f}", f"{a['makespan_s']:.0f}", f"{chain:.0f}",
                         f"{a['makespan_s'] / chain:.2f}"])
        top_name, top = max(d["alone"].items(), key=lambda kv: kv[1]["makespan_s"])
        alone = top["makespan_s"]
        gap = ms - lb
        own = max(0.0, alone - lb)
        summary.append([f"({k})", f"{lb:.0f}", f"{ms:.0f}", f"{top_name} {alone:.0f}",
                        f"{min(own, gap) / gap:.0%}" if gap > 0 else "-",
                        f"{max(0.0, ms - max(alone, lb)) / gap:.0%}" if gap > 0 else "-",
                        f"{ms / alone:.2f}"])
    return f"""## Each pipeline alone on the whole pool (`benchmarks/alone.py`)

The gap between jigsaw's makespan and the makespan lower bound, split in two by running
each pipeline of the workload alone on every GPU of its pool (jigsaw, its defaults, seed
0, default predictor; a pipeline alone keeps its samples, mode and staleness). "own
chain": the part of the gap up to the slowest pipeline's makespan alone, which no sharing
causes: the policy's mechanisms on that pipeline's own steps against its critical chain
(each step's longest trajectory decoded at batch 1 from its first token, as only an order
that knew the lengths could run it; the training passes on their fastest gangs).
"sharing": the rest, from the slowest alone to the job's makespan. Where the bound is the
work (`work_s`, (a)-(c)), a pipeline alone ends well below it and the whole gap is
sharing: the pool's device-seconds, not one chain. Neither split point is a bound (a
policy is not monotone in the devices it gets).

{md_table(["workload", "lower bound s", "jigsaw s", "slowest pipeline alone s", "gap: own chain",
           "gap: sharing", "jigsaw / slowest alone"], summary)}

Per pipeline: when it finished in the job, its makespan alone on the whole pool, its own
critical chain (`critical_path_s` of the run alone) and the ratio of the two.

{md_table(["workload", "pipeline", "finished in the job s", "alone on the pool s", "its chain s",
           "alone / chain"], rows)}

`python benchmarks/alone.py`
"""


def main() -> int:
    measure_and_write(BLOCK, RESULTS, measure, render, KEYS, ("d",))
    return 0


if __name__ == "__main__":
    sys.exit(main())
