"""Each jigsaw mechanism switched off on its own (or on, where it is off by default) on the
long-tail and agentic workloads (e) and (f), and the oracle predictor against the default.

    python3 benchmarks/ablations_ef.py            # every run, then the block
    python3 benchmarks/ablations_ef.py --render   # the block from the saved runs
    python3 benchmarks/ablations_ef.py --quick    # (e) alone, nothing written
    python3 benchmarks/ablations_ef.py --defaults  # only jigsaw's default and oracle runs
    python3 benchmarks/ablations_ef.py --add NAME[,NAME]  # only these mechanisms' runs (newly
                                                  # added, or their rules changed), the rest saved

(a)-(d) have their ablation table in the policies section (benchmarks/policies.py); this is
the same table for the two workloads of the regime JigsawRL reports on, with the makespan
and the gap to the makespan lower bound each run recovers against verl-sync (a run's
bound is a function of its samples and the cost model, not of its policy: each run is set
against its own). The mechanisms are `jigsaw bench --ablate`'s (``bench.ab``). Seed 0,
each run its own process, two at a time. Writes the block ``ablations-ef`` of
docs/benchmarks.md and the runs' figures to benchmarks/results/ablations_ef.json.
"""

from __future__ import annotations

import json
import sys

from common import ROOT, md_table, measure_and_write, run_many

sys.path.insert(0, str(ROOT))
from jigsaw_plugin.bench import ab  # noqa: E402
from jigsaw_plugin.bench.bundled import benchmark_workload  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "ablations_ef.json"
BLOCK = "ablations-ef"
KEYS = ("e", "f")
ABLATIONS = ab.ABLATIONS + ab.OFF_BY_DEFAULT
ORACLE = "ORACLE lengths"


def _label(a: str) -> str:
    return f"with {a}" if a in ab.OFF_BY_DEFAULT else f"no {a}"


def _runs(key: str) -> list:
    """(row label, job) of one workload: verl-sync, jigsaw's defaults, each ablation, the oracle."""
    f = benchmark_workload(key).file
    return ([("verl-sync", (f, "verl-sync", None, 0)), ("jigsaw (defaults)", (f, "jigsaw", None, 0))]
            + [(_label(a), (f, "jigsaw", ab.ablation_options("jigsaw", [a]), 0)) for a in ABLATIONS]
            + [(ORACLE, (f, "jigsaw", None, 0, "oracle"))])


def _summary(r: dict) -> dict:
    return {"makespan_s": r["makespan_s"], "lower_bound_s": r["bounds"]["makespan_lower_bound_s"],
            "samples_per_s": r["samples_per_s"], "wall_s": r["wall_s"]}


def measure(keys) -> dict:
    labelled = [(k, label, job) for k in keys for label, job in _runs(k)]
    out = run_many([job for _, _, job in labelled])
    data: dict = {}
    for (k, label, _), r in zip(labelled, out):
        data.setdefault(k, {})[label] = _summary(r)
    return data


def add(names: str) -> dict:
    """The saved runs with the named mechanisms' runs (``--ablate`` names) run again or for
    the first time; every other run is the saved one."""
    wanted = set(names.split(","))
    unknown = sorted(wanted - set(ABLATIONS))
    if unknown:
        raise SystemExit(f"--add: {', '.join(unknown)} is not one of {', '.join(ABLATIONS)}")
    return _rerun({_label(a) for a in wanted})


def _rerun(labels: set) -> dict:
    """The saved runs with the rows ``labels`` run again (or for the first time)."""
    data = json.loads(OUT.read_text())
    picked = [(k, label, job) for k in KEYS for label, job in _runs(k) if label in labels]
    for (k, label, _), r in zip(picked, run_many([job for _, _, job in picked])):
        data[k][label] = _summary(r)
    return data


def _gap(base: dict, run: dict) -> float | None:
    """The share of the gap between verl-sync's makespan and ``run``'s lower bound that
    ``run`` recovers."""
    return ab.gap_share(base["makespan_s"], run["makespan_s"], run["lower_bound_s"])


def _cell(base: dict, ref: dict, run: dict) -> str:
    g = _gap(base, run)
    change = run["makespan_s"] / ref["makespan_s"] - 1
    return f"{run['makespan_s']:.1f} ({change:+.1%}) / {'-' if g is None else format(g, '.0%')}"


def render(data: dict) -> str:
    keys = [k for k in KEYS if k in data]
    labels = [label for label, _ in _runs(keys[0])][1:]
    rows = [[label] + [_cell(data[k]["verl-sync"], data[k]["jigsaw (defaults)"], data[k][label]) for k in keys]
            for label in labels]
    lines = []
    for k in keys:
        # what the mechanism's default buys: the run with it flipped is that much slower (a
        # mechanism on by default that pays; one off by default that would cost)
        worth = sorted(((data[k][label]["makespan_s"] / data[k]["jigsaw (defaults)"]["makespan_s"] - 1, label)
                        for label in labels[1:-1]), reverse=True)
        pays = [f"{label} {c:+.1%}" for c, label in worth if c > 0.005 and label.startswith("no ")][:6]
        held = [f"{label} {c:+.1%}" for c, label in worth if c > 0.005 and label.startswith("with ")]
        costs = [f"{label} {c:+.1%}" for c, label in reversed(worth) if c < -0.005][:6]
        lines.append(f"* ({k}): on by default and paying over 0.5% (the run without it is slower): "
                     f"{', '.join(pays) or 'none'}; off by default and rightly so (the run with it is slower by "
                     f"over 0.5%): {', '.join(held) or 'none'}; a default that costs over 0.5% here (the run with "
                     f"it flipped is faster): {', '.join(costs) or 'none'}.")
    verl = ", ".join(f"({k}) {data[k]['verl-sync']['makespan_s']:.1f} s" for k in keys)
    head = ["mechanism"] + [f"({k}) makespan s (vs defaults) / gap recovered" for k in keys]
    return f"""## Ablations on the long-tail and agentic workloads (`benchmarks/ablations_ef.py`)

jigsaw on (e) and (f) with one mechanism switched off, or on where it is off by default
("with ..."), as in the ablation table of (a)-(d) above; the last row is the oracle
ablation (true remaining lengths instead of the predictor). Each cell: the makespan, its
change against jigsaw's defaults, and the gap between verl-sync's makespan ({verl}) and
the run's makespan lower bound that it recovers (target 70%). Simulated, seed 0, default
predictor, each run its own process.

{md_table(head, rows)}

{chr(10).join(lines)}

`python benchmarks/ablations_ef.py`
"""


def main() -> None:
    if "--add" in sys.argv:  # measured as the full table is, and saved and written the same way
        names = sys.argv[sys.argv.index("--add") + 1]
        measure_and_write(BLOCK, OUT, lambda _keys: add(names), render, KEYS, ("e",))
        return
    if "--defaults" in sys.argv:  # jigsaw's default and oracle runs alone, after a default changed
        measure_and_write(BLOCK, OUT, lambda _keys: _rerun({"jigsaw (defaults)", ORACLE}), render, KEYS, ("e",))
        return
    measure_and_write(BLOCK, OUT, measure, render, KEYS, ("e",))


if __name__ == "__main__":
    main()
