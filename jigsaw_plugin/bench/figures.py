"""The A/B report's figures (PNG, matplotlib Agg): drawn from the saved records only.

- ``gantt.png``: per-device timeline of both runs, same time axis; colour = pipeline,
  hatch = stage kind, black ticks = migrations;
- ``utilisation.png``: fraction of devices holding work over time, both runs;
- ``throughput.png``: samples/s of both runs, the ratio, the bound when the result has one;
- ``step_times.png``: each pipeline's mean step time under the baseline and the candidate.
"""

from __future__ import annotations

from pathlib import Path

from jigsaw_plugin.bench.spans import ROLLOUT, Timeline

__all__ = ["FIGURES", "render_figures", "devices_busy_over_time", "KIND_HATCH"]

FIGURES = ("gantt.png", "utilisation.png", "throughput.png", "step_times.png")

#: Hatch of each stage kind in the Gantt chart (rollout: solid, lighter).
KIND_HATCH = {ROLLOUT: "", "old_log_prob": "..", "ref": "oo", "values": "++", "update_actor": "//",
              "update_critic": "\\\\", "weight_sync": "xx"}
_OTHER_HATCH = "--"
_DPI = 120


def _plt():
    import matplotlib

    matplotlib.use("Agg")  # files only; never a window (CI, servers)
    import matplotlib.pyplot as plt

    return plt


def _pipeline_colors(names) -> dict:
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if len(names) <= 10 else "tab20"]
    return {n: cmap(i % cmap.N) for i, n in enumerate(names)}


def _name(run: dict) -> str:
    return run["policy"] + (f" (no {', '.join(run['ablate'])})" if run.get("ablate") else "")


def _title(ab: dict) -> str:
    b, c = ab["baseline"], ab["candidate"]
    wl = Path(str(c.get("workload") or "workload")).stem
    return f"{wl}: {_name(c)} vs {_name(b)} ({c.get('backend', 'sim')}, seed {c.get('seed', 0)})"


def devices_busy_over_time(tl: Timeline) -> tuple[list[float], list[float]]:
    """(times, fraction of the pool's devices holding a span) as a step function: each
    device counts once however many spans overlap on it."""
    per_device: dict[int, list[tuple[float, float]]] = {}
    for s in tl.spans:
        for d in s.devices:
            per_device.setdefault(d, []).append((s.start_s, s.end_s))
    edges: list[tuple[float, int]] = []
    for intervals in per_device.values():
        intervals.sort()
        cur_a, cur_b = intervals[0]
        for a, b in intervals[1:]:
            if a > cur_b:
                edges += [(cur_a, 1), (cur_b, -1)]
                cur_a, cur_b = a, b
            else:
                cur_b = max(cur_b, b)
        edges += [(cur_a, 1), (cur_b, -1)]
    deltas: dict[float, int] = {}
    for t, delta in edges:  # one point per instant: a span ending as the next starts is no dip
        deltas[t] = deltas.get(t, 0) + delta
    times, fracs, held = [0.0], [0.0], 0
    for t in sorted(deltas):
        held += deltas[t]
        times.append(t)
        fracs.append(held / max(1, tl.gpus))
    return times, fracs


