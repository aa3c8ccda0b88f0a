"""Training state on the host (``pipelines[i].train_offload``): what it costs a run, and the
mixes it opens to the disaggregated baselines.

1. Bundled (d) (1.5B, 7B and 32B on 32 H100) with every pipeline's ``train_offload`` set
   to ``none``, ``optimizer`` and ``full``: jigsaw and verl-sync makespans, side by side.
   Offload lowers the fewest devices an update fits on and makes each update slower.
2. The synthetic mixes (``random_mixes.synthetic_mixes``, seed 0) that a disaggregated
   baseline (one-step-off, streamrl, areal) refuses as drawn, because a pipeline's share
   cannot hold a rollout replica beside a trainer that holds its training state. Their
   ``offload`` variant sets ``train_offload: optimizer`` on each such pipeline (``full``
   where that is still too little), as a user of those systems on that share would; every
   policy runs both variants.

    python benchmarks/offload.py            # writes benchmarks/results/offload.json and the block
    python benchmarks/offload.py --no-doc --mixes 10
"""

from __future__ import annotations

import argparse
import copy
import statistics
from concurrent.futures import ProcessPoolExecutor

from common import EXAMPLES, ROOT, md_table
from random_mixes import OFF_POLICY, ON_POLICY, POLICIES, _describe, _run, measure_render_write, synthetic_mixes

RESULTS = ROOT / "benchmarks" / "results" / "offload.json"
BLOCK = "offload"
BUNDLED = "d_hetero_32gpu"
MODES = ("none", "optimizer", "full")


def offloaded(spec: dict) -> tuple[dict, list]:
    """``spec`` with ``train_offload`` on each pipeline whose share is too small for a
    disaggregated baseline (a rollout replica beside a trainer that holds the training
    state: ``estimates.split_rollout_sizes``): ``optimizer``, else ``full``; and what was set."""
    from jigsaw_plugin.core.pipelines import build_pipelines
    from jigsaw_plugin.costmodel import CostModel, hardware_profile, with_train_offload
    from jigsaw_plugin.scheduler.estimates import rollout_tp, split_rollout_sizes
    from jigsaw_plugin.workload import parse_workload

    cost = CostModel.for_nodes(hardware_profile(spec["cluster"]["gpu"]), spec["cluster"]["gpus_per_node"])
    out, changed = copy.deepcopy(spec), []
    for p, run in zip(out["pipelines"], build_pipelines(parse_workload(spec, base_dir=EXAMPLES))):
        tp = rollout_tp(run, cost)
        fits = {o: bool(split_rollout_sizes(tp, with_train_offload(run.model, o), cost, p["gpus"]))
                for o in ("none", "optimizer")}
        if fits["none"]:
            continue
        p["train_offload"] = "optimizer" if fits["optimizer"] else "full"
        changed.append(f"{p['name']}: {p['train_offload']}")
    return out, changed


def _bundled(offload: str) -> dict:
    import yaml

    spec = yaml.safe_load((EXAMPLES / f"{BUNDLED}.yaml").read_text())
    for p in spec["pipelines"]:
        p["train_offload"] = offload
    return spec


def measure(seed: int, n: int) -> dict:
    refused = []
    for name, spec in synthetic_mixes(seed, n):
        variant, changed = offloaded(spec)
        if changed:
            refused.append((name, spec, variant, changed))
    jobs = [(f"{BUNDLED}:{o}", _bundled(o), pol) for o in MODES for pol in ("jigsaw", "verl-sync")]
    for name, spec, variant, _ in refused:
        jobs += [(name, spec, pol) for pol in POLICIES] + [(f"{name}:offload", variant, pol) for pol in POLICIES]
    with ProcessPoolExecutor(max_workers=2, max_tasks_per_child=1) as ex:
        runs = list(ex.map(_run, jobs))
    return {"seed": seed, "mixes_drawn": n, "runs": runs,
            "mixes": {name: {"spec": spec, "offload": variant, "changed": changed}
                      for name, spec, variant, changed in refused}}


def _cell(r: dict) -> str:
    return f"{r['makespan_s']:.0f}" if "makespan_s" in r else "n/a"


