"""The result JSON of DESIGN.md section 5, built from a finished run of either executor."""

from __future__ import annotations

import numpy as np

from jigsaw_plugin.hookspecs import STAGES

__all__ = ["build_result", "cost_result", "pipelines_total", "staleness_histogram", "last_chain", "chain_rows", "preemption_rows", "STAGE_KEYS",
           "ELASTIC_ASSUMES"]

STAGE_KEYS = STAGES  # every stage kind, in the order a synchronous step runs them


def staleness_histogram(p, sample_versions=None) -> dict:
    """How many trained samples were generated how many versions behind the weights they
    trained (``{"0": n0, "1": n1, ...}``). ``sample_versions``: step -> Counter of each
    sample's version (the simulator records it); without it, each step's samples count at
    the step's oldest version (an upper bound)."""
    hist: dict[int, int] = {}
    for s in p.steps.values():
        if s.trained_version is None:
            continue
        per = (sample_versions or {}).get(s.step)
        items = per.items() if per else [(s.min_version, s.n)]
        for v, n in items:
            lag = int(s.trained_version - v)
            hist[lag] = hist.get(lag, 0) + int(n)
    return {str(k): hist[k] for k in sorted(hist)}


def pipelines_total(result: dict, key: str):
    """``key`` summed over a result's pipelines; None where any pipeline has it None or not
    at all (a figure its executor did not observe, or an older result)."""
    values = [p.get(key) for p in result["pipelines"].values()]
    return None if not values or any(v is None for v in values) else sum(values)


def _pipeline_result(p, sample_versions=None, kv_preemptions: bool = False) -> dict:
    steps = [s for s in p.steps.values() if s.trained_version is not None]
    stage_s = {k: 0.0 for k in STAGE_KEYS}
    for s in steps:
        stage_s["gen"] += s.gen_end_t - s.gen_start_t
        stage_s["reward"] += s.reward_end_t - s.gen_end_t
        for k, (a, b) in s.stage_t.items():
            stage_s[k] += b - a
    n = max(1, len(steps))
    samples = sum(s.n for s in steps)
    span = (p.finished_t or 0.0) - min((s.gen_start_t for s in steps), default=0.0)
    return {
        "steps": len(steps),
        "samples": samples,
        "samples_per_s": samples / span if span > 0 else 0.0,
        "mean_step_s": span / n,
        "stage_s": {k: v / n for k, v in stage_s.items()},
        "max_staleness": p.max_staleness,
        "staleness_histogram": staleness_histogram(p, sample_versions),
        "staleness_unit": "sample" if sample_versions is not None else "step",
        "migrations": sum(s.migrations for s in steps),
        "early_passes": sum(s.early_passes for s in steps),
        "context_switches": p.context_switches,
        # sequences its engines preempted because their KV caches overflowed, and the
        # tokens they prefilled again for it (vLLM's recompute); None: not observed
        "kv_preemptions": p.kv_preemptions if kv_preemptions else None,
        "kv_recompute_tokens": p.kv_recompute_tokens if kv_preemptions else None,
        "generated_tokens": sum(s.generated for s in steps),
    }


def _active_samples_per_s(ex) -> float:
    """Throughput while every pipeline is still running (until the first one finishes)."""
    first = min((p.finished_t or 0.0) for p in ex.order)
    if first <= 0:
        return 0.0
    done = sum(s.n for p in ex.order for s in p.steps.values()
               if s.trained_version is not None and s.stage_t.get("update_actor", (0, first))[1] <= first)
    return done / first


ELASTIC_ASSUMES = ("on-demand classes without a link billed for the whole run; preemptible (spot) and "
                   "remote classes billed only while they hold work (a rollout replica, its switch and weight "
                   "pull included, or a training stage): idle workers released")


