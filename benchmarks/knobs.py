"""How far the jigsaw policy's numeric knobs move it: each knob set one at a time to a
value on either side of its default, on each bundled workload, and the gap recovered
against the makespan lower bound before and after.

    python3 benchmarks/knobs.py            # (a), (c)-(f): measure, save, write the block
    python3 benchmarks/knobs.py --with-b   # (b) too (about 2 minutes a run on 2 cores)
    python3 benchmarks/knobs.py --render   # re-render the saved results
    python3 benchmarks/knobs.py --quick    # (e) only; print, write nothing

What it answers: whether the gap the policy leaves (issue 12's target: 70% of the gap
between verl-sync and the bound recovered) is a matter of its settings or of its
mechanisms. Each knob is moved alone (``KNOBS``); then, per workload, every knob that
made that workload faster is set at its best value together (the "combined" row). That
row is tuned on the workload it is measured on (an in-sample envelope, not a held-out
result): the defaults are not changed from it. Simulated, seed 0, the default predictor;
verl-sync beside each workload for the gap. Writes the block ``knobs`` of
docs/benchmarks.md and benchmarks/results/knobs.json.
"""

from __future__ import annotations

import sys

from common import ROOT, md_table, measure_and_write, run_many

sys.path.insert(0, str(ROOT))
from jigsaw_plugin.bench.ab import gap_share  # noqa: E402
from jigsaw_plugin.bench.bundled import benchmark_workload  # noqa: E402
from jigsaw_plugin.scheduler.jigsaw.config import JigsawConfig  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "knobs.json"
BLOCK = "knobs"
KEYS = ("a", "c", "d", "e", "f")
# knob -> values tried (one below and one above the default where both make sense)
KNOBS = {
    "latency_slack": (0.02, 0.2),
    "max_slack": (0.1, 0.5),
    "min_gain": (1.0, 4.0),
    "tail_requests": (16, 64),
    "widen_requests": (64, 256),
    "max_widen": (4,),
    "loan_margin": (1.0, 1.5),
    "spread_cost": (1.05, 1.3),
    "early_from": (0.25, 0.75),
    "home_wait": (0.0, 0.15),
    "width": (2, 8),
    "horizon_s": (150.0, 2400.0),
}
TARGET = 0.70


def _file(key: str) -> str:
    return benchmark_workload(key).file


def _slim(r: dict) -> dict:
    return {"makespan_s": r["makespan_s"], "bound_s": r["bounds"]["makespan_lower_bound_s"]}


def _settings() -> list[dict]:
    return [{}] + [{knob: v} for knob, values in KNOBS.items() for v in values]


def measure(keys) -> dict:
    settings = _settings()
    jobs = [(_file(k), "verl-sync", None, 0) for k in keys]
    jobs += [(_file(k), "jigsaw", s, 0) for k in keys for s in settings]
    runs = run_many(jobs)
    data: dict = {k: {"verl-sync": _slim(r), "jigsaw": []} for k, r in zip(keys, runs[:len(keys)])}
    at = len(keys)
    for k in keys:
        for s in settings:
            data[k]["jigsaw"].append({"options": s, **_slim(runs[at])})
            at += 1
    # per workload, every knob that made it faster at its best value, together
    combined = {k: _combined(data[k]["jigsaw"]) for k in keys}
    picked = [k for k in keys if combined[k]]
    for k, r in zip(picked, run_many([(_file(k), "jigsaw", combined[k], 0) for k in picked])):
        data[k]["combined"] = {"options": combined[k], **_slim(r)}
    return data


def _combined(runs: list) -> dict:
    """Each knob whose best tried value beat the defaults, at that value."""
    base = runs[0]["makespan_s"]
    best: dict = {}
    for r in runs[1:]:
        (knob, value), = r["options"].items()
        if r["makespan_s"] < base and (knob not in best or r["makespan_s"] < best[knob][1]):
            best[knob] = (value, r["makespan_s"])
    return {knob: v for knob, (v, _) in best.items()}


def _gap(verl: float, run: dict) -> float | None:
    return gap_share(verl, run["makespan_s"], run["bound_s"])


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _opts(o: dict) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in sorted(o.items())) or "defaults"