def section(data: dict, load_before: str, load_after: str) -> str:
    by = {}
    for r in data["runs"]:
        by.setdefault(r["mix"], {})[r["policy"]] = r
    rows = []
    for o in MODES:
        runs = by[f"{BUNDLED}:{o}"]
        j, v = runs["jigsaw"], runs["verl-sync"]
        base_j, base_v = by[f"{BUNDLED}:none"]["jigsaw"], by[f"{BUNDLED}:none"]["verl-sync"]
        rows.append([o, _cell(v), f"{v['makespan_s'] / base_v['makespan_s']:.2f}", _cell(j),
                     f"{j['makespan_s'] / base_j['makespan_s']:.2f}", f"{v['makespan_s'] / j['makespan_s']:.2f}x",
                     f"{j['bounds']['makespan_lower_bound_s']:.0f}"])
    bundled = md_table(["train_offload (every pipeline)", "verl-sync s", "vs none", "jigsaw s", "vs none",
                        "jigsaw / verl-sync", "lower bound s"], rows)
    mix_rows, on_ratios, all_ratios, still = [], [], [], {}
    for name, m in data["mixes"].items():
        drawn, off = by[name], by[f"{name}:offload"]
        cells = [f"{_cell(drawn[p])} / {_cell(off[p])}" for p in POLICIES]
        ok = {p: off[p]["makespan_s"] for p in POLICIES[1:] if "makespan_s" in off[p]}
        j = off["jigsaw"]["makespan_s"]
        best_on = min(ok[p] for p in ON_POLICY if p in ok)
        best_all = min(ok, key=ok.get)
        on_ratios.append(best_on / j)
        all_ratios.append(ok[best_all] / j)
        for p in OFF_POLICY:
            if "makespan_s" not in off[p]:
                still.setdefault(p, []).append(name)
        spec = m["spec"]
        bounds = [drawn["jigsaw"]["bounds"], off["jigsaw"]["bounds"]]
        mix_rows.append([name, f"{spec['cluster']['gpus']} {spec['cluster']['gpu'].upper()}", _describe(spec),
                         "; ".join(m["changed"]),
                         " / ".join(f"{b['makespan_lower_bound_s']:.0f}" for b in bounds), *cells,
                         f"{best_on / j:.2f}x", f"{ok[best_all] / j:.2f}x ({best_all})"])
    mixes = md_table(["mix", "pool", "pipelines (model-algorithm, mode, GPUs)", "offloaded",
                      "lower bound s (drawn / offload)", *[f"{p} s (drawn / offload)" for p in POLICIES],
                      "offload: jigsaw vs best on-policy", "offload: jigsaw vs best of all"], mix_rows)
    n = len(data["mixes"])
    ran = {p: sum("makespan_s" in by[f"{m}:offload"][p] for m in data["mixes"]) for p in OFF_POLICY}
    summary = (f"{n} of the {data['mixes_drawn']} mixes drawn have a pipeline whose share is too small for a "
               f"disaggregated baseline. With offload, " + ", ".join(f"{p} runs {k}" for p, k in ran.items()) +
               f" of them. jigsaw (offload variant) against the best on-policy baseline: median "
               f"{statistics.median(on_ratios):.2f}x (lowest {min(on_ratios):.2f}x); against the best of all five, "
               f"the off-policy systems included: median {statistics.median(all_ratios):.2f}x (lowest "
               f"{min(all_ratios):.2f}x).") if n else "No drawn mix needed offload."
    if still:
        summary += " Still refused with offload: " + "; ".join(f"{p}: {', '.join(m)}" for p, m in still.items()) + "."
    return f"""## Training state on the host (`benchmarks/offload.py`)

`pipelines[i].train_offload` (docs/workload.md): `optimizer` keeps the fp32 master weights
and Adam's moments on the host and steps there (OpenRLHF's `--ds.adam_offload`); `full`
keeps weights, gradients and optimizer there and streams them to the gang for each pass
(verl's FSDP2 `offload_policy`). Each lowers the fewest devices an update fits on and adds
host time to it (docs/calibration.md, "Host offload"; the host's Adam rate is measured on
this machine for the `cpu` profile and set for GPU hosts). Simulated, seed 0, default
predictor, each run its own process. Load average (1 / 5 / 15 min) before {load_before},
after {load_after}.

**Bundled (d), every pipeline offloaded.** What turning offload on costs where it is not
needed: each update is slower; jigsaw may also start narrower gangs.

{bundled}

**Synthetic mixes a disaggregated baseline refuses as drawn** (`random_mixes.py --synthetic`,
seed {data['seed']}): each pipeline whose share cannot hold a rollout replica beside a
trainer that holds its state gets `optimizer` offload (`full` where that is still too
little), as a user of those systems on that share would set; every policy runs the mix as
drawn and with offload ("n/a": refused). jigsaw and the on-policy baselines could run the
drawn mixes already; with offload they pay its host time too.

{mixes}

{summary}

`python benchmarks/offload.py` ({data.get('wall_s', 0) / 60:.0f} minutes on 2 cores)
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mixes", type=int, default=60, help="synthetic mixes to draw (seed 0)")
    ap.add_argument("--no-doc", action="store_true", help="print the block; do not touch docs/benchmarks.md")
    ap.add_argument("--render", action="store_true", help="re-render the saved results")
    args = ap.parse_args(argv)
    return measure_render_write(RESULTS, BLOCK, lambda: measure(0, args.mixes), section, args.render, args.no_doc)


if __name__ == "__main__":
    raise SystemExit(main())
