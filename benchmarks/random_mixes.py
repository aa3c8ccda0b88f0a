"""Random job mixes: jigsaw against every baseline on workloads no one tuned for.

The bundled workloads (a)-(f) are what the policy was developed on; a policy tuned to them
can still lose elsewhere. This draws job mixes at random from the bundled pipelines (their
fitted length, turn and tool distributions, models and algorithms) with a fixed seed: 2-5
pipelines, static shares of 4, 8 or 16 GPUs (8 or 16 for 14B and 32B models), some
synchronous pipelines made asynchronous (staleness 1 or 2) and some the other way, H100 or
H20, 4 steps each. Every policy runs every mix in its own process, seed 0, default predictor.

What the comparison means: jigsaw, verl-sync and rollmux keep each pipeline's staleness
(verl-sync and rollmux run an asynchronous pipeline synchronously, which is stricter);
one-step-off, streamrl and areal run every pipeline at least one step off-policy, which
changes a synchronous pipeline's algorithm. So "vs on-policy" is jigsaw against the best
of verl-sync and rollmux, the comparison a user of a synchronous recipe makes; "vs all"
includes the off-policy systems. A baseline that cannot run a mix (a share too small to
split into rollout and training devices) is shown with the reason.

    python benchmarks/random_mixes.py                 # 16 mixes, seed 2026; writes the block
    python benchmarks/random_mixes.py --mixes 4 --no-doc
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import yaml
from common import EXAMPLES, ROOT, dump, md_table, write_doc_block

RESULTS = ROOT / "benchmarks" / "results" / "random_mixes.json"
BLOCK = "random-mixes"
SOURCES = ("a_sync4_32gpu", "c_async2_16gpu", "d_hetero_32gpu", "e_dapo_longtail_32gpu", "f_agentic_32gpu")
ON_POLICY = ("verl-sync", "rollmux")
OFF_POLICY = ("one-step-off", "streamrl", "areal")
POLICIES = ("jigsaw", *ON_POLICY, *OFF_POLICY)
STEPS = 4


def _templates() -> list:
    out = []
    for name in SOURCES:
        out += yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())["pipelines"]
    return out


def _large(model: str) -> bool:
    return any(tag in model for tag in ("14b", "32b"))


def mixes(seed: int, n: int) -> list[tuple[str, dict]]:
    """``n`` job mixes drawn with ``seed``: (name, workload spec)."""
    rng = np.random.default_rng(seed)
    templates = _templates()
    out = []
    for i in range(n):
        pipes = []
        for j in range(int(rng.integers(2, 6))):
            p = copy.deepcopy(templates[int(rng.integers(len(templates)))])
            p["name"] = f"{p['name']}-{j}"
            p["gpus"] = int(rng.choice([8, 16] if _large(p["model"]) else [4, 8, 16]))
            p["steps"] = STEPS
            flip = rng.random()
            if flip < 0.25:
                p["mode"], p["staleness"] = "async", int(rng.integers(1, 3))
            elif flip < 0.4:
                p["mode"] = "sync"
                p.pop("staleness", None)
            pipes.append(p)
        gpus = sum(p["gpus"] for p in pipes)
        pipes[0]["gpus"] += -gpus % 8  # whole nodes
        gpu = str(rng.choice(["h100", "h100", "h20"]))
        spec = {"version": 1, "cluster": {"gpus": gpus + (-gpus % 8), "gpu": gpu, "gpus_per_node": 8},
                "pipelines": pipes}
        out.append((f"m{i}", spec))
    return out


def _run(job: tuple) -> dict:
    """One (mix, policy) in this process: a summary, or why the policy could not run it."""
    name, spec, policy = job
    from jigsaw_plugin.errors import SpecError
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.sim import Simulation
    from jigsaw_plugin.workload import parse_workload

    try:
        r = Simulation(parse_workload(spec, base_dir=EXAMPLES), get_policy(policy), 0).run()
    except SpecError as e:
        return {"mix": name, "policy": policy, "error": str(e)}
    return {"mix": name, "policy": policy, "makespan_s": r["makespan_s"], "bounds": r["bounds"],
            "effective_utilisation": r["effective_utilisation"],
            "max_staleness": max(p["max_staleness"] for p in r["pipelines"].values())}


def measure(seed: int, n: int) -> dict:
    drawn = mixes(seed, n)
    jobs = [(name, spec, pol) for name, spec in drawn for pol in POLICIES]
    with ProcessPoolExecutor(max_workers=2, max_tasks_per_child=1) as ex:
        runs = list(ex.map(_run, jobs))
    return {"seed": seed, "steps": STEPS, "mixes": {name: spec for name, spec in drawn}, "runs": runs}


def _describe(spec: dict) -> str:
    parts = []
    for p in spec["pipelines"]:
        mode = "sync" if p.get("mode", "sync") == "sync" else f"async{p.get('staleness', 1)}"
        parts.append(f"{p['name'].rsplit('-', 1)[0]} {mode} {p['gpus']}")  # the bundled pipeline it copies
    return "; ".join(parts)


def section(data: dict, load_before: str, load_after: str) -> str:
    by = {}
    for r in data["runs"]:
        by.setdefault(r["mix"], {})[r["policy"]] = r
    rows, on_ratios, all_ratios, losses = [], [], [], []
    for name, spec in data["mixes"].items():
        runs = by[name]
        j = runs["jigsaw"]
        cells = []
        for pol in POLICIES[1:]:
            r = runs[pol]
            cells.append(f"{r['makespan_s']:.0f}" if "makespan_s" in r else "n/a")
        ok = {p: runs[p]["makespan_s"] for p in POLICIES[1:] if "makespan_s" in runs[p]}
        on = {p: m for p, m in ok.items() if p in ON_POLICY}
        best_on = min(on.values())
        best_all = min(ok, key=ok.get)
        on_ratios.append(best_on / j["makespan_s"])
        all_ratios.append(ok[best_all] / j["makespan_s"])
        ahead = [f"{p} {m:.0f} s" for p, m in ok.items() if m < j["makespan_s"]]
        if ahead:
            losses.append(f"{name} (jigsaw {j['makespan_s']:.0f} s): " + ", ".join(ahead))
        lb = j["bounds"]["makespan_lower_bound_s"]
        base = runs["verl-sync"]["makespan_s"]
        gap = (base - j["makespan_s"]) / (base - lb) if base > lb else None
        rows.append([name, f"{spec['cluster']['gpus']} {spec['cluster']['gpu'].upper()}", _describe(spec),
                     f"{lb:.0f}", *cells, f"{j['makespan_s']:.0f}", f"{best_on / j['makespan_s']:.2f}x",
                     f"{ok[best_all] / j['makespan_s']:.2f}x ({best_all})", "-" if gap is None else f"{gap:.0%}",
                     f"{j['effective_utilisation']:.2f}"])
    head = ["mix", "pool", "pipelines (bundled pipeline, mode, GPUs)", "lower bound s",
            *[f"{p} s" for p in POLICIES[1:]], "jigsaw s", "jigsaw vs best on-policy", "jigsaw vs best of all",
            "gap recovered (vs verl-sync)", "jigsaw effective utilisation"]
    summary = (f"jigsaw against the best on-policy baseline: median {statistics.median(on_ratios):.2f}x, "
               f"lowest {min(on_ratios):.2f}x, highest {max(on_ratios):.2f}x over {len(on_ratios)} mixes; "
               f"against the best of all five: median {statistics.median(all_ratios):.2f}x, lowest "
               f"{min(all_ratios):.2f}x.")
    lost = ("Where a baseline finished first: " + "; ".join(losses) + ".") if losses else \
        "No baseline finished any mix before jigsaw."
    on_lost = [r for r in data["runs"] if r["policy"] in ON_POLICY and "makespan_s" in r
               and r["makespan_s"] < by[r["mix"]]["jigsaw"]["makespan_s"]]
    lost += (" No on-policy baseline finished a mix first." if not on_lost else
             f" On-policy baselines finished first on {len(on_lost)} (mix, policy) pairs.")
    return f"""## Random job mixes (`benchmarks/random_mixes.py`)

