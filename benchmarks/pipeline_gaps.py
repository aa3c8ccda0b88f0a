"""Where each pipeline's device-seconds above its ideal go, on the bundled workloads (a)-(f):
verl-sync and jigsaw (default options, default predictor), seed 0 (``gap_breakdown`` ->
``pipelines`` in every result JSON, ``core/bounds.py``). Writes the ``pipeline-gaps`` block
of docs/benchmarks.md and benchmarks/results/pipeline_gaps.json.

    python benchmarks/pipeline_gaps.py            # 12 runs, about 3 minutes on 2 cores
    python benchmarks/pipeline_gaps.py --render   # re-render the saved results
    python benchmarks/pipeline_gaps.py --quick    # (c) only, nothing written
"""

from __future__ import annotations

from common import BUNDLED, ROOT, md_table, measure_and_write, run_many

POLICIES = ("verl-sync", "jigsaw")
OUT = ROOT / "benchmarks" / "results" / "pipeline_gaps.json"


def _summary(r: dict) -> dict:
    g = r["gap_breakdown"]
    return {"makespan_s": r["makespan_s"], "gap_breakdown": {k: g[k] for k in ("gap_device_s", "idle_device_s",
                                                                               "pipelines")}}


def measure(keys: tuple) -> dict:
    """{workload key: [verl-sync's summary, jigsaw's]}, in the order of ``keys``."""
    runs = run_many([(BUNDLED[k], pol, None, 0) for k in keys for pol in POLICIES])
    return {k: [_summary(r) for r in runs[i * len(POLICIES):(i + 1) * len(POLICIES)]] for i, k in enumerate(keys)}


def _times(held: float, ideal: float) -> str:
    """Device-seconds held as a multiple of the ideal."""
    return f"{held / ideal:.2f}x" if ideal > 0 else "-"


def _share(part: float, gap: float) -> str:
    return f"{part / gap:.0%}" if gap > 0 else "-"


def rows(key: str, base: dict, ours: dict) -> list:
    """One row per pipeline of workload ``key``: its ideal device-seconds (rollout,
    training), each policy's rollout as a multiple of its ideal, jigsaw's training as one,
    and jigsaw's device-seconds above the pipeline's ideal as a share of the run's gap."""
    mine, theirs = ours["gap_breakdown"]["pipelines"], base["gap_breakdown"]["pipelines"]
    gap = ours["gap_breakdown"]["gap_device_s"]
    out = []
    for name, own in mine.items():
        other = theirs[name]
        above = own["rollout_above_ideal_device_s"] + own["training_above_ideal_device_s"]
        out.append([f"({key})", name, f"{own['ideal_rollout_device_s']:.0f} / {own['ideal_training_device_s']:.0f}",
                    _times(other["rollout_device_s"], other["ideal_rollout_device_s"]),
                    _times(own["rollout_device_s"], own["ideal_rollout_device_s"]),
                    _times(own["training_device_s"], own["ideal_training_device_s"]),
                    f"{own['rollout_above_ideal_device_s']:.0f} ({_share(own['rollout_above_ideal_device_s'], gap)})",
                    f"{above:.0f} ({_share(above, gap)})"])
    return out


def largest(results: dict) -> list:
    """Per workload: the pipeline whose device-seconds above its ideal under jigsaw are the
    most, and their share of the run's gap."""
    out = []
    for key, (_, ours) in results.items():
        g = ours["gap_breakdown"]
        above = {n: v["rollout_above_ideal_device_s"] + v["training_above_ideal_device_s"]
                 for n, v in g["pipelines"].items()}
        name = max(above, key=above.get)
        out.append(f"({key}) {name} {_share(above[name], g['gap_device_s'])}")
    return out


def render(results: dict) -> str:
    table = [row for key, (base, ours) in results.items() for row in rows(key, base, ours)]
    idle = ", ".join(f"({key}) {_share(ours['gap_breakdown']['idle_device_s'], ours['gap_breakdown']['gap_device_s'])}"
                     for key, (_, ours) in results.items())
    return (
        "## Where each pipeline's device-seconds go (`benchmarks/pipeline_gaps.py`)\n\n"
        "The gap breakdown above split by pipeline (`gap_breakdown.pipelines` in every result JSON): each "
        "pipeline's rollout replicas and training-side passes, in device-seconds, against its own part of the "
        "ideal (decode at the largest batch, prefill once, passes at their compute on their cheapest gang and "
        "their fixed cost on the fewest devices: `Bounds.pipelines`, a floor on that pipeline's device-seconds "
        "in any run without co-location, tested on every bundled workload). Simulated, seed 0, the default "
        "predictor; \"x\": device-seconds held over the ideal; the last two columns are jigsaw's device-seconds "
        "above the pipeline's ideal (its rollout, and its rollout and training together) and their share of the run's "
        "whole gap (`gpus x makespan - ideal`; the rest is idle devices and weight syncs).\n\n"
        + md_table(["workload", "pipeline", "ideal device-s rollout / training", "verl-sync rollout",
                    "jigsaw rollout", "jigsaw training", "jigsaw rollout above ideal device-s (share of gap)",
                    "jigsaw above ideal device-s (share of gap)"], table)
        + "\n\nThe pipeline holding the most of jigsaw's gap: " + "; ".join(largest(results))
        + f". Idle devices' share of jigsaw's gap: {idle}.\n\n"
        "`python benchmarks/pipeline_gaps.py`\n")


def main() -> None:
    measure_and_write("pipeline-gaps", OUT, measure, render, tuple(BUNDLED), ("c",))


if __name__ == "__main__":
    main()
