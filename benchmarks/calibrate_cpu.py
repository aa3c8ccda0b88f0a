"""Fit the cost model's factors for the ``cpu`` profile to a real run (``--backend ray``).

The GPU fit (calibrate.py) prices fixed costs of verl on H20s (a 3 s weight-sync barrier,
2 s per training stage, 0.5 s of driver-side advantages) that a 0.8M-parameter model on
one CPU core does not have, so the simulator's absolute rate for the CPU A/B was far off.
This fits the ``cpu`` entry of ``HARDWARE_FACTORS`` to the stage times measured under
verl-sync (one pipeline per core, nothing shared) in ``benchmarks/results/real_ab_bench.json``
(written by real_ab.py):

- ``train_stage_overhead_s``: fixed at 0.05 s (a Ray call, pinning, collation);
- ``forward_mfu`` / ``train_mfu``: closed form from old_log_prob+ref and update_actor
  (relative to the profile's 0.05 TFLOP/s bf16 core; the trainer runs float32 GEMMs,
  about 130 GFLOP/s on one core here, so values above 1 are expected);
- ``sync_overhead_s``, ``adv_s``: the measured means;
- ``decode_step_overhead_s``: bisection until the simulated gen stage matches.

    python benchmarks/calibrate_cpu.py           # print the fitted factors
    python benchmarks/calibrate_cpu.py --check   # simulated vs measured with the current factors
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jigsaw_plugin.costmodel import EfficiencyFactors, hardware_profile  # noqa: E402
from jigsaw_plugin.costmodel.predictor import default_factors  # noqa: E402
from jigsaw_plugin.scheduler import get_policy  # noqa: E402
from jigsaw_plugin.sim import Simulation  # noqa: E402
from jigsaw_plugin.workload import parse_workload  # noqa: E402

BENCH = ROOT / "benchmarks" / "results" / "real_ab_bench.json"
STAGES = ("gen", "old_log_prob", "ref", "adv", "update_actor", "weight_sync")


def measured(bench: dict) -> dict:
    """Mean stage seconds over the pipelines of the baseline's median run."""
    per = bench["baseline"]["pipelines"].values()
    return {s: statistics.mean(p["stage_s"][s] for p in per) for s in STAGES}


def simulate(bench: dict, factors: EfficiencyFactors, policy: str = "verl-sync") -> dict:
    wl = parse_workload(bench["workload_spec"])
    r = Simulation(wl, get_policy(policy), 0, factors=factors).run()
    per = r["pipelines"].values()
    out = {s: statistics.mean(p["stage_s"][s] for p in per) for s in STAGES}
    out["samples_per_s"] = r["samples_per_s"]
    return out


def fit(bench: dict) -> EfficiencyFactors:
    m = measured(bench)
    base = dataclasses.replace(default_factors(hardware_profile("cpu")), train_stage_overhead_s=0.05,
                               forward_mfu=1.0, train_mfu=1.0, sync_overhead_s=m["weight_sync"], adv_s=m["adv"])
    s = simulate(bench, base)  # work at mfu 1 = simulated - overhead
    o = base.train_stage_overhead_s
    fwd_meas = (m["old_log_prob"] + m["ref"]) / 2
    fwd_sim = (s["old_log_prob"] + s["ref"]) / 2
    f = dataclasses.replace(base, forward_mfu=round((fwd_sim - o) / (fwd_meas - o), 3),
                            train_mfu=round((s["update_actor"] - o) / (m["update_actor"] - o), 3))
    lo, hi = 0.0, 0.05
    for _ in range(30):  # the simulated gen time grows with the per-step overhead
        mid = (lo + hi) / 2
        if simulate(bench, dataclasses.replace(f, decode_step_overhead_s=mid))["gen"] < m["gen"]:
            lo = mid
        else:
            hi = mid
    return dataclasses.replace(f, decode_step_overhead_s=round((lo + hi) / 2, 5))


def check(bench: dict, factors: EfficiencyFactors) -> str:
    m, s = measured(bench), simulate(bench, factors)
    rows = ["| stage (mean s per step) | measured (verl-sync, real) | simulated | error |", "|---|---|---|---|"]
    for k in STAGES:
        err = (s[k] - m[k]) / m[k] * 100 if m[k] > 1e-3 else float("nan")
        rows.append(f"| {k} | {m[k]:.3f} | {s[k]:.3f} | {err:+.0f}% |")
    rows.append(f"| samples/s | {bench['baseline']['samples_per_s']:.2f} | {s['samples_per_s']:.2f} | "
                f"{(s['samples_per_s'] / bench['baseline']['samples_per_s'] - 1) * 100:+.0f}% |")
    return "\n".join(rows)


def main() -> None:
    path = Path(sys.argv[-1]) if len(sys.argv) > 1 and sys.argv[-1].endswith(".json") else BENCH
    bench = json.loads(path.read_text())
    if "--check" in sys.argv:
        print(check(bench, default_factors(hardware_profile("cpu"))))
        return
    f = fit(bench)
    changed = {k: v for k, v in dataclasses.asdict(f).items() if v != getattr(EfficiencyFactors(), k)}
    print("cpu factors:", changed)
    print(check(bench, f))


if __name__ == "__main__":
    main()