def render(data: dict) -> str:
    defaults = {f.name: f.default for f in JigsawConfig.__dataclass_fields__.values()}
    keys = list(data)
    rows, met_default, met_best, gains = [], [], [], {}
    for k in keys:
        verl = data[k]["verl-sync"]["makespan_s"]
        runs = data[k]["jigsaw"]
        base = runs[0]
        best = min(runs, key=lambda r: r["makespan_s"])
        comb = data[k].get("combined")
        top = max((g for g in (_gap(verl, r) for r in runs + ([comb] if comb else [])) if g is not None), default=0.0)
        rows.append([f"({k})", f"{verl:.0f}", f"{base['bound_s']:.0f}", f"{base['makespan_s']:.1f}",
                     _pct(_gap(verl, base)), f"{_opts(best['options'])}: {best['makespan_s']:.1f}",
                     _pct(_gap(verl, best)),
                     f"{_opts(comb['options'])}: {comb['makespan_s']:.1f}" if comb else "-",
                     _pct(_gap(verl, comb)) if comb else "-"])
        gains[k] = top
        (met_best if top >= TARGET else []).append(f"({k})")
        g0 = _gap(verl, base)
        if g0 is not None and g0 >= TARGET:
            met_default.append(f"({k})")
    head = ["workload", "verl-sync s", "lower bound s", "jigsaw (defaults) s", "gap recovered",
            "best single knob: s", "gap recovered", "combined (in-sample): s", "gap recovered"]
    grid_head = ["knob (default)", "value"] + [f"({k})" for k in keys]
    grid = []
    for knob, values in KNOBS.items():
        for v in values:
            row = [f"{knob} ({defaults[knob]:g})", f"{v:g}"]
            for k in keys:
                base = data[k]["jigsaw"][0]["makespan_s"]
                r = next(r for r in data[k]["jigsaw"] if r["options"] == {knob: v})
                row.append(f"{100 * (r['makespan_s'] / base - 1):+.1f}%")
            grid.append(row)
    changes = {(knob, v): [data[k]["jigsaw"][1 + i]["makespan_s"] / data[k]["jigsaw"][0]["makespan_s"] - 1
                           for k in keys]
               for i, (knob, v) in enumerate((knob, v) for knob, values in KNOBS.items() for v in values)}
    top = max(((abs(c), knob, k) for (knob, _), cs in changes.items() for k, c in zip(keys, cs)), default=None)
    split = sum(1 for cs in changes.values() if min(cs) < -1e-3 and max(cs) > 1e-3)
    # a knob whose every value tried makes a workload faster: that run moves with any
    # perturbation (the simulation is deterministic, but a small change early reorders
    # what follows), not with the setting
    either = {}
    for j, k in enumerate(keys):
        for knob, values in KNOBS.items():
            if len(values) > 1 and all(changes[(knob, v)][j] < -0.005 for v in values):
                either.setdefault(k, []).append(knob)
    lift = max(((gains[k] - _gap(data[k]["verl-sync"]["makespan_s"], data[k]["jigsaw"][0]), k)
                for k in keys if gains.get(k) is not None and _gap(data[k]["verl-sync"]["makespan_s"],
                                                                      data[k]["jigsaw"][0]) is not None),
               default=None)
    reading = (f"With its defaults jigsaw recovers at least {TARGET:.0%} of the gap on "
               f"{', '.join(met_default) or 'none of these'}; with the best of the settings tried, on "
               f"{', '.join(met_best) or 'none of these'}" +
               (f" (the best moves the gap recovered by {100 * lift[0]:.0f} points at most, on ({lift[1]}))"
                if lift else "") + ". " +
               (f"The largest move of one knob: {100 * top[0]:.1f}% ({top[1]} on ({top[2]})). " if top else "") +
               f"{split} of the {len(changes)} settings are faster on one workload and slower on another "
               f"(by over 0.1%). " +
               ("".join(f"On ({k}) both values tried of {', '.join(v)} are faster: a run that moves with any "
                        f"perturbation, not with those settings. " for k, v in either.items())) +
               "The switches (each mechanism off or on) are the ablation table's rows above.")
    return f"""## Knob sensitivity (`benchmarks/knobs.py`)

Each of the jigsaw policy's numeric knobs set alone to a value on either side of its default,
on each bundled workload (simulated, seed 0, the default predictor), and the gap recovered
against the makespan lower bound: (verl-sync - jigsaw) / (verl-sync - bound). "combined":
every knob that made that workload faster, at its best value, together: tuned on the
workload it is measured on, so an in-sample envelope of what settings alone reach, not a
result (the defaults are not changed from it). Target (issue 12): {TARGET:.0%} of the gap.
One seed: a change under about 1% can reverse at another (stop 73, a re-shard rule that
took the plan with the fewest device-seconds off the critical path: (b) -0.28%, +0.17%,
-0.25% at seeds 0, 1, 2; not kept).

{md_table(head, rows)}

Makespan change against the defaults, each knob alone (negative: faster):

{md_table(grid_head, grid)}

Reading: {reading}

`python benchmarks/knobs.py`
"""


def main() -> int:
    keys = KEYS + (("b",) if "--with-b" in sys.argv else ())
    measure_and_write(BLOCK, RESULTS, measure, render, keys, ("e",))
    return 0


if __name__ == "__main__":
    sys.exit(main())
