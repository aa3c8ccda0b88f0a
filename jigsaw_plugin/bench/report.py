"""``report.md``, the figures and one Perfetto trace per run, rendered from a saved run.

Everything here reads a :class:`~jigsaw_plugin.bench.rundir.SavedRun` (``result.json`` +
``spans.json``), so ``jigsaw bench --out DIR`` and ``jigsaw report DIR`` write the same
files. Numbers in the Markdown are printed from ``result.json`` as they are there.
"""

from __future__ import annotations

from pathlib import Path

from jigsaw_plugin.bench.figures import render_figures
from jigsaw_plugin.bench.perfetto import write_perfetto_trace
from jigsaw_plugin.bench.rundir import SIDES, SavedRun
from jigsaw_plugin.core.result import chain_rows, last_chain, pipeline_gap_rows, pipelines_total, preemption_rows

__all__ = ["REPORT_FILE", "TRACE_FILES", "render_report", "report_markdown", "compare_markdown"]

REPORT_FILE = "report.md"
TRACE_FILES = {side: f"trace_{side}.json" for side in SIDES}
_NO_RATIO = ("samples (", "max staleness", "scheduler decisions")  # rows where a ratio says nothing
_BOUND_KEYS = ("work_s", "critical_path_s", "chain_work_s", "makespan_lower_bound_s")


def _name(run: dict) -> str:
    return run["policy"] + (f" (no {', '.join(run['ablate'])})" if run.get("ablate") else "")


def _fmt(v, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool) or isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def _ratio(b, c) -> str:
    if isinstance(b, (int, float)) and isinstance(c, (int, float)) and b:
        return f"{c / b:.2f}x"
    return ""


def _totals(run: dict, key: str, combine=sum):
    """``key`` over the run's pipelines (sum, or max for staleness)."""
    return combine([p.get(key, 0) for p in run["pipelines"].values()] or [0])


def _staleness(run: dict) -> str:
    """Every pipeline's histogram of version lag of trained samples, summed: '0: 64, 1: 32'."""
    total: dict[int, int] = {}
    for p in run["pipelines"].values():
        for lag, n in (p.get("staleness_histogram") or {}).items():
            total[int(lag)] = total.get(int(lag), 0) + n
    return ", ".join(f"{k}: {total[k]}" for k in sorted(total)) or "-"


def _summary_rows(b: dict, c: dict) -> list[tuple[str, object, object]]:
    rows = [("samples/s", b["samples_per_s"], c["samples_per_s"]),
            ("tokens/s", b.get("tokens_per_s"), c.get("tokens_per_s")),
            ("makespan s", b["makespan_s"], c["makespan_s"]),
            ("samples (the same on both sides)", b["samples"], c["samples"]),
            ("busy fraction (busy device-s / pool device-s)", b["gpu_busy_fraction"], c["gpu_busy_fraction"])]
    if "effective_utilisation" in b or "effective_utilisation" in c:
        rows.append(("effective utilisation", b.get("effective_utilisation"), c.get("effective_utilisation")))
    if "active_samples_per_s" in b or "active_samples_per_s" in c:
        rows.append(("samples/s while every pipeline runs", b.get("active_samples_per_s"),
                     c.get("active_samples_per_s")))
    for key in _BOUND_KEYS:
        if key in b.get("bounds", {}) or key in c.get("bounds", {}):
            rows.append((f"bound: {key}", b.get("bounds", {}).get(key), c.get("bounds", {}).get(key)))
    rows += [("migrations (requests)", _totals(b, "migrations"), _totals(c, "migrations")),
             ("KV-overflow preemptions (sequences recomputed)", pipelines_total(b, "kv_preemptions"),
              pipelines_total(c, "kv_preemptions")),
             ("tokens prefilled again after them", pipelines_total(b, "kv_recompute_tokens"),
              pipelines_total(c, "kv_recompute_tokens")),
             ("context switches", _totals(b, "context_switches"), _totals(c, "context_switches")),
             ("max staleness", _totals(b, "max_staleness", max), _totals(c, "max_staleness", max)),
             ("staleness of trained samples (lag: count)", _staleness(b), _staleness(c))]
    if "cost" in b or "cost" in c:
        cb, cc = b.get("cost") or {}, c.get("cost") or {}
        unit = cb.get("unit") or cc.get("unit")
        rows += [(f"cost ({unit})", cb.get("total"), cc.get("total")),
                 (f"samples per cost ({unit})", cb.get("samples_per_cost"), cc.get("samples_per_cost"))]
    rows += preemption_rows(b, c)
    sb, sc = b.get("scheduler", {}), c.get("scheduler", {})
    if sb or sc:
        rows += [("scheduler decisions", sb.get("decisions"), sc.get("decisions")),
                 ("decision p50 us", sb.get("decision_p50_us"), sc.get("decision_p50_us")),
                 ("decision p99 us", sb.get("decision_p99_us"), sc.get("decision_p99_us"))]
    return rows