def _held_s(ex, specs) -> list | None:
    """Device-seconds each class held work, from the executor's per-device record
    (``ExecutorCore.trace``); None for an executor without one."""
    trace = getattr(ex, "trace", None)
    if trace is None:
        return None
    first, at = [], 0
    for c in specs:
        first.append((at, at + c.count))
        at += c.count
    held = [0.0] * len(specs)
    for _name, _kind, devices, start, end in trace:
        for d in devices:
            for k, (lo, hi) in enumerate(first):
                if lo <= d < hi:
                    held[k] += end - start
    return held


def cost_result(ex, makespan: float, samples: int) -> dict:
    """Cost of the run: each class's provisioned devices for the makespan, less the
    downtime of preempted devices (not billed), times its price per device-hour; a class
    without a price counts device-hours (``unit``). ``elastic`` bills spot and remote
    classes only while they hold work (``ELASTIC_ASSUMES``): what
    leaving a worker idle saves where idle workers are released."""
    pre = getattr(ex, "preemptions", None)
    specs = ex.workload.cluster.device_classes()
    held = _held_s(ex, specs)
    classes = {}
    elastic = 0.0
    for k, c in enumerate(specs):
        down = pre.downtime_s(k, makespan) if pre is not None else 0.0
        hours = max(0.0, c.count * makespan - down) / 3600.0
        price = c.price_per_hour
        unit = price if price is not None else 1.0
        classes[c.name] = {"gpu": c.gpu if isinstance(c.gpu, str) else str(c.gpu.get("name", "custom")),
                           "count": c.count, "device_hours": hours, "price_per_hour": price,
                           "cost": hours * unit,
                           "preemptions": int(pre.count[k]) if pre is not None else 0}
        if held is not None:
            busy = min(hours, held[k] / 3600.0)
            classes[c.name]["held_device_hours"] = busy
            elastic += (busy if c.preemptible is not None or c.link is not None else hours) * unit
    priced = all(c["price_per_hour"] is not None for c in classes.values())
    total = sum(c["cost"] for c in classes.values())
    return {"unit": "price" if priced else "device-hours", "total": total,
            "device_hours": sum(c["device_hours"] for c in classes.values()),
            "samples_per_cost": samples / total if total > 0 else 0.0, "classes": classes,
            "elastic": None if held is None else {
                "total": elastic, "samples_per_cost": samples / elastic if elastic > 0 else 0.0,
                "assumes": ELASTIC_ASSUMES}}


def _replica_launches(ex) -> dict:
    """Rollout replicas the policy launched and closed, and how many of them were closed in
    the instant they started, never decoding (a live executor would have woken an engine
    and loaded its weights for nothing), from the executor's record of closed replicas."""
    rows = [row for row in ex.trace if row[1] == "rollout"]
    return {"replicas_closed": len(rows),
            "replicas_closed_at_launch": sum(1 for row in rows if row[4] - row[3] <= 1e-9)}


def last_chain(result: dict) -> tuple[str, dict] | None:
    """The pipeline of ``result`` that finished last (the makespan's chain) and its
    ``chain_split`` entry; None where the result has none (one saved before it existed)."""
    chains = result.get("chain_split")
    if not chains:
        return None
    name = max(chains, key=lambda n: chains[n]["finish_s"])
    return name, chains[name]


def chain_rows(chain: dict) -> list[tuple[str, float, float | None]]:
    """A ``chain_split`` entry as (label, seconds, its floor or None) rows, as the bench
    summary and report.md print them: its finish, its parts, the waiting (no floor)."""
    rows = [("finish", chain["finish_s"], chain["floor_s"])]
    rows += [(label, chain[f"{key}_s"], chain[f"{key}_floor_s"])
             for label, key in (("generation", "generation"), ("training", "training"), ("weight sync", "weight_sync"))]
    return rows + [("waiting", chain["waiting_s"], None)]