def _gantt_axis(ax, tl: Timeline, colors: dict, run: dict) -> None:
    from matplotlib.collections import LineCollection, PatchCollection
    from matplotlib.patches import Rectangle

    groups: dict[tuple, list] = {}
    for s in tl.spans:
        for d in s.devices:
            groups.setdefault((s.pipeline, s.kind), []).append(Rectangle((s.start_s, d - 0.4), s.end_s - s.start_s, 0.8))
    for (pipeline, kind), rects in groups.items():
        rollout = kind == ROLLOUT
        ax.add_collection(PatchCollection(
            rects, facecolor=colors.get(pipeline, "grey"), alpha=0.55 if rollout else 0.95,
            hatch=KIND_HATCH.get(kind, _OTHER_HATCH), edgecolor="white" if rollout else "black", linewidth=0.3))
    marks = [m for m in tl.migrations if m.src_devices]
    if marks:
        ax.scatter([m.t_s for m in marks for _ in m.src_devices], [d for m in marks for d in m.src_devices],
                   marker="v", s=18, color="red", edgecolors="black", linewidths=0.4, zorder=4)
        arrows = [[(m.t_s, m.src_devices[0]), (m.t_s, m.dst_devices[0])] for m in marks
                  if m.dst_devices and m.dst_devices[0] != m.src_devices[0]]
        if arrows:
            ax.add_collection(LineCollection(arrows, colors="red", linewidths=0.6, alpha=0.7, zorder=3))
    ax.set_ylim(tl.gpus - 0.5, -0.5)
    step = max(1, tl.gpus // 16)
    ax.set_yticks(range(0, tl.gpus, step))
    ax.set_ylabel("device")
    moved = sum(m.requests for m in tl.migrations)
    ax.set_title(f"{_name(run)}: {run['samples_per_s']:.2f} samples/s, makespan {run['makespan_s']:.1f} s, "
                 f"busy {run['gpu_busy_fraction']:.2f}, {moved} requests migrated", fontsize=10, loc="left")


def _gantt(ab: dict, tls: tuple[Timeline, Timeline], path: Path) -> None:
    plt = _plt()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    names = list(ab["baseline"]["pipelines"])
    colors = _pipeline_colors(names)
    gpus = max(tl.gpus for tl in tls)
    row_in = min(0.3, 6.0 / max(1, gpus))
    fig = plt.figure(figsize=(13, 2 * (gpus * row_in + 1.0) + 1.6), layout="constrained")
    axes = fig.subplots(2, 1, sharex=True)
    for ax, tl, side in zip(axes, tls, ("baseline", "candidate")):
        _gantt_axis(ax, tl, colors, ab[side])
    end = max((s.end_s for tl in tls for s in tl.spans), default=1.0)
    axes[1].set_xlim(0, end * 1.01)
    axes[1].set_xlabel("time (s, run clock)")
    kinds = sorted({s.kind for tl in tls for s in tl.spans}, key=lambda k: (k != ROLLOUT, k))
    handles = [Patch(facecolor=colors[n], label=n) for n in names]
    handles += [Patch(facecolor="white", edgecolor="black", hatch=KIND_HATCH.get(k, _OTHER_HATCH) or None,
                      label=k + (" (replica held)" if k == ROLLOUT else "")) for k in kinds]
    if any(tl.migrations for tl in tls):
        handles.append(Line2D([], [], marker="v", color="red", markeredgecolor="black", linestyle="", markersize=6,
                              label="migration (on its source devices; line to the destination)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=min(8, len(handles)), fontsize=8, frameon=False)
    fig.suptitle(f"Per-device timeline: {_title(ab)}", fontsize=11)
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)


def _utilisation(ab: dict, tls: tuple[Timeline, Timeline], path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(11, 4))
    for tl, side, color in zip(tls, ("baseline", "candidate"), ("tab:grey", "tab:blue")):
        run = ab[side]
        times, fracs = devices_busy_over_time(tl)
        ax.step(times, fracs, where="post", color=color, label=f"{_name(run)}: devices holding work")
        ax.axhline(run["gpu_busy_fraction"], color=color, linestyle="--", linewidth=1,
                   label=f"{_name(run)}: busy fraction over the run {run['gpu_busy_fraction']:.2f}")
    ax.set_ylim(0, 1.05)
    ax.set_xlim(left=0)
    ax.set_xlabel("time (s, run clock)")
    ax.set_ylabel("fraction of the pool's devices")
    ax.set_title(f"Device utilisation over time: {_title(ab)}", fontsize=10)
    ax.legend(fontsize=8, loc="lower left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)


def _throughput(ab: dict, path: Path) -> None:
    plt = _plt()
    b, c = ab["baseline"], ab["candidate"]
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    values = [b["samples_per_s"], c["samples_per_s"]]
    bars = ax.bar([_name(b), _name(c)], values, color=["tab:grey", "tab:blue"])
    for bar, v in zip(bars, values):
        ax.annotate(f"{v:.2f}", (bar.get_x() + bar.get_width() / 2, v), ha="center", va="bottom", fontsize=9)
    bound = c.get("bounds", {}).get("makespan_lower_bound_s")
    if bound:  # no policy can finish these samples faster than the lower bound on the makespan
        ax.axhline(c["samples"] / bound, color="tab:red", linestyle="--",
                   label=f"bound: {c['samples'] / bound:.2f} samples/s (makespan >= {bound:.0f} s)")
        ax.legend(fontsize=8, loc="upper left")
    ax.set_ylabel("samples/s (higher is better)")
    ax.set_title(f"Throughput: {_name(c)} / {_name(b)} = {ab['throughput_ratio']:.2f}x\n{_title(ab)}", fontsize=9)
    ax.set_ylim(0, max(values + ([c["samples"] / bound] if bound else [])) * 1.15)
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)


def _step_times(ab: dict, path: Path) -> None:
    plt = _plt()
    b, c = ab["baseline"], ab["candidate"]
    names = list(b["pipelines"])
    fig, ax = plt.subplots(figsize=(max(6.5, 1.3 * len(names) + 2), 4.5))
    x = range(len(names))
    width = 0.38
    base = [b["pipelines"][n]["mean_step_s"] for n in names]
    cand = [c["pipelines"][n]["mean_step_s"] for n in names]
    ax.bar([i - width / 2 for i in x], base, width, color="tab:grey", label=f"{_name(b)} (baseline)")
    ax.bar([i + width / 2 for i in x], cand, width, color="tab:blue", label=f"{_name(c)} (candidate)")
    for i, (vb, vc) in enumerate(zip(base, cand)):
        ax.annotate(f"{vc / vb:.2f}x" if vb else "", (i + width / 2, vc), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x))
    ax.set_xticklabels(names, rotation=20 if len(names) > 3 else 0, ha="right" if len(names) > 3 else "center",
                       fontsize=8)
    ax.set_ylabel("mean step time (s, lower is better)")
    ax.set_title(f"Per-pipeline step time (label: candidate / baseline)\n{_title(ab)}", fontsize=9)
    ax.legend(fontsize=8)
    ax.set_ylim(0, max(base + cand) * 1.15)
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)


def render_figures(ab: dict, baseline: Timeline, candidate: Timeline, out_dir) -> list[Path]:
    """Write :data:`FIGURES` into ``out_dir``; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f for f in FIGURES]
    _gantt(ab, (baseline, candidate), paths[0])
    _utilisation(ab, (baseline, candidate), paths[1])
    _throughput(ab, paths[2])
    _step_times(ab, paths[3])
    return paths
