"""What issue 12's gap target would take on each bundled workload, from the saved runs.

    python benchmarks/target_gap.py            # render from the saved runs, write the block
    python benchmarks/target_gap.py --print    # print the block, write nothing

A run's devices x makespan is its ideal device-seconds (the bound's work, `core/bounds.py`)
plus its gap (device-seconds above the ideal: idle devices, rollout replicas above the ideal
decode and prefill, training passes above their compute and fixed cost on the fewest
devices, weight syncs). Recovering a share ``r`` of the gap between verl-sync's makespan
``V`` and the makespan lower bound ``B`` means a makespan of ``V - r (V - B)``, so a gap of
at most ``devices x (V - r (V - B)) - ideal``. The block sets that beside jigsaw's gap now,
and the cut it asks beside each part of the gap: a cut larger than all of one part needs the
others too. Beside it, two envelopes already measured: the knob block's in-sample best
combination (the knobs each set where it helped that workload, on that workload) and
jigsaw with the simulator's true remaining lengths (the ORACLE row of the ablation tables).

Reads benchmarks/results/pipeline_gaps.json (verl-sync's and jigsaw's runs at seed 0 with
their gap breakdowns: `benchmarks/pipeline_gaps.py`), seeds.json (each seed's bound:
`benchmarks/seeds.py`), knobs.json (`benchmarks/knobs.py`), policies.json and
ablations_ef.json (the ORACLE runs: `benchmarks/policies.py`, `benchmarks/ablations_ef.py`);
simulates nothing. Writes the block ``target-gap`` of docs/benchmarks.md.
"""

from __future__ import annotations

import json
import sys

from common import ROOT, load, md_table, write_doc_block

from jigsaw_plugin.bench.ab import gap_share
from jigsaw_plugin.bench.bundled import benchmark_workload

__all__ = ["TARGET", "needs", "render"]

RESULTS = ROOT / "benchmarks" / "results"
BLOCK = "target-gap"
TARGET = 0.70  # issue 12: the share of the gap between verl-sync and the bound to recover
KEYS = ("a", "b", "c", "d", "e", "f")


def needs(devices: int, verl_s: float, bound_s: float, makespan_s: float, parts: dict,
          target: float = TARGET) -> dict:
    """What recovering ``target`` of the gap takes for one run: ``parts`` its gap in
    device-seconds by kind (idle, rollout, training, sync: they sum to the gap)."""
    gap = sum(parts.values())
    ideal = devices * makespan_s - gap
    goal_s = verl_s - target * (verl_s - bound_s)
    allowed = devices * goal_s - ideal
    return {"ideal_device_s": ideal, "gap_device_s": gap, "goal_makespan_s": goal_s,
            "allowed_gap_device_s": allowed, "cut_device_s": max(0.0, gap - allowed),
            "recovered": gap_share(verl_s, makespan_s, bound_s)}


def _parts(gap_breakdown: dict) -> dict:
    pipes = gap_breakdown["pipelines"].values()
    return {"idle": gap_breakdown["idle_device_s"],
            "rollout": sum(p["rollout_above_ideal_device_s"] for p in pipes),
            "training": sum(p["training_above_ideal_device_s"] for p in pipes),
            "sync": sum(p["weight_sync_device_s"] for p in pipes)}


def _oracle_makespans() -> dict:
    """Key -> jigsaw's makespan with the true remaining lengths, where a block saved it: the
    (a)-(d) policy tables' runs (policies.json, a list of result JSONs) and the (e), (f)
    ablation block's row "ORACLE lengths"."""
    out = {}
    files = {f: k for k, f in ((k, benchmark_workload(k).file) for k in KEYS)}
    policies = RESULTS / "policies.json"
    if policies.exists():
        for run in json.loads(policies.read_text()):
            key = files.get(str(run.get("workload", "")).rsplit("/", 1)[-1])
            if key and run.get("policy") == "jigsaw" and run["predictor"]["name"] == "oracle" and not run["options"]:
                out[key] = run["makespan_s"]
    ef = RESULTS / "ablations_ef.json"
    if ef.exists():
        for key, rows in json.loads(ef.read_text()).items():
            if "ORACLE lengths" in rows:
                out[key] = rows["ORACLE lengths"]["makespan_s"]
    return out


