"""A/B throughput comparison: one baseline and one candidate on the same workload and seed.

Both runs process exactly the same samples (the workload sampler is seeded by pipeline,
step and seed, not by policy), so ``throughput_ratio`` compares like with like.
"""

from __future__ import annotations

from dataclasses import dataclass

from jigsaw_plugin.bench.spans import Timeline
from jigsaw_plugin.core.result import chain_rows, last_chain, pipeline_gap_rows, preemption_rows
from jigsaw_plugin.errors import SpecError

__all__ = ["ABLATIONS", "BACKENDS", "RecordedAB", "check_backend", "run_ab", "run_ab_recorded", "format_ab"]

# --ablate flips one jigsaw mechanism from its default: these are on by default (switched off) ...
ABLATIONS = ("migration", "resize", "lookahead", "multiplex", "borrow", "early_passes", "lend_to_critical",
             "reshard_in_place", "async_reserve", "critical_loans",
             "bulk_width", "fill_width", "keep_critical_loans", "wait_for_home", "idle_spread", "critical_spread",
             "spread_in_tail", "predicted_pace", "fastest_width", "reprice_on_change", "concurrent_stages", "reward_wait",
             "early_in_reward_wait", "early_in_tool_calls", "grow_at_home", "tool_wait",
             "critical_claim", "wait_for_freed", "admission", "grow_on_queue", "lend_beside_stages",
             "grow_onto_orphans", "move_preempted", "grow_in_plan", "admission_trade", "early_rest",
             "alone_width", "keep_between_turns", "early_merges", "widen_for_early", "widen_when_idle",
             "alongside_wait")
# ... and these off by default (switched on: built and measured, docs/benchmarks.md "with ...")
OFF_BY_DEFAULT = ("loans", "priority", "balance", "colocate", "orphan_spread", "lend_rollouts_to_critical")
BACKENDS = ("sim", "ray")  # ray: real engines and trainers (runtime/ray_bench.py)


def ablation_options(name: str, ablate: list[str] | None) -> dict:
    """The candidate's options for ``--ablate``: each named mechanism flipped from its default."""
    opts = {}
    for a in ablate or []:
        if a not in ABLATIONS + OFF_BY_DEFAULT:
            raise SpecError("--ablate", a, ", ".join(ABLATIONS + OFF_BY_DEFAULT))
        if name != "jigsaw":
            raise SpecError("--ablate", a, f"only with the jigsaw candidate (got {name})")
        opts[a] = a in OFF_BY_DEFAULT
    return opts


def _policy(name: str, ablate: list[str], options: dict | None = None):
    from jigsaw_plugin.scheduler import get_policy

    return get_policy(name, **{**(options or {}), **ablation_options(name, ablate)})


def ray_backend_available() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("ray", "vllm", "torch", "psutil"))


@dataclass(frozen=True)
class RecordedAB:
    """An A/B run: the bench JSON and what each side did on each device."""

    bench: dict
    baseline: Timeline
    candidate: Timeline


def check_backend(backend: str, workload) -> None:
    """Refuse, before anything starts, a backend that is unknown, not installed, or cannot
    run this workload (the ray backend runs the reference pipeline only)."""
    if backend not in BACKENDS:
        raise SpecError("--backend", backend, ", ".join(BACKENDS))
    if backend == "ray":
        if not ray_backend_available():
            raise SpecError("--backend", backend, "sim here: the ray backend needs torch, vLLM and psutil "
                            "(`pip install 'jigsaw-plugin[cpu]' torch==2.13.0`, or `make venv-cpu` in a checkout; "
                            "`jigsaw doctor --host ray` says what is missing)")
        from jigsaw_plugin.runtime.ray_bench import check_ray_workload

        check_ray_workload(workload)


def run_ab(workload, baseline: str, candidate: str = "jigsaw", seed: int = 0, backend: str = "sim",
           ablate: list[str] | None = None, baseline_options: dict | None = None, workload_path=None,
           repeats: int = 3, predictor: str = "history") -> dict:
    """Run both policies; the bench JSON of DESIGN.md section 5. ``backend="ray"`` runs
    them ``repeats`` times side by side on real engines (``workload_path`` needed).
    ``predictor``: the candidate's length predictor ("oracle": the labelled ablation)."""
    return run_ab_recorded(workload, baseline, candidate, seed, backend, ablate, baseline_options,
                           workload_path, repeats, predictor=predictor).bench