def _gap_lines(bench: dict) -> list[str]:
    """``gap_recovered`` (and the other scalar gap fields), when the result carries them;
    the breakdowns are a table of their own (``_breakdown_lines``)."""
    lines = []
    for where, data in (("", bench), ("candidate ", bench["candidate"])):
        for key, value in data.items():
            if key.startswith("gap_") and not isinstance(value, dict):
                lines.append(f"- {where}{key}: **{_fmt(value, 3)}**")
    return lines


# (label, key in gap_breakdown or in its "rollout" split, whether it is a part of the gap)
_BREAKDOWN_ROWS = (
    ("devices with no task", "idle_device_s", True),
    ("rollout replicas above the ideal decode and prefill", "rollout_above_ideal_device_s", True),
    ("- held decoding, memory-bound steps (thin batches, long contexts)", "decode_memory_bound_device_s", False),
    ("- held decoding, compute-bound steps", "decode_compute_bound_device_s", False),
    ("- of the decoding: the engines' host-side step work (GPU idle)", "decode_host_device_s", False),
    ("- of the decoding: tensor-parallel all-reduces", "decode_allreduce_device_s", False),
    ("- the ideal decode", "ideal_decode_device_s", False),
    ("- held prefilling (re-prefill after moves included)", "prefill_device_s", False),
    ("- the ideal prefill", "ideal_prefill_device_s", False),
    ("- held with no request (trajectories in tool calls, or the step's last responses elsewhere)",
     "empty_device_s", False),
    ("- held otherwise (weight loads, requests waiting behind a prefill)", "other_device_s", False),
    ("training passes above their compute and fixed cost", "training_above_ideal_device_s", True),
    ("weight syncs", "weight_sync_device_s", True),
    ("the gap: pool device-s less the ideal", "gap_device_s", False),
)


def _breakdown_lines(b: dict, c: dict) -> list[str]:
    """Where each run's device-seconds above the ideal went (``gap_breakdown``): device-s
    and, for the four parts, their share of that run's gap; the rollout's split where the
    executor recorded it (``gap_breakdown.rollout``)."""
    gb, gc = b.get("gap_breakdown"), c.get("gap_breakdown")
    if not gb or not gc:
        return []
    lines = ["", "## Where the device-seconds above the ideal went", "",
             "Each run's pool device-seconds less the ideal device-seconds of its work "
             "(docs/simulator.md, \"Bounds and effective utilisation\"), in four parts; the rows under the "
             "rollout's part are what its replicas were held for, beside the ideal.", "",
             f"| | {_name(b)} device-s | {_name(c)} device-s |", "|---|---|---|"]
    for label, key, part in _BREAKDOWN_ROWS:
        vals = [g.get(key, (g.get("rollout") or {}).get(key)) for g in (gb, gc)]
        if all(v is None for v in vals):
            continue
        cells = [(_fmt(v, 0) + (f" ({v / g['gap_device_s']:.0%})" if part and g.get("gap_device_s") else ""))
                 if v is not None else "-" for v, g in zip(vals, (gb, gc))]
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    return lines