Mixes drawn at random (seed {data['seed']}) from the bundled pipelines: 2-5 pipelines, static
shares of 4, 8 or 16 GPUs, some pipelines switched between synchronous and asynchronous,
H100 or H20, {data['steps']} steps each; none was used to tune the policy. Seed 0, default
predictor, each run its own process. jigsaw, verl-sync and rollmux keep each pipeline's
staleness (verl-sync and rollmux run an asynchronous pipeline synchronously);
one-step-off, streamrl and areal run every pipeline at least one step off-policy, so the
lower bound (of jigsaw's run: each pipeline at its own staleness) does not bind them: a
synchronous agent whose turns wait minutes on sandboxes is chain-bound on-policy, while
one step off-policy overlaps its steps. "n/a": the baseline refuses the mix (a share too
small to split into rollout and training devices). Load average (1 / 5 / 15 min) before {load_before}, after {load_after}.

{md_table(head, rows)}

{summary} {lost}

`python benchmarks/random_mixes.py` (about {len(data['runs']) * 2 // 60 + 1} minutes on 2 cores)
"""


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} / {five:.1f} / {fifteen:.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mixes", type=int, default=16)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--no-doc", action="store_true", help="print the block; do not touch docs/benchmarks.md")
    ap.add_argument("--render", action="store_true", help="re-render the saved results")
    args = ap.parse_args(argv)
    if args.render:
        data = json.loads(RESULTS.read_text())
        before, _, after = data.get("load", "- -> -").partition(" -> ")
    else:
        before = _load()
        data = measure(args.seed, args.mixes)
        after = _load()
        data["load"] = f"{before} -> {after}"
        if not args.no_doc:
            dump(data, RESULTS)
    text = section(data, before, after)
    print(text)
    if not args.no_doc:
        write_doc_block(BLOCK, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