def gather() -> list:
    """One row of figures per bundled workload with saved runs."""
    gaps = json.loads((RESULTS / "pipeline_gaps.json").read_text())
    seeds = json.loads((RESULTS / "seeds.json").read_text())
    knobs = json.loads((RESULTS / "knobs.json").read_text()) if (RESULTS / "knobs.json").exists() else {}
    oracle = _oracle_makespans()
    rows = []
    for key in KEYS:
        if key not in gaps or key not in seeds:
            continue
        verl, jig = gaps[key]
        bound = seeds[key]["0"]["jigsaw"]["bound_s"]
        devices = load(benchmark_workload(key).file).cluster.gpus
        row = {"key": key, "devices": devices, "verl_s": verl["makespan_s"], "bound_s": bound,
               "makespan_s": jig["makespan_s"], "parts": _parts(jig["gap_breakdown"])}
        row.update(needs(devices, verl["makespan_s"], bound, jig["makespan_s"], row["parts"]))
        combined = (knobs.get(key) or {}).get("combined")
        row["knobs_recovered"] = gap_share(verl["makespan_s"], combined["makespan_s"], bound) if combined else None
        row["oracle_recovered"] = gap_share(verl["makespan_s"], oracle[key], bound) if key in oracle else None
        rows.append(row)
    return rows


def _pct(x) -> str:
    return "-" if x is None else f"{x:.0%}"


def render(rows: list) -> str:
    head = ["workload", "devices", "verl-sync s", "lower bound s", "jigsaw s", "gap recovered",
            f"makespan at {TARGET:.0%} s", "jigsaw's gap device-s", f"gap allowed at {TARGET:.0%}",
            "cut asked", "cut / idle", "cut / rollout above ideal", "cut / training above ideal",
            "knobs' in-sample best", "ORACLE lengths"]
    out = []
    for r in rows:
        p, cut = r["parts"], r["cut_device_s"]
        share = {k: (cut / v if v > 0 and cut > 0 else None) for k, v in p.items()}  # "-": nothing to cut
        out.append([f"({r['key']})", r["devices"], f"{r['verl_s']:.0f}", f"{r['bound_s']:.0f}",
                    f"{r['makespan_s']:.1f}", _pct(r["recovered"]), f"{r['goal_makespan_s']:.0f}",
                    f"{r['gap_device_s']:,.0f}", f"{r['allowed_gap_device_s']:,.0f}", f"{cut:,.0f}",
                    _pct(share["idle"]), _pct(share["rollout"]), _pct(share["training"]),
                    _pct(r["knobs_recovered"]), _pct(r["oracle_recovered"])])
    short = [r for r in rows if r["cut_device_s"] > 0]
    over_idle = [f"({r['key']})" for r in short if r["cut_device_s"] > r["parts"]["idle"]]
    reading = (f"Reading: {len(short)} of {len(rows)} workloads are short of {TARGET:.0%}"
               + (f"; on {', '.join(over_idle)} the cut asked is more than all of the run's idle device-seconds, "
                  "so it must come out of the rollout's or the training's device-seconds above their ideal as "
                  "well" if over_idle else "")
               + ". The two envelopes say how far the policy's own levers reach: its knobs set per workload "
                 "in sample, and exact lengths instead of predicted ones.")
    return "\n".join([
        f"<!-- {BLOCK}:start -->",
        f"## What {TARGET:.0%} of the gap would take (`benchmarks/target_gap.py`)",
        "",
        "From the saved seed-0 runs (simulated, default predictor): a run's devices x makespan is "
        "its ideal device-seconds plus its gap, so recovering "
        f"{TARGET:.0%} of the gap between verl-sync and the makespan lower bound means a makespan of "
        f"verl-sync - {TARGET:.0%} x (verl-sync - bound) and a gap of at most devices x that - ideal. "
        "\"cut asked\": how far jigsaw's gap (`gap_breakdown`: idle, rollout above its ideal, training "
        "above its ideal, weight syncs) must fall, and how much of each part that is (\"-\": none asked). The "
        "envelopes' gap recovered: the knob block's in-sample best combination, and jigsaw with the true "
        "remaining lengths (ORACLE).",
        "",
        md_table(head, out),
        "",
        reading,
        "",
        "`python benchmarks/target_gap.py`",
        f"<!-- {BLOCK}:end -->",
    ])


def main(argv: list | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = render(gather())
    print(text)
    if "--print" not in argv:
        write_doc_block(BLOCK, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