def _pipeline_gap_lines(b: dict, c: dict) -> list[str]:
    """Each pipeline's rollout and training device-seconds over its own part of the ideal
    (``gap_breakdown.pipelines``), in each run."""
    rows = pipeline_gap_rows(b, c)
    if not rows:
        return []
    lines = ["", "## Each pipeline against its own ideal", "",
             "Each pipeline's rollout replicas and training-side passes, in device-seconds held over its own part "
             "of the ideal device-seconds (docs/simulator.md, \"Bounds and effective utilisation\"): where a run's "
             "gap sits by pipeline.", "",
             f"| pipeline | {_name(b)} rollout | {_name(b)} training | {_name(c)} rollout | {_name(c)} training |",
             "|---|---|---|---|---|"]
    for name, vb, vc in rows:
        cells = ["-" if v is None else f"{v:.2f}x" for v in vb + vc]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _chain_lines(b: dict, c: dict) -> list[str]:
    """Where each run's last pipeline (the makespan's chain) spent its time to its finish
    (``chain_split``), each part beside its floor."""
    lb, lc = last_chain(b), last_chain(c)
    if lb is None or lc is None:
        return []
    (nb, cb), (nc, cc) = lb, lc
    lines = ["", "## Where the last pipeline's time went", "",
             "The pipeline that finished last in each run, its time from the start to its finish split by what "
             "of it ran (each instant once: generation, training, weight sync, else waiting), in brackets the "
             "floor of each part: its own chain in the makespan lower bound (docs/simulator.md, "
             "\"Bounds and effective utilisation\", `chain_split`).", "",
             f"| | {_name(b)}: {nb} s (floor) | {_name(c)}: {nc} s (floor) |", "|---|---|---|"]
    for (label, sb, fb), (_, sc, fc) in zip(chain_rows(cb), chain_rows(cc)):
        cells = [_fmt(v, 0) + (f" ({_fmt(f, 0)})" if f is not None else "") for v, f in ((sb, fb), (sc, fc))]
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    return lines


def _real_run_lines(bench: dict) -> list[str]:
    if bench.get("backend") != "ray" or "ratios_per_repeat" not in bench:
        return []
    lines = ["", "## Real run", "",
             f"- median of {len(bench['ratios_per_repeat'])} side-by-side runs; ratio per run: "
             + ", ".join(f"{r:.2f}x" for r in bench["ratios_per_repeat"])]
    if "peak_memory_gib" in bench:
        lines.append(f"- peak memory of all processes (PSS sum): {bench['peak_memory_gib']:.1f} GiB")
    sim = bench.get("simulated")
    if sim:
        lines.append(f"- the simulator predicts {sim['throughput_ratio']:.2f}x for this workload "
                     f"({sim['baseline']:.2f} / {sim['candidate']:.2f} samples/s)")
    for side in SIDES:
        m = bench[side].get("measured", {})
        if "wall_s" in m:
            start = m.get("engine_start_s", 0.0)
            started = f"engines started in {start:.0f} s" if start >= 1 else "engines already running (warm-up)"
            lines.append(f"- {side} ({_name(bench[side])}): {started}, run wall time {m['wall_s']:.1f} s")
    return lines


