"""Real A/B on mixed hosts: a verl ``main_ppo`` job and an OpenRLHF job at the same time on
one coordinator with a pool of 2 devices, the policy ``jigsaw`` against static halves
(``verl-sync``: each job on its own device).

    flock /tmp/jigsaw-real.lock .venv-verl/bin/python benchmarks/real_ab_mixed.py [--repeats 1]
    .venv-verl/bin/python benchmarks/real_ab_mixed.py --render     # the docs block from the JSON

Each repeat runs both arms one after the other (static halves first), each arm the two jobs
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


def run_arm(policy: str, workdir: Path) -> dict:
    import mixed

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
        **grant_spans(r.events),
    }


def _ok(arm: dict) -> bool:
    return all(j["returncode"] == 0 for j in arm["jobs"].values())


def render(data: dict) -> str:
    reps = [rep for rep in data["repeats"] if all(arm in rep for arm in ARMS)]
    rows = []
    for arm in ARMS:
        runs = [rep[arm] for rep in data["repeats"] if arm in rep]
        if not runs:
            continue
        walls, spans = [r["wall_s"] for r in runs], [r["steps_span_s"] for r in runs]
        last = runs[-1]
        jobs = ", ".join(f"{k} {v['returncode']} ({v['wall_s']:.0f} s)" for k, v in last["jobs"].items())
        rows.append(
            f"| {arm} | {statistics.median(walls):.0f} ({', '.join(f'{w:.0f}' for w in walls)}) | "
            f"{statistics.median(spans):.0f} ({', '.join(f'{w:.0f}' for w in spans)}) | {jobs} | "
            f"{last['cpu_busy_fraction']:.2f} | {last['device_busy_s']:.0f} / {last['device_idle_s']:.0f} | "
            f"{last['grants']} / {last['refusals']} / {last['engine_releases']} | "
            f"{last['orl_rollout_widths']} | {last['peak_pss_gib']:.1f} | "
            f"{last['load_avg_start'][0]:.0f}-{last['load_avg_end'][0]:.0f} | {len(last['problems'])} |")
    pred = data["predicted"]
    ok = reps and all(_ok(rep[arm]) for rep in reps for arm in ARMS)
    if ok:
        med = {arm: statistics.median(rep[arm]["wall_s"] for rep in reps) for arm in ARMS}
        span = {arm: statistics.median(rep[arm]["steps_span_s"] for rep in reps) for arm in ARMS}
        measured = (f"Measured (median of {len(reps)}): jigsaw {med['verl-sync'] / med['jigsaw']:.2f}x the static "
                    f"halves' throughput on the whole run, {span['verl-sync'] / span['jigsaw']:.2f}x on the steps' "
                    f"span (first grant to last release)")
    else:
        measured = "Measured: no ratio (a job of the table did not finish: its exit code is in the table)"
    lines = [
        f"<!-- {BLOCK}:start -->",
        "A verl `main_ppo` job (tiny Qwen2, GRPO without a reference, 1 pretend device, "
        f"{data['steps']['verl']} steps) and an OpenRLHF job (its own `train()`, tiny Qwen2, `group_norm`, 2 engines "
        f"of which 1 is its share, tail consolidation on, {data['steps']['openrlhf']} steps; CPU stand-ins for the "
        "DeepSpeed actors only) on one coordinator with a pool of 2 devices, on this 2-core machine, "
        "shared with other engineers "
        f"(`flock /tmp/jigsaw-real.lock .venv-verl/bin/python benchmarks/real_ab_mixed.py --repeats "
        f"{len(data['repeats'])}`, {data['date']}; `free -g` before: {data.get('free_before', '?')}). verl asks a "
        "grant per stage; OpenRLHF one for its rollout and one for its training phase, and gives an engine's "
        "device back as soon as its tail has migrated away. The OpenRLHF job starts when verl has registered "
        "(verl's start-up is minutes longer: started together, they did not overlap).",
        "",
        "| coordinator policy | wall s, median (each) | steps' span s | per job: exit (wall) | CPU busy "
        "(run's CPU s / wall x 2) | device busy / idle s | grants / refusals / engine releases | OpenRLHF "
        "rollout widths | peak PSS GiB | load avg | failed checks |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"{measured}; the simulator predicts {pred['ratio']:.2f}x for the same declared pipelines (makespan "
        f"{pred['verl-sync']:.1f} s vs {pred['jigsaw']:.1f} s on the `cpu` profile, steps only).",
        "",
        reading(data, reps),
        "",
        "Peak PSS and CPU seconds count this driver's descendants only (the Ray head and workers, both "
        "jobs' drivers, vLLM), not the other engineers' processes on the machine. Device busy / idle: the "
        "coordinator's trace (grants held) against 2 devices x the steps' span.",
        f"<!-- {BLOCK}:end -->",
    ]
    return "\n".join(lines)


def reading(data: dict, reps: list) -> str:
    """What the table shows and why, from what was measured."""
    if not reps:
        return "No repeat has both arms yet."
    last = reps[-1]
    overlap = {arm: last[arm].get("overlap_s") for arm in ARMS}
    start = {arm: last[arm]["wall_s"] - last[arm]["steps_span_s"] for arm in ARMS}
    text = (f"Reading: of each arm's wall time, {start['verl-sync']:.0f} s (static) and {start['jigsaw']:.0f} s "
            f"(jigsaw) pass before the first grant or after the last (the hosts' start-up: Ray workers, FSDP, "
            f"vLLM engines, TransferQueue; OpenRLHF's engines and actors), which no policy touches. ")
    if any(v == 0 for v in overlap.values()):
        text += ("In this run the two jobs' steps did not overlap (first to last grant of each job: "
                 + "; ".join(f"{arm} {last[arm].get('spans')}" for arm in ARMS)
                 + "): verl's steps take 2-3 s here and it finished before the OpenRLHF job, started when verl "
                   "registered, got its first grant, so the ratio measures start-up noise, not sharing. ")
    else:
        text += (f"The jobs' steps overlapped for {overlap['verl-sync']:.0f} s (static) and {overlap['jigsaw']:.0f} s "
                 f"(jigsaw). ")
    text += (f"The run's processes kept the 2 cores {last['verl-sync']['cpu_busy_fraction']:.0%} (static) and "
             f"{last['jigsaw']['cpu_busy_fraction']:.0%} (jigsaw) busy over the whole wall time. What jigsaw may "
             "change here is small: verl's gang and OpenRLHF's training are fixed at 1 device each (they can only "
             "be time-shared), and OpenRLHF's rollout is widened only when the policy lends it its second engine's "
             "device (rollout widths in the table: the policy gave each 8-request rollout one engine).")
    if data.get("corrections"):
        text += " " + data["corrections"]
    return text


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
            data["repeats"].append({})
            for arm in a.arms:
                data["repeats"][i][arm] = run_arm(arm, Path(a.workdir).resolve() / f"r{i}" / arm)
                RESULTS.parent.mkdir(parents=True, exist_ok=True)
                RESULTS.write_text(json.dumps(data, indent=1))  # an arm's result survives a later crash
                print(json.dumps(data["repeats"][i][arm]), flush=True)
    write_doc_block(BLOCK, render(data))
    bad = [r for rep in data["repeats"] for r in rep.values() if not _ok(r)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
