"""Simulator speed: the issue's reference workload and how cost grows with GPUs and samples.

Reference: 64 GPUs, 4 pipelines, 10 steps, 512 x 16 samples per step per pipeline (DAPO
math lengths), under verl-sync and jigsaw. Each run is a fresh process, one at a time; CPU
time (``time.process_time``: the machine is shared, wall time moves with other load), wall
time and peak resident memory (ru_maxrss) are measured. Target: < 30 s, < 2 GiB.

``--quick``: the reference workload alone with fewer steps, jigsaw only, the incremental
state build against the from-scratch one (``RefreshPolicy(exact=True)``), seconds per
step. A run cannot run away: past ``--cpu-budget`` CPU seconds it stops (SIGXCPU, the
steps it finished are reported) and the kernel kills it 30 s later.

    python benchmarks/sim_speed.py --quick --steps 2 --cpu-budget 300
    python benchmarks/sim_speed.py --write        # the full table; writes its block
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import yaml
from common import EXAMPLES, ROOT, load, md_table, write_doc_block
from decision_latency import _load_avg

__all__ = ["workload", "run", "measure"]

BLOCK = "sim-speed"
RESULTS = ROOT / "benchmarks" / "results" / "sim_speed.json"
MODES = ("incremental", "from-scratch")


def workload(gpus=64, pipelines=4, prompts=512, samples=16, steps=10) -> dict:
    demo = yaml.safe_load((EXAMPLES / "demo.yaml").read_text())
    base = demo["pipelines"][0]
    pipes = []
    for i in range(pipelines):
        p = copy.deepcopy(base)
        p.update(name=f"dapo-{i}", prompts_per_step=prompts, samples_per_prompt=samples, steps=steps)
        pipes.append(p)
    return {"version": 1, "cluster": {"gpus": gpus, "gpu": "h100", "gpus_per_node": 8}, "pipelines": pipes}


class _OverBudget(Exception):
    pass


def _over_budget(signum, frame):
    raise _OverBudget


def measure(job: tuple) -> dict:
    """(workload dict, policy, state build mode, CPU budget s) in this process."""
    from jigsaw_plugin.core.snapshot import EXACT, RefreshPolicy
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.sim import Simulation

    w, policy, mode, budget_s = job
    signal.signal(signal.SIGXCPU, _over_budget)
    used = resource.getrusage(resource.RUSAGE_SELF).ru_utime
    soft = int(used + budget_s) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 30))
    sim = Simulation(load(w), get_policy(policy), 0)
    sim.world.prediction_refresh = EXACT if mode == "from-scratch" else RefreshPolicy()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    stopped = False
    result = None
    try:
        result = sim.run()
    except _OverBudget:
        stopped = True
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    steps_done = sum(p.train_next for p in sim.world.order)
    return {"policy": policy, "mode": mode, "gpus": w["cluster"]["gpus"], "stopped_by_budget": stopped,
            "requests": sum(p["prompts_per_step"] * p["samples_per_prompt"] * p["steps"] for p in w["pipelines"]),
            "pipeline_steps_done": steps_done, "cpu_s": cpu, "wall_s": wall,
            "cpu_s_per_step": cpu / max(1, steps_done) * len(w["pipelines"]),
            "events": sim.events, "makespan_s": result["makespan_s"] if result else None,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _run_jobs(jobs: list) -> list:
    with ProcessPoolExecutor(max_workers=1, max_tasks_per_child=1) as ex:
        return list(ex.map(measure, jobs))


def run(budget_s: float = 600.0) -> str:
    """The full table (report.py): every case under verl-sync and jigsaw (incremental)."""
    cases = [("reference", workload())]
    cases += [(f"{g} GPUs", workload(gpus=g)) for g in (16, 32, 128)]
    cases += [(f"{s} samples/prompt", workload(samples=s)) for s in (4, 8)]
    jobs = [(w, pol, "incremental", budget_s) for _, w in cases for pol in ("verl-sync", "jigsaw")]
    results = _run_jobs(jobs)
    rows = []
    for i, (label, w) in enumerate(cases):
        for j, pol in enumerate(("verl-sync", "jigsaw")):
            r = results[2 * i + j]
            n = r["requests"]
            rows.append([label, r["gpus"], n, pol, f"{r['wall_s']:.1f}", f"{r['cpu_s']:.1f}"
                         + (" (budget)" if r["stopped_by_budget"] else ""), f"{r['peak_rss_mib']:.0f}",
                         f"{r['events']:,}", f"{1e6 * r['cpu_s'] / n:.0f}"])
    return md_table(["case", "GPUs", "requests", "policy", "wall s", "CPU s", "peak RSS MiB", "events",
                     "CPU us/request"], rows)


def quick(steps: int, budget_s: float, modes=MODES) -> list:
    w = workload(steps=steps)
    return _run_jobs([(w, "jigsaw", m, budget_s) for m in modes])


def quick_table(results: list) -> str:
    rows = [[r["mode"], r["pipeline_steps_done"] // 4 if r["pipeline_steps_done"] else 0,
             ("yes" if r["stopped_by_budget"] else "no"), f"{r['cpu_s']:.1f}", f"{r['wall_s']:.1f}",
             f"{r['cpu_s_per_step']:.2f}", f"{r['events']:,}",
             "-" if r["makespan_s"] is None else f"{r['makespan_s']:.1f}", f"{r['peak_rss_mib']:.0f}"]
            for r in results]
    return md_table(["state build", "steps done (per pipeline)", "stopped by budget", "CPU s", "wall s",
                     "CPU s per step", "events", "simulated makespan s", "peak RSS MiB"], rows)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="reference workload, jigsaw, both state builds")
    ap.add_argument("--steps", type=int, default=2, help="steps per pipeline with --quick")
    ap.add_argument("--modes", default=",".join(MODES), help="with --quick: incremental, from-scratch or both")
    ap.add_argument("--cpu-budget", type=float, default=600.0, help="CPU seconds per run at most")
    ap.add_argument("--write", action="store_true", help="write the block into docs/benchmarks.md")
    args = ap.parse_args(argv)
    if not 1 <= args.steps <= 10 or not 0 < args.cpu_budget <= 3600:
        sys.exit("--steps must be in [1, 10] and --cpu-budget in (0, 3600] seconds")
    modes = tuple(m.strip() for m in args.modes.split(","))
    if any(m not in MODES for m in modes):
        sys.exit(f"--modes: {args.modes!r}; allowed: {', '.join(MODES)}")
    command = ("python benchmarks/sim_speed.py " + " ".join(argv if argv is not None else sys.argv[1:])).strip()
    before = _load_avg()
    if args.quick:
        results = quick(args.steps, args.cpu_budget, modes)
        body = quick_table(results)
        what = (f"The reference workload (64 GPUs, 4 DAPO pipelines, 512 x 16 samples per step) for "
                f"{args.steps} steps under jigsaw; CPU seconds per step of the whole job set.")
    else:
        results, body = None, run(args.cpu_budget)
        what = "Every case under verl-sync and jigsaw (incremental state build)."
    after = _load_avg()
    text = (f"## Simulator speed (`benchmarks/sim_speed.py`)\n\n{what} \"from-scratch\" reads every "
            f"request row and asks the predictor every decide round (the build before the incremental "
            f"one). CPU time of the run's process (`time.process_time`); wall time moves with the "
            f"machine's other load.\n\n`{command}` (load average before: {before}; after: {after}; "
            f"2 cores shared)\n\n{body}\n")
    print(text)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"command": command, "load_before": before, "load_after": after,
                                   "results": results}, indent=2))
    if args.write:
        write_doc_block(BLOCK, text)


if __name__ == "__main__":
    main()