def report_markdown(saved: SavedRun, figures: list[str], traces: dict[str, str]) -> str:
    bench = saved.bench
    b, c = bench["baseline"], bench["candidate"]
    workload = c.get("workload") or b.get("workload") or "-"
    lines = [f"# {_name(c)} vs {_name(b)}: {Path(str(workload)).name}", "",
             f"**Throughput {_name(c)} / {_name(b)}: {bench['throughput_ratio']:.2f}x** "
             f"({c['samples_per_s']:.2f} vs {b['samples_per_s']:.2f} samples/s, the same "
             f"{c['samples']} samples, backend {bench.get('backend', c.get('backend', 'sim'))}, "
             f"seed {bench.get('seed', c.get('seed'))})", ""]
    lines += _gap_lines(bench)
    lines += ["", "## Summary", "", f"| metric | {_name(b)} (baseline) | {_name(c)} (candidate) | candidate / baseline |",
              "|---|---|---|---|"]
    for label, vb, vc in _summary_rows(b, c):
        ratio = "" if label.startswith(_NO_RATIO) else _ratio(vb, vc)
        big = max((abs(v) for v in (vb, vc) if isinstance(v, float)), default=0.0) >= 1000
        digits = 0 if big else 2  # one format per row: 1,180 next to 951, not next to 951.01
        lines.append(f"| {label} | {_fmt(vb, digits)} | {_fmt(vc, digits)} | {ratio} |")
    lines += ["", "## Per pipeline: the latency trade-off", "",
              "Mean step time of each pipeline under the baseline and under the candidate "
              "(ratio < 1: the candidate's steps are shorter).", "",
              f"| pipeline | {_name(b)} step s | {_name(c)} step s | ratio | samples/s base / cand "
              "| migrations base / cand | context switches base / cand | max staleness base / cand |",
              "|---|---|---|---|---|---|---|---|"]
    for name, pb in b["pipelines"].items():
        pc = c["pipelines"].get(name, {})
        lines.append(
            f"| {name} | {_fmt(pb['mean_step_s'], 1)} | {_fmt(pc.get('mean_step_s'), 1)} | "
            f"{_ratio(pb['mean_step_s'], pc.get('mean_step_s'))} | {_fmt(pb.get('samples_per_s'))} / "
            f"{_fmt(pc.get('samples_per_s'))} | {pb.get('migrations', 0)} / {pc.get('migrations', 0)} | "
            f"{pb.get('context_switches', 0)} / {pc.get('context_switches', 0)} | "
            f"{pb.get('max_staleness', 0)} / {pc.get('max_staleness', 0)} |")
    lines += _breakdown_lines(b, c)
    lines += _pipeline_gap_lines(b, c)
    lines += _chain_lines(b, c)
    lines += _real_run_lines(bench)
    lines += ["", "## Figures", ""]
    lines += [f"![{Path(f).stem}]({f})" for f in figures]
    lines += ["", "## Traces", "",
              "Open in https://ui.perfetto.dev (one track per device; migrations as markers and flows):", ""]
    lines += [f"- {side}: `{name}`" for side, name in traces.items()]
    lines += ["", "## Reproduce", "", "```", bench.get("command", "(command not recorded)"), "```", ""]
    versions = bench.get("versions", {})
    if versions:
        lines.append("Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    lines.append("")
    return "\n".join(lines)


def render_report(saved: SavedRun) -> list[Path]:
    """Write the figures, one Perfetto trace per side and ``report.md`` into the run's
    folder; returns the paths written (report first)."""
    d = saved.folder
    figures = render_figures(saved.bench, saved.baseline, saved.candidate, d)
    traces = {}
    for side, timeline in (("baseline", saved.baseline), ("candidate", saved.candidate)):
        write_perfetto_trace(timeline, d / TRACE_FILES[side], title=f"{side} {_name(saved.bench[side])}")
        traces[side] = TRACE_FILES[side]
    report = d / REPORT_FILE
    report.write_text(report_markdown(saved, [f.name for f in figures], traces))
    return [report, *figures, *(d / t for t in traces.values())]


def compare_markdown(runs: list[SavedRun]) -> str:
    """One row per saved run: what was compared and the headline numbers."""
    lines = ["| run | workload | backend | baseline | candidate | baseline samples/s | candidate samples/s "
             "| ratio | busy base / cand |", "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        b, c = r.bench["baseline"], r.bench["candidate"]
        lines.append(f"| {r.folder} | {Path(str(c.get('workload') or '-')).name} | "
                     f"{r.bench.get('backend', c.get('backend', 'sim'))} | {_name(b)} | {_name(c)} | "
                     f"{b['samples_per_s']:.2f} | {c['samples_per_s']:.2f} | {r.bench['throughput_ratio']:.2f}x | "
                     f"{b['gpu_busy_fraction']:.2f} / {c['gpu_busy_fraction']:.2f} |")
    return "\n".join(lines)
