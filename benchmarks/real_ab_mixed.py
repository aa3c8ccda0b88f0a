"""Real A/B on mixed hosts: a verl ``main_ppo`` job and an OpenRLHF job at the same time on
one coordinator with a pool of 2 devices, the policy ``jigsaw`` against static halves
(``verl-sync``: each job on its own device).

    flock /tmp/jigsaw-real.lock .venv-verl/bin/python benchmarks/real_ab_mixed.py [--repeats 1]
    .venv-verl/bin/python benchmarks/real_ab_mixed.py --render     # the docs block from the JSON

    flock /tmp/jigsaw-real.lock .venv-verl/bin/python benchmarks/real_ab_mixed.py --append  # one more repeat

``--append`` exists so that each repeat can run as its own command under the machine's
real-run lock (one repeat is about 8 minutes here). Each repeat runs both arms one after
the other, the order alternating between repeats (static halves first in repeats 0, 2,
...), each arm the two jobs
at once (``integration_tests/openrlhf/mixed.py``: verl 1 pretend device, GRPO, 2 steps;
OpenRLHF 2 engines of which 1 is its share, GRPO-style ``group_norm``, 2 steps, tail
consolidation on). Per arm: wall time, each job's wall and exit code, the peak of the summed
PSS and the CPU seconds of the run's own processes (this driver's descendants: the Ray
head and workers, both jobs), the load average, the grants, refusals and engine releases
the coordinator logged, the devices' busy time in the policy's trace, and the mixed run's
checks (``mixed.problems``). Beside it the simulator's prediction for the same declared
pipelines. Results: benchmarks/results/real_ab_mixed.json; block ``real-ab-mixed`` of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "integration_tests" / "openrlhf"))
sys.path.insert(0, str(ROOT / "benchmarks"))

RESULTS = ROOT / "benchmarks" / "results" / "real_ab_mixed.json"
BLOCK = "real-ab-mixed"
ARMS = ("verl-sync", "jigsaw")
CORES = 2


def predict(settings) -> dict:
    """The simulator on the pipelines as the two jobs declare them: makespan per arm, ratio."""
    import mixed

    from jigsaw_plugin.runtime.host_executor import host_workload
    from jigsaw_plugin.sim import simulate

    wl = host_workload(settings.pool_devices, mixed.declared_hosts(settings))
    out = {arm: round(simulate(wl, arm)["makespan_s"], 2) for arm in ARMS}
    out["ratio"] = round(out["verl-sync"] / out["jigsaw"], 3) if out["jigsaw"] else None
    return out


def steps_span(events: list[dict]) -> float:
    """Seconds from the first grant to the last release in the coordinator's log: the time
    both jobs spent in their steps (their start-up, minutes on CPU, is outside)."""
    ts = [e["t"] for e in events if e.get("hook") in ("jigsaw_stage_granted", "jigsaw_lease_released")]
    return round(max(ts) - min(ts), 1) if ts else 0.0


def grant_spans(events: list[dict]) -> dict:
    """Per pipeline: its first and last stage grant (coordinator clock, s), and the seconds
    both pipelines' spans overlap (0: the jobs ran one after the other, nothing shared)."""
    spans = {}
    for e in events:
        if e.get("hook") == "jigsaw_stage_granted":
            a, b = spans.get(e["pipeline"], (e["t"], e["t"]))
            spans[e["pipeline"]] = (min(a, e["t"]), max(b, e["t"]))
    (a0, a1), (b0, b1) = list(spans.values())[:2] if len(spans) >= 2 else ((0, 0), (0, 0))
    return {"spans": {k: [round(v[0], 1), round(v[1], 1)] for k, v in spans.items()},
            "overlap_s": round(max(0.0, min(a1, b1) - max(a0, b0)), 1)}