def _simulate_recorded(workload, policy, seed: int, progress: bool,
                       predictor: str = "history") -> tuple[dict, Timeline]:
    """One simulated run through a plugin manager (user plugins included, as ``jigsaw sim``)
    that also records the migrations and drives the progress line."""
    from jigsaw_plugin.bench.progress import SimProgress
    from jigsaw_plugin.bench.spans import MIGRATION_HOOKS, timeline_of
    from jigsaw_plugin.events import EventRecorder
    from jigsaw_plugin.manager import Emitter, get_plugin_manager, register
    from jigsaw_plugin.sim import Simulation

    pm = get_plugin_manager()
    recorder = EventRecorder(include_progress=False, hooks=MIGRATION_HOOKS)
    register(pm, recorder, "bench-migrations")
    total = sum(p.steps for p in workload.pipelines)
    with SimProgress(f"simulating {policy.name}", total, progress) as bar:
        register(pm, bar, "bench-progress")
        sim = Simulation(workload, policy, seed=seed, hooks=Emitter(pm), pm=pm, predictor=predictor)
        result = sim.run()
    return result, timeline_of(sim, recorder.events)


def run_ab_recorded(workload, baseline: str, candidate: str = "jigsaw", seed: int = 0, backend: str = "sim",
                    ablate: list[str] | None = None, baseline_options: dict | None = None, workload_path=None,
                    repeats: int = 3, progress: bool = False, log=None, predictor: str = "history") -> RecordedAB:
    """:func:`run_ab` that also keeps each side's :class:`Timeline` (the report's figures
    and Perfetto traces). ``progress``: draw progress on stderr; ``log``: a callable that
    receives the real runs' messages (default: the ``jigsaw_plugin`` logger)."""
    import logging

    from jigsaw_plugin.bench.spans import timeline_from_events

    log = log or logging.getLogger("jigsaw_plugin").info
    check_backend(backend, workload)
    if backend == "ray":
        from jigsaw_plugin.runtime.ray_bench import run_ab_ray
        from jigsaw_plugin.sim import simulate

        _policy(candidate, ablate or [])  # validates the ablations (run_ab_ray checks the workload)
        # the hook events of the median runs go to --out (events_*.jsonl: `jigsaw graph --from-events`)
        ab = run_ab_ray(workload_path, baseline, candidate, repeats=repeats, seed=seed,
                        baseline_options=baseline_options, candidate_options=ablation_options(candidate, ablate),
                        record_events=True, log=log, predict=simulate)
        if ablate:
            ab["candidate"]["ablate"] = list(ablate)
        ab["gap_recovered"] = gap_recovered(ab["baseline"], ab["candidate"])
        events = ab.get("events", {})
        gpus, gpn = workload.cluster.gpus, workload.cluster.gpus_per_node
        return RecordedAB(ab, timeline_from_events(events.get("baseline", []), gpus, gpn),
                          timeline_from_events(events.get("candidate", []), gpus, gpn))
    base, base_tl = _simulate_recorded(workload, _policy(baseline, [], baseline_options), seed, progress)
    cand, cand_tl = _simulate_recorded(workload, _policy(candidate, ablate or []), seed, progress, predictor)
    if base["samples"] != cand["samples"]:
        raise RuntimeError(f"runs processed different samples: {base['samples']} vs {cand['samples']}")
    if ablate:
        cand["ablate"] = list(ablate)
    bench = {
        "baseline": base,
        "candidate": cand,
        "throughput_ratio": cand["samples_per_s"] / base["samples_per_s"],
        "gap_recovered": gap_recovered(base, cand),
    }
    return RecordedAB(bench, base_tl, cand_tl)


def gap_recovered(base: dict, cand: dict) -> float | None:
    """How much of the gap between the baseline's makespan and the makespan lower bound
    the candidate closes (1.0: it reaches the bound; 0: no better than the baseline)."""
    return gap_share(base["makespan_s"], cand["makespan_s"], base.get("bounds", {}).get("makespan_lower_bound_s"))


def gap_share(base_s: float, cand_s: float, bound_s: float | None) -> float | None:
    """``gap_recovered`` of bare makespans: (base - candidate) / (base - bound); None where
    the bound is unknown or the baseline is not above it."""
    if bound_s is None or base_s - bound_s <= 0:
        return None
    return (base_s - cand_s) / (base_s - bound_s)


