"""A change to the jigsaw policy judged against the noise before it becomes a default.

    python benchmarks/probe.py --policy-opt latency_slack=0.1                 # (a)-(f), seed 0
    python benchmarks/probe.py --policy-opt tail_requests=64 --keys a,c --seeds 0,1,2
    python benchmarks/probe.py --policy-opt max_widen=2 --policy-opt min_gain=4 --json out.json

jigsaw with its defaults and with the ``--policy-opt`` options runs side by side on each
bundled workload and seed (simulated, the default predictor; two processes at a time, each
run its own). Each row sets the change beside that workload's noise floor: the largest
move of jigsaw's seed-0 run when the engines' per-step host time moves by 2e-4 or less
(benchmarks/results/sensitivity.json, `benchmarks/sensitivity.py`), a change with no
physical weight that still sends the schedule elsewhere. A change inside it says nothing
about the option. The gap recovered is against verl-sync's makespan and the makespan
lower bound at the same seed, read from benchmarks/results/seeds.json (`benchmarks/seeds.py`;
"-" where that seed was not run); the bound does not depend on the policy.

Writes no block of docs/benchmarks.md: a probe's figures go into the stop's notes
(docs/benchmarks_history.md), and a probe kept as a default re-runs the blocks it moves.
Run a worktree's copy to probe a rule not in main: the script imports the package of the
tree it sits in.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import sensitivity
from common import BUNDLED, ROOT, md_table, run_many

from jigsaw_plugin.bench.ab import gap_share
from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.scheduler import get_policy, parse_options

__all__ = ["probe", "render", "verdict", "noise_floors"]

KEYS = ("a", "b", "c", "d", "e", "f")
SENSITIVITY = ROOT / "benchmarks" / "results" / "sensitivity.json"
SEEDS = ROOT / "benchmarks" / "results" / "seeds.json"


def noise_floors(path: Path = SENSITIVITY) -> dict:
    """Workload key -> the largest fractional move of jigsaw's seed-0 makespan under the
    sensitivity block's perturbations (absent where that block has no such runs)."""
    if not path.exists():
        return {}
    out = {}
    for key, by_policy in json.loads(path.read_text()).items():
        runs = by_policy.get("jigsaw")
        moved = sensitivity.moves(runs) if runs else []  # its first run is the fitted model's
        if moved:
            out[key] = max(abs(m) for m in moved)
    return out


def baselines(path: Path = SEEDS) -> dict:
    """(workload key, seed) -> (verl-sync makespan s, makespan lower bound s) where saved."""
    if not path.exists():
        return {}
    out = {}
    for key, by_seed in json.loads(path.read_text()).items():
        for seed, runs in by_seed.items():
            v = runs.get("verl-sync")
            if v:
                out[(key, int(seed))] = (v["makespan_s"], v["bound_s"])
    return out


def verdict(change: float, floor: float | None) -> str:
    """'faster' / 'slower' where the change clears the workload's noise floor, else 'within
    noise' ('no floor' where the sensitivity block has not measured that workload)."""
    if floor is None:
        return "no floor"
    if abs(change) <= floor:
        return "within noise"
    return "faster" if change < 0 else "slower"


def probe(options: dict, keys: tuple = KEYS, seeds: tuple = (0,), workers: int = 2) -> list:
    """Rows (key, seed, defaults makespan s, with the options s), the runs side by side."""
    jobs, where = [], []
    for key in keys:
        for seed in seeds:
            for opts in ({}, options):
                jobs.append((BUNDLED[key], "jigsaw", opts, seed))
                where.append((key, seed))
    results = run_many(jobs, workers=workers)
    rows = []
    for i in range(0, len(results), 2):
        key, seed = where[i]
        rows.append({"key": key, "seed": seed, "defaults_s": results[i]["makespan_s"],
                     "with_s": results[i + 1]["makespan_s"]})
    return rows


def render(rows: list, options: dict, floors: dict, base: dict) -> str:
    """The rows as a table, then the geometric mean of with / defaults and the count of each
    verdict."""
    head = ["workload", "seed", "defaults s", "with the options s", "change", "noise floor",
            "verdict", "gap recovered defaults / with"]
    out, logs, counts = [], [], {}
    for r in rows:
        change = r["with_s"] / r["defaults_s"] - 1.0
        floor = floors.get(r["key"])
        v = verdict(change, floor)
        counts[v] = counts.get(v, 0) + 1
        logs.append(math.log(r["with_s"] / r["defaults_s"]))
        vb = base.get((r["key"], r["seed"]))
        gaps = "-"
        if vb:
            (verl_s, bound_s) = vb
            g0, g1 = gap_share(verl_s, r["defaults_s"], bound_s), gap_share(verl_s, r["with_s"], bound_s)
            if g0 is not None and g1 is not None:
                gaps = f"{g0:.0%} / {g1:.0%}"
        out.append([f"({r['key']})", r["seed"], f"{r['defaults_s']:.1f}", f"{r['with_s']:.1f}", f"{change:+.2%}",
                    "-" if floor is None else f"{floor:.2%}", v, gaps])
    opts = ", ".join(f"{k}={v}" for k, v in sorted(options.items()))
    mean = math.exp(sum(logs) / len(logs)) - 1.0 if logs else 0.0
    tally = ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
    return (f"jigsaw with {opts} against its defaults (simulated, default predictor)\n\n" + md_table(head, out)
            + f"\n\nGeometric mean of the makespans' ratios: {mean:+.2%} over {len(rows)} runs ({tally}).")


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy-opt", action="append", default=[], metavar="KEY=VALUE", required=True,
                    help="a jigsaw policy option (repeatable), as `jigsaw bench --policy-opt`")
    ap.add_argument("--keys", default=",".join(KEYS), help="bundled workloads, comma-separated (a-f)")
    ap.add_argument("--seeds", default="0", help="seeds, comma-separated")
    ap.add_argument("--workers", type=int, default=2, help="runs at a time")
    ap.add_argument("--json", type=Path, help="also save the rows here")
    args = ap.parse_args(argv)
    try:
        options = parse_options(args.policy_opt)
        get_policy("jigsaw", **options)  # a field it has, a value of its kind, before any run
    except SpecError as e:
        print(f"probe.py: {e}", file=sys.stderr)
        return 2
    keys = tuple(k.strip() for k in args.keys.split(",") if k.strip())
    bad = [k for k in keys if k not in BUNDLED]
    if bad:
        print(f"probe.py: --keys: got {', '.join(bad)}; allowed: {', '.join(KEYS)}", file=sys.stderr)
        return 2
    try:
        seeds = tuple(int(s) for s in args.seeds.split(",") if s.strip())
    except ValueError:
        print(f"probe.py: --seeds: got {args.seeds!r}; allowed: integers, comma-separated", file=sys.stderr)
        return 2
    if args.workers < 1:
        print(f"probe.py: --workers: got {args.workers}; allowed: an integer >= 1", file=sys.stderr)
        return 2
    rows = probe(options, keys, seeds, args.workers)
    print(render(rows, options, noise_floors(), baselines()))
    if args.json:
        args.json.write_text(json.dumps({"options": options, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