def device_holdings(trace: list, span_s: float | None = None) -> dict:
    """Per device, from the coordinator's trace (name, category, devices, start, end; the
    executor's clock): the seconds each pipeline's rollout and training held it (a rollout's
    replica span and its ``gen`` stage span merged, not counted twice) and the seconds
    nothing held it within the trace's span (first hold to last end: it includes OpenRLHF's
    last training phase, which the event log's steps' span, ending at the last lease
    release, does not). ``span_s`` overrides that span (tests)."""
    spans = [x for x in trace if x[2]]
    if not spans:
        return {}
    t0 = min(x[3] for x in spans)
    if span_s is None:
        span_s = max(x[4] for x in spans) - t0
    per: dict = {}
    for name, cat, devices, start, end in spans:
        kind = "rollout" if cat in ("rollout", "gen") else "train"
        for d in devices:
            per.setdefault(str(d), {}).setdefault(f"{name.split()[0]} {kind}", []).append((start, end))
    out = {}
    for d, held in sorted(per.items()):
        row = {k: round(_union_s(v), 1) for k, v in sorted(held.items())}
        row["idle"] = round(max(0.0, span_s - _union_s([iv for v in held.values() for iv in v])), 1)
        out[d] = row
    # per pipeline: its first hold's start and last hold's end, seconds from t0 (same clock)
    windows: dict = {}
    for name, _cat, _devices, start, end in spans:
        a, b = windows.get(name.split()[0], (start, end))
        windows[name.split()[0]] = (min(a, start), max(b, end))
    return {"t0": round(t0, 1), "span_s": round(span_s, 1), "devices": out,
            "windows": {k: [round(a - t0, 1), round(b - t0, 1)] for k, (a, b) in sorted(windows.items())}}


def _union_s(intervals: list) -> float:
    """Seconds covered by the union of (start, end) intervals."""
    total, cur_a, cur_b = 0.0, None, None
    for a, b in sorted(intervals):
        if cur_b is None or a > cur_b:
            total += (cur_b - cur_a) if cur_b is not None else 0.0
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    return total + ((cur_b - cur_a) if cur_b is not None else 0.0)


def run_arm(policy: str, workdir: Path) -> dict:
    import shutil

    import mixed

    # a fresh folder: the hosts append to their event files, and an earlier run's lines
    # there would read as samples trained twice
    shutil.rmtree(workdir, ignore_errors=True)

    s = mixed.MixedSettings(policy=policy, pool_devices=2)
    r = mixed.run_mixed(workdir, s)
    span = steps_span(r.events)
    busy = float(r.scheduler.get("busy_device_s", 0.0))
    return {
        "policy": policy, "wall_s": r.wall_s, "steps_span_s": span,
        "jobs": {j.name: {"returncode": j.returncode, "wall_s": j.wall_s, "log": j.log_path} for j in r.jobs},
        "peak_pss_gib": r.peak_pss_gib, "cpu_s": r.cpu_s,
        "cpu_busy_fraction": round(r.cpu_s / (r.wall_s * CORES), 3) if r.wall_s else None,
        "load_avg_start": list(r.load_avg_start), "load_avg_end": list(r.load_avg_end),
        "grants": sum(1 for e in r.events if e.get("hook") == "jigsaw_stage_granted"),
        "orl_rollout_widths": [len(e["devices"]) for e in r.events if e.get("hook") == "jigsaw_stage_granted"
                               and e["pipeline"] == mixed.ORL and e["stage"] == "gen"],
        "refusals": len(r.scheduler.get("refusals", [])),
        "engine_releases": len(mixed.partial_releases(r)),
        "device_busy_s": round(busy, 1),
        "device_idle_s": round(max(0.0, s.pool_devices * span - busy), 1),
        "problems": mixed.problems(r),
        "holdings": device_holdings(r.scheduler.get("trace", [])),
        "trace": r.scheduler.get("trace", []),  # the coordinator's device trace, for later readings
        "migrations": sum(1 for e in mixed.read_jsonl(r.jobs[1].events_path) if e["hook"] == "jigsaw_request_migrated"),
        # the moves the policy chose for OpenRLHF's requests: issued / carried out / dropped
        "policy_migrations": _by_status(mixed.policy_migrations(r)),
        **grant_spans(r.events),
    }


def _by_status(moves: list) -> dict:
    return {st: sum(m["status"] == st for m in moves) for st in ("done", "dropped", "open")}


def _ok(arm: dict) -> bool:
    return all(j["returncode"] == 0 for j in arm["jobs"].values())


def _moves(run: dict) -> str:
    """OpenRLHF's requests moved (its own events), and the policy's commands done / dropped."""
    pm = run.get("policy_migrations") or {}
    return f"{run.get('migrations', '?')} ({pm.get('done', 0)} done / {pm.get('dropped', 0)} dropped)"


def _load(run: dict) -> str:
    return f"{run['load_avg_start'][0]:.0f}-{run['load_avg_end'][0]:.0f}"