def build_result(ex, backend: str = "sim", events: int = 0) -> dict:
    """``ex``: a finished ``ExecutorCore`` (the simulator's World or the live executor)."""
    from jigsaw_plugin.core.bounds import chain_split, compute_bounds, gap_breakdown, idle_gaps

    versions = getattr(ex, "sample_versions", None)
    kv = ex.reports_kv_preemptions
    pipes = {p.name: _pipeline_result(p, versions.get(p.name) if versions is not None else None, kv)
             for p in ex.order}
    makespan = max((p.finished_t or 0.0) for p in ex.order)
    bounds = compute_bounds(ex)
    samples = sum(r["samples"] for r in pipes.values())
    tokens = sum(r["generated_tokens"] for r in pipes.values())
    lat = np.asarray(ex.decision_us or [0.0])
    gpus = ex.gpus
    return {
        "policy": ex.policy.name,
        "backend": backend,
        "workload": str(ex.workload.path) if ex.workload.path else None,
        "seed": ex.seed,
        "gpus": gpus,
        "makespan_s": makespan,
        "samples": samples,
        "samples_per_s": samples / makespan if makespan > 0 else 0.0,
        "tokens_per_s": tokens / makespan if makespan > 0 else 0.0,
        "gpu_busy_fraction": ex.busy_s / (gpus * makespan) if makespan > 0 else 0.0,
        "effective_utilisation": bounds.ideal_device_s / (gpus * makespan) if makespan > 0 else 0.0,
        "bounds": bounds.as_dict(),
        "gap_breakdown": gap_breakdown(ex, bounds, makespan),
        "idle_gaps": idle_gaps(ex, makespan),
        "chain_split": chain_split(ex, bounds),
        "active_samples_per_s": _active_samples_per_s(ex),
        "pipelines": pipes,
        "predictor": ex.prediction_log.summary(ex.predictor_name),
        "scheduler": {
            "decisions": int(len(ex.decision_us)),
            "decision_p50_us": float(np.percentile(lat, 50)),
            "decision_p99_us": float(np.percentile(lat, 99)),
            **_replica_launches(ex),
        },
        "sim": {"events": events, "migrations": ex.migrations},
        "cost": cost_result(ex, makespan, samples),
        "preemptions": ex.preemptions.summary() if getattr(ex, "preemptions", None) is not None else None,
    }


def preemption_rows(b: dict, c: dict, short: bool = False) -> list[tuple[str, object, object]]:
    """What preemptions did to each run (``preemptions`` of a simulated result on a pool
    with preemptible classes), where either run lost a device; none otherwise. ``short``:
    labels that fit the printed A/B's column."""
    pb, pc = b.get("preemptions") or {}, c.get("preemptions") or {}
    if not (pb.get("preemptions") or pc.get("preemptions")):
        return []
    labels = (("preemptions", "  requests resumed", "  stages run again") if short else
              ("preemptions (devices lost)", "- requests resumed elsewhere with their tokens",
               "- training stages run again from the last version"))
    keys = ("preemptions", "resumed_requests", "restarted_stages")
    return [(label, pb.get(key), pc.get(key)) for label, key in zip(labels, keys)]


def _over_ideal(own: dict, kind: str) -> float | None:
    """A pipeline's held ``kind`` (rollout, training) device-seconds over its ideal."""
    ideal = own[f"ideal_{kind}_device_s"]
    return own[f"{kind}_device_s"] / ideal if ideal > 0 else None


def pipeline_gap_rows(b: dict, c: dict) -> list[tuple[str, tuple, tuple]]:
    """Each pipeline's rollout and training device-seconds over its own part of the ideal
    (``gap_breakdown.pipelines``) in each run, as ``(pipeline, (rollout, training) of b,
    (rollout, training) of c)`` (None: no ideal to set it against); none where either run
    lacks the split (a result saved before it)."""
    pb = (b.get("gap_breakdown") or {}).get("pipelines")
    pc = (c.get("gap_breakdown") or {}).get("pipelines")
    if not pb or not pc:
        return []
    return [(name, tuple(_over_ideal(own, k) for k in ("rollout", "training")),
             tuple(_over_ideal(pc[name], k) for k in ("rollout", "training")))
            for name, own in pb.items() if name in pc]
