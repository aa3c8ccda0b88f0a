"""Fit the cost model's efficiency factors by least squares over public points (DESIGN.md 7).

Points (each with its source in docs/calibration.md):

- verl's one_step_off table (16 H20, Qwen2.5-Math-7B, DAPO, 20,480 max response, 512 x 16):
  colocated sync gen 321 s, old_log_prob 88 s, update_actor 286 s; one-step-off with 4
  generation / 12 training GPUs: step 520 s. Simulated here on
  examples/workloads/calibration_dapo7b_h20.yaml.
- the public vLLM and FSDP figures of ``jigsaw_plugin.costmodel.public_points``: batch-1
  decode latency (H100, A100), saturated decode throughput (H100), training tokens/s per
  GPU on gangs of 1 to 128 devices (A100, H200).

verl's fully_async documentation is never a point (it is the held-out check).

The residual of a point is log(predicted / published), every point weighted alike; the
fitted factors are ``FITTED``, searched in log space by Levenberg-Marquardt with
finite-difference Jacobians. Prints every point's residual as a Markdown table (pasted into
docs/calibration.md).

    python benchmarks/calibrate.py           # fit (a few minutes: every evaluation simulates)
    python benchmarks/calibrate.py --check   # residuals of the committed defaults
"""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jigsaw_plugin.costmodel import EfficiencyFactors  # noqa: E402
from jigsaw_plugin.costmodel.public_points import PUBLIC_POINTS, predict  # noqa: E402
from jigsaw_plugin.scheduler import get_policy  # noqa: E402
from jigsaw_plugin.sim import Simulation  # noqa: E402
from jigsaw_plugin.workload import load_workload  # noqa: E402

WORKLOAD = ROOT / "examples" / "workloads" / "calibration_dapo7b_h20.yaml"
#: verl docs, one_step_off_policy recipe (seconds).
VERL_TARGET = {"gen": 321.0, "old_log_prob": 88.0, "update_actor": 286.0, "one_step_off_step": 520.0}
VERL_SOURCE = "verl docs, one_step_off_policy recipe (16 H20, Qwen2.5-Math-7B, DAPO)"
# gen and one-step-off pull against each other (docs/calibration.md, "What the fit cannot close")
VERL_TOLERANCE = {"gen": 0.35, "old_log_prob": 0.15, "update_actor": 0.15, "one_step_off_step": 0.25}
#: The factors the fit moves; every other field keeps its default.
FITTED = ("decode_bw_eff", "decode_step_overhead_s", "decode_mfu", "forward_mfu", "train_mfu",
          "micro_batch_overhead_s", "link_eff")
_CAPPED_AT_ONE = {"decode_bw_eff", "decode_mfu", "forward_mfu", "train_mfu", "link_eff"}


def steady_step_s(sim) -> float:
    """Mean interval between successive update_actor ends (pipeline fill excluded)."""
    p = sim.pipelines[0]
    ends = sorted(s.stage_t["update_actor"][1] for s in p.steps.values() if "update_actor" in s.stage_t)
    return (ends[-1] - ends[0]) / (len(ends) - 1)


def measure_verl(factors: EfficiencyFactors, seed: int = 0) -> dict:
    wl = load_workload(WORKLOAD)
    sync = Simulation(wl, get_policy("verl-sync"), seed, factors=factors).run()
    stages = sync["pipelines"]["dapo-math-7b"]["stage_s"]
    off = Simulation(wl, get_policy("one-step-off", rollout_gpus=4), seed, factors=factors)
    off.run()
    return {"gen": stages["gen"], "old_log_prob": stages["old_log_prob"],
            "update_actor": stages["update_actor"], "one_step_off_step": steady_step_s(off),
            "sync_step": sync["pipelines"]["dapo-math-7b"]["mean_step_s"]}


def residuals(factors: EfficiencyFactors) -> tuple[np.ndarray, dict]:
    """log(predicted / published) at every point, and the predictions by point name."""
    got = {p.name: predict(p, factors) for p in PUBLIC_POINTS}
    verl = measure_verl(factors)
    got.update({f"verl-{k}": verl[k] for k in VERL_TARGET})
    got["verl-sync_step"] = verl["sync_step"]
    r = [math.log(got[p.name] / p.published) for p in PUBLIC_POINTS]
    r += [math.log(verl[k] / v) for k, v in VERL_TARGET.items()]
    return np.array(r), got


def _factors(x: np.ndarray, base: EfficiencyFactors) -> EfficiencyFactors:
    values = {k: float(np.exp(v)) for k, v in zip(FITTED, x)}
    values = {k: min(v, 1.0) if k in _CAPPED_AT_ONE else v for k, v in values.items()}
    return dataclasses.replace(base, **values)


def fit(base: EfficiencyFactors, iterations: int = 10) -> EfficiencyFactors:
    """Levenberg-Marquardt over log(factor), finite-difference Jacobian."""
    x = np.log([getattr(base, k) or 1e-4 for k in FITTED])
    r, _ = residuals(_factors(x, base))
    lam, h = 1e-2, 0.03
    for it in range(iterations):
        jac = np.empty((len(r), len(x)))
        for i in range(len(x)):
            dx = np.zeros_like(x)
            dx[i] = h
            jac[:, i] = (residuals(_factors(x + dx, base))[0] - r) / h
        a, g = jac.T @ jac, jac.T @ r
        while lam < 1e6:
            step = np.linalg.solve(a + lam * np.diag(np.diag(a) + 1e-9), -g)
            r_new, _ = residuals(_factors(x + step, base))
            if r_new @ r_new < r @ r:
                x, r, lam = x + step, r_new, lam / 3
                break
            lam *= 4
        print(f"iteration {it + 1}: sum of squares {r @ r:.4f}", file=sys.stderr, flush=True)
        if lam >= 1e6 or np.max(np.abs(step)) < 1e-3:
            break
    return _factors(x, base)


def report(factors: EfficiencyFactors) -> str:
    r, got = residuals(factors)
    rows = ["| point | regime | published | fitted model | residual | tolerance |", "|---|---|---|---|---|---|"]
    for p in PUBLIC_POINTS:
        v = got[p.name]
        rows.append(f"| {p.name} | {p.regime} | {p.published:,.1f} {p.unit} | {v:,.1f} | "
                    f"{100 * (v / p.published - 1):+.1f}% | {100 * p.tolerance:.0f}% |")
    for k, v in VERL_TARGET.items():
        g = got[f"verl-{k}"]
        rows.append(f"| verl {k} | end to end | {v:.0f} s | {g:.1f} s | {100 * (g / v - 1):+.1f}% | "
                    f"{100 * VERL_TOLERANCE[k]:.0f}% |")
    g = got["verl-sync_step"]
    rows.append(f"| verl sync step (not a point) | end to end | 749 s | {g:.1f} s | {100 * (g / 749 - 1):+.1f}% | - |")
    fields = ", ".join(f"{k}={getattr(factors, k):.4g}" for k in FITTED)
    return "\n".join(rows) + f"\n\nsum of squared log residuals {r @ r:.4f}\nfitted: {fields}\n"


if __name__ == "__main__":
    if "--check" in sys.argv:
        print(report(EfficiencyFactors()))
    else:
        start = dataclasses.replace(EfficiencyFactors(), decode_bw_eff=0.8, decode_step_overhead_s=0.001,
                                    decode_mfu=0.5, micro_batch_overhead_s=0.2, link_eff=0.8)
        print(report(fit(start)))