def _median_run(runs: list, key: str) -> dict:
    """The run whose ``key`` is the median (the lower middle of an even count)."""
    return sorted(runs, key=lambda r: r[key])[(len(runs) - 1) // 2]


def render(data: dict) -> str:
    reps = [rep for rep in data["repeats"] if all(arm in rep for arm in ARMS)]
    rows = []
    for arm in ARMS:
        runs = [rep[arm] for rep in data["repeats"] if arm in rep]
        if not runs:
            continue
        walls, spans = [r["wall_s"] for r in runs], [r["steps_span_s"] for r in runs]
        mid = _median_run(runs, "steps_span_s")
        jobs = ", ".join(f"{k} {v['returncode']} ({v['wall_s']:.0f} s)" for k, v in mid["jobs"].items())
        rows.append(
            f"| {arm} | {statistics.median(walls):.0f} ({', '.join(f'{w:.0f}' for w in walls)}) | "
            f"{statistics.median(spans):.0f} ({', '.join(f'{w:.0f}' for w in spans)}) | {jobs} | "
            f"{mid['cpu_busy_fraction']:.2f} | {mid['device_busy_s']:.0f} / {mid['device_idle_s']:.0f} | "
            f"{mid['grants']} / {mid['refusals']} / {mid['engine_releases']} / {_moves(mid)} | "
            f"{mid['orl_rollout_widths']} | {max(r['peak_pss_gib'] for r in runs):.1f} | "
            f"{', '.join(_load(r) for r in runs)} | "
            f"{sum(len(r['problems']) for r in runs)} |")
    pred = data["predicted"]
    ok = reps and all(_ok(rep[arm]) for rep in reps for arm in ARMS)
    if ok:
        med = {arm: statistics.median(rep[arm]["wall_s"] for rep in reps) for arm in ARMS}
        span = {arm: statistics.median(rep[arm]["steps_span_s"] for rep in reps) for arm in ARMS}
        per = "; ".join(
            f"repeat {i} ({' then '.join(rep.get('order', ARMS))}, load "
            f"{max(rep[a]['load_avg_end'][0] for a in ARMS):.0f}): "
            f"{rep['verl-sync']['wall_s'] / rep['jigsaw']['wall_s']:.2f}x wall, "
            f"{rep['verl-sync']['steps_span_s'] / rep['jigsaw']['steps_span_s']:.2f}x span"
            for i, rep in enumerate(reps))
        ratio_span = span['verl-sync'] / span['jigsaw']
        off = abs(ratio_span - pred["ratio"]) / pred["ratio"] if pred.get("ratio") else None
        measured = (f"Measured (median of {len(reps)}): jigsaw {med['verl-sync'] / med['jigsaw']:.2f}x the static "
                    f"halves' throughput on the whole run, {ratio_span:.2f}x on the steps' "
                    f"span (first grant to last release); per repeat: {per}")
        versus = f" The steps' span ratio is {off:.0%} off the prediction." if off is not None else ""
    else:
        measured, versus = "Measured: no ratio (a job of the table did not finish: its exit code is in the table)", ""
    dates = sorted({rep.get("date", data["date"]) for rep in data["repeats"]})
    lines = [
        f"<!-- {BLOCK}:start -->",
        "A verl `main_ppo` job (tiny Qwen2, GRPO without a reference, 1 pretend device, "
        f"{data['steps']['verl']} steps) and an OpenRLHF job (its own `train()`, tiny Qwen2, `group_norm`, 2 engines "
        f"of which 1 is its share, {data['steps']['openrlhf']} steps; CPU stand-ins for the "
        "DeepSpeed actors only) on one coordinator with a pool of 2 devices, on this 2-core machine, "
        "shared with other engineers (each repeat its own locked command: "
        "`flock /tmp/jigsaw-real.lock .venv-verl/bin/python benchmarks/real_ab_mixed.py` for the first, "
        f"`... --append` for the next; {', '.join(dates)}; commits "
        f"{', '.join(sorted({rep.get('commit', '?') for rep in data['repeats']}))}; `free -g` before: "
        f"{'; '.join(rep.get('free_before', data.get('free_before', '?')) for rep in data['repeats'])}). "
        "The arms' order alternates between repeats. verl asks a grant per stage; OpenRLHF one for its rollout "
        "and one for its training phase; under a coordinator policy the policy chooses which of OpenRLHF's "
        "requests migrate (OpenRLHF carries the commands out and gives an emptied engine's device back at once). The OpenRLHF job starts when verl has registered (verl's start-up is minutes longer: "
        "started together, they did not overlap).",
        "",
        "| coordinator policy | wall s, median (each) | steps' span s, median (each) | per job: exit (wall), median "
        "run | CPU busy (run's CPU s / wall x 2) | device busy / idle s | grants / refusals / engine releases / "
        "OpenRLHF requests moved (policy commands done / dropped) | OpenRLHF rollout widths | peak PSS GiB (max) | load avg per run | failed checks |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"{measured}. The simulator predicts {pred['ratio']:.2f}x for the same declared pipelines (makespan "
        f"{pred['verl-sync']:.1f} s vs {pred['jigsaw']:.1f} s on the `cpu` profile, steps only).{versus}",
        "",
        holdings_table(data, reps),
        "",
        reading(data, reps),
        "",
        "Peak PSS and CPU seconds count this driver's descendants only (the Ray head and workers, both "
        "jobs' drivers, vLLM), not the other engineers' processes on the machine. Device busy / idle: the "
        "coordinator's trace (grants held) against 2 devices x the steps' span.",
        f"<!-- {BLOCK}:end -->",
    ]
    return "\n".join(lines)


def holdings_table(data: dict, reps: list) -> str:
    """Per device of each arm's latest run whose trace was kept: what held it, its idle seconds."""
    rows, keys = [], []
    for arm in ARMS:
        runs = [(i, rep[arm]) for i, rep in enumerate(reps) if (rep[arm].get("holdings") or {}).get("span_s")]
        if runs:
            i, run = runs[-1]
            h = run["holdings"]
            for d, row in h["devices"].items():
                keys += [k for k in row if k != "idle" and k not in keys]
                rows.append((arm, i, d, row, h["span_s"]))
    if not rows:
        return "Per device: not recorded in these repeats."
    head = ["policy", "repeat", "device", *keys, "idle", "trace span"]
    out = ["Per device (each arm's latest repeat with its trace kept; seconds, from the coordinator's device trace, "
           "first hold to last end): what held it.", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += [f"| {arm} | {i} | {d} | " + " | ".join(f"{row.get(k, 0.0):.1f}" for k in keys)
            + f" | {row['idle']:.1f} | {span:.1f} |" for arm, i, d, row, span in rows]
    return "\n".join(out)


def reading(data: dict, reps: list) -> str:
    """What the table shows and why, from what was measured."""
    if not reps:
        return "No repeat has both arms yet."
    mid = {arm: _median_run([rep[arm] for rep in reps], "steps_span_s") for arm in ARMS}
    overlap = {arm: mid[arm].get("overlap_s") for arm in ARMS}
    start = {arm: mid[arm]["wall_s"] - mid[arm]["steps_span_s"] for arm in ARMS}
    text = (f"Reading (median runs): of each arm's wall time, {start['verl-sync']:.0f} s (static) and "
            f"{start['jigsaw']:.0f} s (jigsaw) pass before the first grant or after the last (the hosts' start-up: "
            "Ray workers, FSDP, vLLM engines, TransferQueue; OpenRLHF's engines and actors), which no policy "
            "touches. ")
    if any(v == 0 for v in overlap.values()):
        text += ("In a median run the two jobs' steps did not overlap (first to last grant of each job: "
                 + "; ".join(f"{arm} {mid[arm].get('spans')}" for arm in ARMS) + "), so the ratio measures "
                 "start-up noise, not sharing. ")
    else:
        text += (f"The jobs' steps overlapped for {overlap['verl-sync']:.0f} s (static) and {overlap['jigsaw']:.0f} s "
                 f"(jigsaw). ")
    text += idle_reading(reps)
    text += same_allocation(reps)
    text += (f"The run's processes kept the 2 cores {mid['verl-sync']['cpu_busy_fraction']:.0%} (static) and "
             f"{mid['jigsaw']['cpu_busy_fraction']:.0%} (jigsaw) busy over the whole wall time: a device idle in "
             "the coordinator's trace is not an idle core (the other job's processes, start-up and the drivers' "
             "own work run on it), so lending it buys little on 2 cores. What jigsaw may change here is small: "
             "verl's gang and OpenRLHF's training are fixed at 1 device each (they can only be time-shared), and "
             "OpenRLHF's rollout is widened only when the policy lends it its second engine's device (rollout "
             "widths in the table).")
    if data.get("corrections"):
        text += " " + data["corrections"]
    return text


def _commit() -> str:
    import subprocess

    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()


def same_allocation(reps: list) -> str:
    """Whether jigsaw did anything static halves did not: a wider OpenRLHF rollout, a move,
    an engine released mid-rollout; if not, the ratios are run-to-run noise."""
    moved = sum(rep["jigsaw"].get("migrations", 0) + rep["jigsaw"]["engine_releases"] for rep in reps)
    wider = any(w > 1 for rep in reps for w in rep["jigsaw"]["orl_rollout_widths"])
    if moved or wider:
        return ""
    spans = [rep["verl-sync"]["steps_span_s"] / rep["jigsaw"]["steps_span_s"] for rep in reps]
    loads = [x for rep in reps for arm in ARMS for x in (rep[arm]["load_avg_start"][0], rep[arm]["load_avg_end"][0])]
    return (f"In every repeat jigsaw made the allocation static halves make: each OpenRLHF rollout on one engine, no "
            f"request moved, no engine released (verl holds the other device through its back-to-back steps), so "
            f"the spread of the per-repeat ratios ({min(spans):.2f}-{max(spans):.2f}x on the span, at load averages of "
            f"{min(loads):.0f}-{max(loads):.0f} with other engineers' work) is run-to-run noise, not a gain of the policy. ")


def idle_reading(reps: list) -> str:
    """Per arm (the holdings table's run): each device's idle seconds of the trace's span,
    and when each job held devices."""
    parts = []
    for arm in ARMS:
        runs = [rep[arm] for rep in reps if (rep[arm].get("holdings") or {}).get("span_s")]
        if not runs:
            continue
        h = runs[-1]["holdings"]
        idle = ", ".join(f"device {d} {row['idle']:.0f} s" for d, row in h["devices"].items())
        when = ", ".join(f"{k} {a:.0f}-{b:.0f} s" for k, (a, b) in (h.get("windows") or {}).items())
        parts.append(f"{arm}: {idle} idle of {h['span_s']:.0f} s (held: {when})")
    if not parts:
        return ""
    return ("Idle devices (the table above): " + "; ".join(parts) + ". The idle device is the one the "
            "OpenRLHF job holds while it runs its steps: idle before it starts them (it starts once verl has "
            "registered, then needs its own start-up) and after it ends, while verl, which runs through the "
            "whole span, cannot take it: its rollout has one server (no second replica to wake) and its training "
            "gang is fixed at one device, so the policy can only time-share devices between the jobs, and while "
            "OpenRLHF runs both are busy. ")


def main(argv: list[str] | None = None) -> int:
    import mixed

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    p.add_argument("--workdir", default="build/real-ab-mixed")
    p.add_argument("--render", action="store_true", help="re-render the docs block from the saved JSON")
    p.add_argument("--append", action="store_true", help="add the repeats to the saved JSON")
    a = p.parse_args(argv)
    from common import write_doc_block

    if a.render:
        data = json.loads(RESULTS.read_text())
    else:
        import subprocess

        free = subprocess.run(["free", "-g"], capture_output=True, text=True).stdout.splitlines()[1].split()
        if a.append and RESULTS.exists():
            data = json.loads(RESULTS.read_text())
        else:
            s = mixed.MixedSettings(pool_devices=2)
            data = {"steps": {"verl": s.verl_steps, "openrlhf": s.orl_steps}, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "free_before": f"{free[1]} GiB total, {free[6]} available", "repeats": []}
        data["predicted"] = predict(mixed.MixedSettings(pool_devices=2))
        for _ in range(a.repeats):
            i = len(data["repeats"])
            data["repeats"].append({"order": [], "commit": _commit(), "free_before": f"{free[1]} GiB total, {free[6]} available",
                                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})
            order = list(a.arms) if i % 2 == 0 else list(reversed(a.arms))  # alternating: drift hits both arms
            for arm in order:
                data["repeats"][i]["order"].append(arm)
                data["repeats"][i][arm] = run_arm(arm, Path(a.workdir).resolve() / f"r{i}" / arm)
                RESULTS.parent.mkdir(parents=True, exist_ok=True)
                RESULTS.write_text(json.dumps(data, indent=1))  # an arm's result survives a later crash
                print(json.dumps(data["repeats"][i][arm]), flush=True)
    write_doc_block(BLOCK, render(data))
    bad = [rep[arm] for rep in data["repeats"] for arm in ARMS if arm in rep and not _ok(rep[arm])]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