def _breakdown_rows(b: dict, c: dict) -> list[str]:
    """Where each run's device-seconds above the ideal went (``gap_breakdown``), and the
    rollout's memory-bound decode where the executor recorded it."""
    gb, gc = b.get("gap_breakdown"), c.get("gap_breakdown")
    if not gb or not gc:
        return []
    rows = ["device-s above the ideal:"]
    for label, key in (("idle", "idle_device_s"), ("rollout", "rollout_above_ideal_device_s"),
                       ("training", "training_above_ideal_device_s"), ("weight sync", "weight_sync_device_s")):
        rows.append(f"  {label:<20}{gb[key]:>14.0f}{gc[key]:>14.0f}")
    if "rollout" in gb and "rollout" in gc:
        key = "decode_memory_bound_device_s"
        # held, not above the ideal: decode steps too thin (or too long-context) to compute
        rows.append(f"{'mem-bound decode dev-s':<22}{gb['rollout'][key]:>14.0f}{gc['rollout'][key]:>14.0f}")
    return rows


def _times(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _pipeline_gap_rows(b: dict, c: dict) -> list[str]:
    """Each pipeline's rollout and training device-seconds over its own ideal, per run."""
    rows = pipeline_gap_rows(b, c)
    if not rows:
        return []
    out = ["rollout / training dev-s over each pipeline's ideal:"]
    for name, vb, vc in rows:
        cells = [f"{_times(r)} / {_times(t)}" for r, t in (vb, vc)]
        out.append(f"  {name[:20]:<20}{cells[0]:>14}{cells[1]:>14}")
    return out


def _chain_rows(b: dict, c: dict) -> list[str]:
    """Where each run's last pipeline's time to its finish went (``chain_split``), each part
    beside its floor in brackets."""
    lb, lc = last_chain(b), last_chain(c)
    if lb is None or lc is None:
        return []
    (nb, cb), (nc, cc) = lb, lc
    rows = ["last pipeline's chain s (floor):", f"  {'pipeline':<20}{nb[:13]:>14}{nc[:13]:>14}"]
    for (label, sb, fb), (_, sc, fc) in zip(chain_rows(cb), chain_rows(cc)):
        cells = [f"{v:.0f}" + (f" ({f:.0f})" if f is not None else "") for v, f in ((sb, fb), (sc, fc))]
        rows.append(f"  {label:<20}{cells[0]:>14}{cells[1]:>14}")
    return rows


def format_ab(ab: dict) -> str:
    b, c = ab["baseline"], ab["candidate"]
    lines = [
        f"{'':<22}{b['policy']:>14}{c['policy']:>14}",
        f"{'samples/s':<22}{b['samples_per_s']:>14.2f}{c['samples_per_s']:>14.2f}",
        f"{'makespan_s':<22}{b['makespan_s']:>14.1f}{c['makespan_s']:>14.1f}",
        f"{'gpu_busy_fraction':<22}{b['gpu_busy_fraction']:>14.2f}{c['gpu_busy_fraction']:>14.2f}",
        *([f"{'effective_utilisation':<22}{b['effective_utilisation']:>14.2f}{c['effective_utilisation']:>14.2f}",
           f"{'makespan lower bound':<22}{b['bounds']['makespan_lower_bound_s']:>14.1f}"]
          if "bounds" in b and "effective_utilisation" in c else []),
        *([f"{'cost (' + b['cost']['unit'] + ')':<22}{b['cost']['total']:>14.3f}{c['cost']['total']:>14.3f}",
           f"{'samples per cost':<22}{b['cost']['samples_per_cost']:>14.1f}{c['cost']['samples_per_cost']:>14.1f}"]
          if b.get("cost") and c.get("cost") else []),
        *[f"{label:<22}{'-' if vb is None else vb:>14}{'-' if vc is None else vc:>14}"
          for label, vb, vc in preemption_rows(b, c, short=True)],
        *_breakdown_rows(b, c),
        *_pipeline_gap_rows(b, c),
        *_chain_rows(b, c),
        "mean step s per pipeline:",
    ]
    for name, bp in b["pipelines"].items():
        cp = c["pipelines"][name]
        lines.append(f"  {name:<20}{bp['mean_step_s']:>14.1f}{cp['mean_step_s']:>14.1f}")
    if any("staleness_histogram" in p for p in c["pipelines"].values()):
        lines.append("staleness of trained samples per pipeline (version lag: samples):")
        for name, bp in b["pipelines"].items():
            hist = [" ".join(f"{k}:{v}" for k, v in (p.get("staleness_histogram") or {}).items()) or "-"
                    for p in (bp, c["pipelines"][name])]
            lines.append(f"  {name:<20}{hist[0]:>14}{hist[1]:>14}")
    lines.append(f"throughput_ratio {c['policy']}/{b['policy']}: {ab['throughput_ratio']:.2f}x")
    if ab.get("gap_recovered") is not None:
        lines.append(f"gap to the makespan lower bound recovered: {ab['gap_recovered']:.0%}")
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
