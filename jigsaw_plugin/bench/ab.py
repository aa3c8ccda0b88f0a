"""A/B throughput comparison: one baseline and one candidate on the same workload and seed.

Both runs process exactly the same samples (the workload sampler is seeded by pipeline,
step and seed, not by policy), so ``throughput_ratio`` compares like with like.
"""

from __future__ import annotations

import json
from pathlib import Path

from jigsaw_plugin.errors import SpecError

__all__ = ["ABLATIONS", "BACKENDS", "run_ab", "format_ab"]

ABLATIONS = ("migration", "resize", "lookahead", "multiplex")
BACKENDS = ("sim", "ray")  # ray: real engines and trainers (runtime/ray_bench.py)


def _policy(name: str, ablate: list[str], options: dict | None = None):
    from jigsaw_plugin.scheduler import get_policy

    opts = dict(options or {})
    for a in ablate or []:
        if a not in ABLATIONS:
            raise SpecError("--ablate", a, ", ".join(ABLATIONS))
        if name != "jigsaw":
            raise SpecError("--ablate", a, f"only with the jigsaw candidate (got {name})")
        opts[a] = False
    return get_policy(name, **opts)


def ray_backend_available() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("ray", "vllm", "torch", "psutil"))


def run_ab(workload, baseline: str, candidate: str = "jigsaw", seed: int = 0, backend: str = "sim",
           ablate: list[str] | None = None, baseline_options: dict | None = None, workload_path=None,
           repeats: int = 3) -> dict:
    """Run both policies; the bench JSON of DESIGN.md section 5. ``backend="ray"`` runs
    them ``repeats`` times side by side on real engines (``workload_path`` needed)."""
    from jigsaw_plugin.sim import simulate

    if backend not in BACKENDS:
        raise SpecError("--backend", backend, ", ".join(BACKENDS))
    if backend == "ray":
        if not ray_backend_available():
            raise SpecError("--backend", backend, "sim here: the ray backend needs torch, vLLM and psutil "
                            "(`make venv-cpu`, then `.venv-cpu/bin/jigsaw bench ... --backend ray`)")
        from jigsaw_plugin.runtime.ray_bench import run_ab_ray

        _policy(candidate, ablate or [])  # validates the ablations (run_ab_ray checks the workload)
        # the hook events of the median runs go to --out (events_*.jsonl: `jigsaw graph --from-events`)
        ab = run_ab_ray(workload_path, baseline, candidate, repeats=repeats, seed=seed,
                        baseline_options=baseline_options, candidate_options={a: False for a in ablate or []},
                        record_events=True)
        if ablate:
            ab["candidate"]["ablate"] = list(ablate)
        return ab
    base = simulate(workload, _policy(baseline, [], baseline_options), seed=seed)
    cand = simulate(workload, _policy(candidate, ablate or []), seed=seed)
    if base["samples"] != cand["samples"]:
        raise RuntimeError(f"runs processed different samples: {base['samples']} vs {cand['samples']}")
    if ablate:
        cand["ablate"] = list(ablate)
    return {
        "baseline": base,
        "candidate": cand,
        "throughput_ratio": cand["samples_per_s"] / base["samples_per_s"],
    }


def format_ab(ab: dict) -> str:
    b, c = ab["baseline"], ab["candidate"]
    lines = [
        f"{'':<22}{b['policy']:>14}{c['policy']:>14}",
        f"{'samples/s':<22}{b['samples_per_s']:>14.2f}{c['samples_per_s']:>14.2f}",
        f"{'makespan_s':<22}{b['makespan_s']:>14.1f}{c['makespan_s']:>14.1f}",
        f"{'gpu_busy_fraction':<22}{b['gpu_busy_fraction']:>14.2f}{c['gpu_busy_fraction']:>14.2f}",
        "mean step s per pipeline:",
    ]
    for name, bp in b["pipelines"].items():
        cp = c["pipelines"][name]
        lines.append(f"  {name:<20}{bp['mean_step_s']:>14.1f}{cp['mean_step_s']:>14.1f}")
    lines.append(f"throughput_ratio {c['policy']}/{b['policy']}: {ab['throughput_ratio']:.2f}x")
    if ab.get("backend") == "ray":  # measured on real engines: repeats, memory, the simulator's view
        sim = ab["simulated"]
        lines += [
            f"  median of {len(ab['ratios_per_repeat'])} side-by-side runs; per run: "
            + ", ".join(f"{r:.2f}x" for r in ab["ratios_per_repeat"]),
            f"  peak memory of all processes (PSS sum): {ab['peak_memory_gib']:.1f} GiB",
            f"  the simulator predicts {sim['throughput_ratio']:.2f}x for this workload "
            f"({sim['baseline']:.2f} / {sim['candidate']:.2f} samples/s)",
        ]
    return "\n".join(lines)


def write_ab(ab: dict, out_dir: str | None, json_path: str | None) -> None:
    if out_dir:
        d = Path(out_dir)
        d.mkdir(parents=True, exist_ok=True)
        (d / "baseline.json").write_text(json.dumps(ab["baseline"], indent=2))
        (d / "candidate.json").write_text(json.dumps(ab["candidate"], indent=2))
        for side, events in ab.get("events", {}).items():  # a real run's hook events
            with open(d / f"events_{side}.jsonl", "w") as f:
                f.writelines(json.dumps(e) + "\n" for e in events)
        (d / "bench.json").write_text(json.dumps({k: v for k, v in ab.items() if k != "events"}, indent=2))
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps({k: v for k, v in ab.items() if k != "events"}, indent=2))
