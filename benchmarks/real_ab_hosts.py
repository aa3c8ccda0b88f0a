"""Real A/B on hosts: two verl ``main_ppo`` jobs on one CPU pool, the coordinator's policy
``jigsaw`` against static halves (``verl-sync``: each job on its own device).

    .venv-verl/bin/python benchmarks/real_ab_hosts.py [--repeats 1] [--steps 4]   # a fresh JSON
    .venv-verl/bin/python benchmarks/real_ab_hosts.py --append    # one more repeat into the JSON
    .venv-verl/bin/python benchmarks/real_ab_hosts.py --render    # the docs block from the JSON
    .venv-verl/bin/python benchmarks/real_ab_hosts.py --migration [--append|--render]   # the pair with migration

``--migration``: the pair of integration_tests/verl/test_host_migration.py instead: ``verl-a``
with 2 pretend devices (two vLLM servers behind the jigsaw balancer: ``migration=true``, the
policy chooses which requests move) beside ``verl-b`` with one, a pool of 3, responses up to
256 tokens; results in benchmarks/results/real_ab_hosts_migration.json, block
``real-ab-hosts-migration``; each arm also counts the migrations chosen, carried out and
dropped, and the tokens they kept.

Each repeat runs both arms one after the other, the order alternating between repeats
(static first in repeats 0, 2, ...), each arm two jobs at the same time
(``adapters/verl/cpu_two_jobs.run_concurrent``). ``--append`` exists so that each repeat
can run as its own command under the machine's real-run lock. Per arm: wall time (launch to
both exits: start-up included), the steps' span (the coordinator's clock, first grant to
the last granted stage's end), exit codes, the peak PSS sum of every process of the run,
the machine's CPU busy fraction and load, each job's time per stage (its own hook
reports) and between stages (driver-side work and waits on grants), the devices each job's
stages ran on, the grants, refusals, and the checks of integration_tests/verl/
test_host_policy.py (``grant_problems``, ``verl_log_problems``). Next to it, the
simulator's prediction for the same pipelines (the ``HostPipeline``s the sessions declare,
on the ``cpu`` profile). Results: benchmarks/results/real_ab_hosts.json; the block
``real-ab-hosts`` of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from common import write_doc_block  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "real_ab_hosts.json"
BLOCK = "real-ab-hosts"
MIGRATION_RESULTS = ROOT / "benchmarks" / "results" / "real_ab_hosts_migration.json"
MIGRATION_BLOCK = "real-ab-hosts-migration"
ARMS = ("verl-sync", "jigsaw")
STAGES = ("gen", "old_log_prob", "update_actor", "weight_sync")
MIGRATION_RESPONSE_LEN = 256


def declared_hosts(steps: int, migration: bool = False):
    """The pipelines as the verl sessions declare them (cpu_e2e's settings, 1 device each;
    ``migration``: ``verl-a`` with 2 devices and two servers behind the jigsaw balancer)."""
    from jigsaw_plugin.runtime.capabilities import HostCapabilities
    from jigsaw_plugin.runtime.host_executor import HostPipeline

    caps = HostCapabilities("verl", training_width=1)
    if not migration:
        return [HostPipeline(name, "tiny-qwen2", "dapo", 2, 2, 16, 64, steps, 1, caps)
                for name in ("verl-a", "verl-b")]
    two = HostCapabilities("verl", rollout_replicas=2, migration=True, training_width=2)
    return [HostPipeline("verl-a", "tiny-qwen2", "dapo", 2, 2, MIGRATION_RESPONSE_LEN, 64, steps, 2, two,
                         servers=("server-0", "server-1")),
            HostPipeline("verl-b", "tiny-qwen2", "dapo", 2, 2, MIGRATION_RESPONSE_LEN, 64, steps, 1, caps)]


def predict(steps: int, migration: bool = False) -> dict:
    """The simulator on the same pipelines: makespan per arm and the ratio."""
    from jigsaw_plugin.runtime.host_executor import host_workload
    from jigsaw_plugin.sim import simulate

    wl = host_workload(3 if migration else 2, declared_hosts(steps, migration))
    out = {arm: simulate(wl, arm)["makespan_s"] for arm in ARMS}
    out["ratio"] = round(out["verl-sync"] / out["jigsaw"], 3) if out["jigsaw"] else None
    return out


def job_time(events_path: str) -> dict:
    """One job's time from its own event file (one clock): per stage the mean seconds of the
    steps after the first (step 0 carries the warm-up), the first and later steps' spans, the
    time between stages in the later steps (driver-side work and grant waits), and the
    devices its granted stages ran on."""
    p = Path(events_path)
    events = [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []
    starts = {(e["step"], e["stage"]): e for e in events if e["hook"] == "jigsaw_stage_start"}
    ends = {(e["step"], e["stage"]): e for e in events if e["hook"] == "jigsaw_stage_end"}
    steps = sorted({k for k, _ in starts})
    if not steps:
        return {}
    later = steps[1:] or steps  # step 0 carries the warm-up (first vLLM batch, first FSDP pass)
    per_stage = {st: round(statistics.mean(ends[(k, st)]["t"] - starts[(k, st)]["t"] for k in later
                                           if (k, st) in ends and (k, st) in starts), 3)
                 for st in STAGES if any((k, st) in ends for k in later)}
    step_start = {e["step"]: e["t"] for e in events if e["hook"] == "jigsaw_step_start"}
    step_end = {e["step"]: e["t"] for e in events if e["hook"] == "jigsaw_step_end"}
    spans = [step_end[k] - step_start[k] for k in steps if k in step_start and k in step_end]
    inside = [sum(ends[(k, st)]["t"] - starts[(k, st)]["t"] for (kk, st) in starts if kk == k and (k, st) in ends)
              for k in steps]
    devices = sorted({d for e in starts.values() for d in e.get("devices", [])})
    return {"stage_s": per_stage, "step_s": round(statistics.mean(spans), 3) if spans else None,
            "between_stages_s": round(statistics.mean(s - i for s, i in list(zip(spans, inside))[1:]
                                                      or zip(spans, inside)), 3) if spans else None,
            "first_step_s": round(spans[0], 3) if spans else None,
            "later_steps_s": round(statistics.mean(spans[1:]), 3) if len(spans) > 1 else None,
            "devices": devices}


def steps_span(report: dict) -> tuple[float, dict]:
    """From the coordinator's device trace: the steps' span (first grant to last end) and
    each device's busy fraction of it."""
    trace = [x for x in report.get("trace", []) if x[2]]
    if not trace:
        return 0.0, {}
    t0, t1 = min(x[3] for x in trace), max(x[4] for x in trace)
    busy: dict = {}
    for _, _, devices, start, end in trace:
        for d in devices:
            busy[d] = busy.get(d, 0.0) + (end - start)
    span = t1 - t0
    return round(span, 2), {str(d): round(b / span, 3) if span else None for d, b in sorted(busy.items())}


def migrations(events: list[dict]) -> dict:
    """The coordinator's record of the migrations its policy chose for the hosts' requests."""
    count = lambda hook: [e for e in events if e.get("hook") == hook]  # noqa: E731
    done = count("jigsaw_migration_done")
    return {"issued": len(count("jigsaw_migration_issued")), "carried_out": len(done),
            "dropped": len(count("jigsaw_migration_dropped")),
            "tokens_kept": sum(int(e.get("generated_tokens", 0)) for e in done)}


def run_arm(policy: str, steps: int, workdir: Path, migration: bool = False) -> dict:
    import psutil

    from jigsaw_plugin.adapters.verl.cpu_two_jobs import grant_problems, run_concurrent, verl_log_problems

    cpu0 = psutil.cpu_times()
    load0 = os.getloadavg()
    mem0 = psutil.virtual_memory()
    if migration:
        r = run_concurrent(workdir / policy, steps=steps, policy=policy, pool_devices=3, job_devices=(2, 1),
                           routed=("verl-a",), response_len=MIGRATION_RESPONSE_LEN)
    else:
        r = run_concurrent(workdir / policy, steps=steps, policy=policy, pool_devices=2)
    cpu1 = psutil.cpu_times()
    busy = lambda c: sum(c) - c.idle - getattr(c, "iowait", 0.0)  # noqa: E731
    total = sum(cpu1) - sum(cpu0)
    grants = [e for e in r.events if e.get("hook") == "jigsaw_stage_granted"]
    refused = [e for e in r.events if e.get("hook") == "jigsaw_decision_refused"]
    span, device_busy = steps_span(r.scheduler)
    return {
        "policy": policy, "wall_s": r.wall_s, "steps_span_s": span, "device_busy_fraction": device_busy,
        "returncodes": [x.returncode for x in r.runs],
        "peak_pss_gib": r.peak_pss_gib,
        "cpu_busy_fraction": round((busy(cpu1) - busy(cpu0)) / total, 3) if total else None,
        "load_avg_start": [round(x, 2) for x in load0], "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        "available_gib_start": round(mem0.available / 2**30, 1),
        "grants": len(grants), "refusals": len(refused), "adapted": len(r.scheduler.get("adapted", [])),
        "adapted_decisions": [f"{x['decision']} -> {x['carried_out']}" for x in r.scheduler.get("adapted", [])],
        # the policy's own time in the coordinator (its decide rounds), CPU taken from the jobs
        "decisions": r.scheduler.get("decisions"), "decision_s": r.scheduler.get("decision_s"),
        "jobs": {name: job_time(x.events_path) for name, x in zip(("verl-a", "verl-b"), r.runs)},
        "logs": [x.log_path for x in r.runs],
        # integration_tests/verl/test_host_policy.py's checks on this arm's run
        "grant_problems": grant_problems(r, steps),
        "verl_log_problems": verl_log_problems(r, steps),
        "migrations": migrations(r.events),
    }


def _ok(data: dict) -> bool:
    return all(rc == 0 for rep in data["repeats"] for r in rep.values() for rc in r["returncodes"])


def _later_step(arm: dict) -> float:
    """The mean step after the first (step 0 carries the warm-up), over both jobs."""
    return statistics.mean(j["later_steps_s"] for j in arm["jobs"].values() if j and j.get("later_steps_s"))


def _median(data: dict, arm: str, key: str) -> float:
    return statistics.median(rep[arm][key] for rep in data["repeats"])


def render(data: dict) -> str:
    reps = data["repeats"]
    n = len(reps)
    rows = []
    for arm in ARMS:
        walls = [rep[arm]["wall_s"] for rep in reps]
        spans = [rep[arm]["steps_span_s"] for rep in reps]
        held = reps[-1][arm]["device_busy_fraction"]
        rows.append(
            f"| {arm} | {statistics.median(walls):.1f} ({', '.join(f'{w:.1f}' for w in walls)}) | "
            f"{statistics.median(spans):.1f} ({', '.join(f'{s:.1f}' for s in spans)}) | "
            f"{statistics.median(_later_step(rep[arm]) for rep in reps):.2f} | "
            f"{' / '.join(f'{held[d]:.2f}' for d in sorted(held))} | "
            f"{' / '.join(' '.join(str(c) for c in rep[arm]['returncodes']) for rep in reps)} | "
            f"{max(rep[arm]['peak_pss_gib'] for rep in reps):.1f} | "
            f"{statistics.median(rep[arm]['cpu_busy_fraction'] for rep in reps):.2f} | "
            f"{sum(rep[arm]['grants'] for rep in reps)} / {sum(rep[arm]['refusals'] for rep in reps)} | "
            f"{sum(len(rep[arm]['grant_problems']) + len(rep[arm]['verl_log_problems']) for rep in reps)} |")
    pred = data["predicted"]
    loads = [x for rep in reps for r in rep.values() for x in (r["load_avg_start"][0], r["load_avg_end"][0])]
    migration = data.get("migration", False)
    pair = ("`verl-a` with 2 pretend devices (two vLLM servers behind the jigsaw balancer, which declares "
            "`migration=true`: the policy chooses which of its requests move; responses up to "
            f"{MIGRATION_RESPONSE_LEN} tokens) and `verl-b` with 1) at the same time on one coordinator with a pool "
            "of 3 devices"
            if migration else "1 pretend device each) at the same time on one coordinator with a pool of 2 devices")
    command = "benchmarks/real_ab_hosts.py" + (" --migration" if migration else "")
    lines = [
        f"Two verl `main_ppo` jobs (tiny Qwen2, GRPO advantages without a reference model, {data['steps']} steps"
        f", {pair}, on this 2-core "
        f"machine; each stage of each job waits for the coordinator's grant and the policy decides every grant. "
        f"{n} repeat(s), the arms' order alternating (`.venv-verl/bin/python {command}`, then "
        f"`--append` per further repeat, each under the real-run lock; {data['date']}). Load average (1 min) "
        f"{min(loads):.1f}-{max(loads):.1f} at the arms' starts and ends; memory available at the arms' starts "
        f"{min(r['available_gib_start'] for rep in reps for r in rep.values()):.1f}-"
        f"{max(r['available_gib_start'] for rep in reps for r in rep.values()):.1f} GiB of 23.5.",
        "",
        "| coordinator policy | wall s, median (each) | steps' span s, median (each) | later step s (median) "
        f"| devices {' / '.join(str(d) for d in range(3 if migration else 2))} held by grants (last repeat) "
        "| exit codes | peak PSS GiB | CPU busy | grants / refusals | failed checks |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    if _ok(data):
        wall = _median(data, "verl-sync", "wall_s") / _median(data, "jigsaw", "wall_s")
        span = _median(data, "verl-sync", "steps_span_s") / _median(data, "jigsaw", "steps_span_s")
        per = ", ".join(f"{rep['verl-sync']['steps_span_s'] / rep['jigsaw']['steps_span_s']:.2f}" for rep in reps)
        later = (statistics.median(_later_step(rep["verl-sync"]) for rep in reps)
                 / statistics.median(_later_step(rep["jigsaw"]) for rep in reps))
        off = abs(span - pred["ratio"]) / pred["ratio"] if pred["ratio"] else None
        lines.append(
            f"Measured (median of {n}): jigsaw {span:.2f}x the static halves' throughput over the steps' span "
            f"(per repeat {per}), {later:.2f}x in the later steps' time, {wall:.2f}x over the whole wall time "
            f"(start-up included). The simulator predicts {pred['ratio']:.2f}x for the same declared pipelines "
            f"(makespan {pred['verl-sync']:.1f} s vs {pred['jigsaw']:.1f} s on the `cpu` profile): the steps' span "
            f"ratio is {off:.0%} off it. Its absolute makespan is not comparable (below).")
    else:
        lines.append("Measured: no ratio (a job did not finish: see the exit codes and the JSON's logs).")
    lines += ["", "Where the time went (last repeat; per job, seconds, from the job's own event file; stages and "
              "'between stages' are means over the steps after the first, which carries the warm-up):", "",
              "| policy | job | devices its stages ran on | step (first / later) | gen | old_log_prob | update_actor "
              "| weight_sync | between stages |",
              "|---|---|---|---|---|---|---|---|---|"]
    last = reps[-1]
    for arm in ARMS:
        for name, j in last[arm]["jobs"].items():
            if not j:
                continue
            st = j["stage_s"]
            lines.append(f"| {arm} | {name} | {j['devices']} | {j['first_step_s']:.2f} / {j['later_steps_s'] or 0:.2f} | "
                         f"{st.get('gen', 0):.2f} | {st.get('old_log_prob', 0):.2f} | {st.get('update_actor', 0):.2f} | "
                         f"{st.get('weight_sync', 0):.2f} | {j['between_stages_s']:.2f} |")
    lines += ["", why_migration(data) if migration else why(data), "",
              "Peak PSS: the summed proportional set size of the benchmark process and all its descendants (the Ray "
              "head, its workers, both main_ppo drivers, their vLLM engines), sampled every 2 s."]
    return "\n".join(lines)


def why_migration(data: dict) -> str:
    """The reading of the migration pair's table, from what was measured."""
    if not _ok(data):
        return "What happened: see the exit codes (the JSON lists the logs)."
    reps = data["repeats"]
    moved = {arm: [rep[arm].get("migrations", {}) for rep in reps] for arm in ARMS}
    total = lambda arm, key: sum(m.get(key, 0) for m in moved[arm])  # noqa: E731
    gen = {(arm, job): statistics.median(rep[arm]["jobs"][job]["stage_s"].get("gen", 0.0) for rep in reps)
           for arm in ARMS for job in ("verl-a", "verl-b")}
    first = {arm: statistics.median(j["first_step_s"] for rep in reps for j in rep[arm]["jobs"].values())
             for arm in ARMS}
    later = (statistics.median(_later_step(rep["verl-sync"]) for rep in reps)
             / statistics.median(_later_step(rep["jigsaw"]) for rep in reps))
    steps = data["steps"]
    own = {arm: statistics.median(max(j["first_step_s"] + (steps - 1) * (j["later_steps_s"] or 0.0)
                                      for j in rep[arm]["jobs"].values()) for rep in reps) for arm in ARMS}
    span = {arm: _median(data, arm, "steps_span_s") for arm in ARMS}
    return (
        f"**Migrations.** Under jigsaw the policy chose {total('jigsaw', 'issued')} moves of `verl-a`'s requests "
        f"over {len(reps)} repeat(s): {total('jigsaw', 'carried_out')} carried out by verl's balancer, "
        f"{total('jigsaw', 'dropped')} dropped, {total('jigsaw', 'tokens_kept')} tokens kept across them; under "
        f"static halves {total('verl-sync', 'issued')}. **Reading.** The steps' span runs from either job's first "
        "grant to the last end, so it also counts how far apart the two jobs' start-ups put their first steps: the "
        f"longer job's own steps took {own['jigsaw']:.1f} s under jigsaw against {own['verl-sync']:.1f} s under "
        f"static halves (median; spans {span['jigsaw']:.1f} s and {span['verl-sync']:.1f} s). Per step, both "
        f"arms' first steps carry the warm-up (median {first['verl-sync']:.1f} s under verl-sync, "
        f"{first['jigsaw']:.1f} s under jigsaw, over both jobs) and the later steps are {later:.2f}x. There, "
        f"`verl-a`'s rollout took {gen[('jigsaw', 'verl-a')]:.2f} s under jigsaw against "
        f"{gen[('verl-sync', 'verl-a')]:.2f} s under static halves (median per step after the first): each move "
        "costs verl at least 1 s of the request's time (its resume loop sleeps 1 s after an aborted attempt, which "
        "the cost model's migration price does not include), and the moved requests then share one server. "
        f"`verl-b`'s rollout took {gen[('jigsaw', 'verl-b')]:.2f} s against {gen[('verl-sync', 'verl-b')]:.2f} s. "
        "What the moves free cannot pay here: a share cannot exceed the pool, so the pair needs a pool of 3 for "
        "its 2 + 1 devices, and the freed device has no taker that could use it (`verl-b`'s gang and server are "
        "fixed at its own device; `verl-a`'s fixed servers cannot take it back: `replicas_elastic=false`); on CPU "
        "a pretend device is not a core (both jobs share the 2 cores whatever the grants say). The simulator's "
        "figure is for the same declared pipelines on its `cpu` profile.")


def why(data: dict) -> str:
    """The reading of the table: what limits the pair, from what was measured."""
    if not _ok(data):
        return ("What happened: see the exit codes; a job killed by Ray's memory monitor shows it in its log "
                "(the JSON lists the logs).")
    last = data["repeats"][-1]
    j = last["jigsaw"]["jobs"]
    between = statistics.mean(x["between_stages_s"] for x in j.values())
    later = statistics.mean(x["later_steps_s"] or 0 for x in j.values())
    wall_minus_span = _median(data, "jigsaw", "wall_s") - _median(data, "jigsaw", "steps_span_s")
    timed = [(rep[arm]["decision_s"], rep[arm]["decisions"]) for rep in data["repeats"] for arm in ("jigsaw",)
             if rep[arm].get("decision_s") is not None]
    decide = (f"jigsaw's decide rounds took {statistics.median(t for t, _ in timed):.2f} s of CPU over "
              f"{statistics.median(k for _, k in timed):.0f} rounds per arm, median of {len(timed)}" if timed else
              "the decide time was not recorded in these repeats")
    first = {arm: statistics.median(x["first_step_s"] for rep in data["repeats"] for x in rep[arm]["jobs"].values())
             for arm in ARMS}
    adapted = sum(r["adapted"] for rep in data["repeats"] for r in rep.values())
    wider = sum(1 for rep in data["repeats"] for r in rep.values() for x in r.get("adapted_decisions", []))
    quiet = min(data["repeats"], key=lambda rep: min(r["load_avg_start"][0] for r in rep.values()))
    quiet_load = min(r["load_avg_start"][0] for r in quiet.values())
    quiet_ratio = quiet["verl-sync"]["steps_span_s"] / quiet["jigsaw"]["steps_span_s"]
    pred = data["predicted"]["ratio"]
    return (
        "**Why the pair cannot gain here.** What verl can carry out leaves the policy nothing to move. Its FSDP "
        "gang is fixed at one device when verl builds its worker groups (`training_resizable=false`), it has one "
        "rollout server and cannot add one (`replicas_elastic=false`: the policy cannot put a job's rollout on the "
        "other job's idle device), and the coordinator does not see its requests (`migration=false`). A grant's "
        "device is the pool's bookkeeping: verl's worker stays on the Ray placement it got at start-up. So jigsaw "
        "decides *when* each stage runs, and with one device per job neither job ever waits on the other. It did try "
        f"more: {adapted} of its decisions were adapted" + (
            f" (the {wider} recorded: a job's `old_log_prob` and `update_actor` asked on both devices while the "
            "other job's device was free, carried out on one)" if wider else "")
        + ": the gang is fixed. The devices-held column shows how much of each device was held by grants over the "
          "steps' span (a rollout grant counts from the policy's launch of the job's server, which may precede the "
          f"job's ask): little is left to lend. {between:.1f} s of a {later:.1f} s later step is outside the granted "
          "stages (verl's driver work, the agent loop's hand-offs, grant round trips). On CPU a pretend device is not "
          "a core: both jobs' processes share the 2 cores whatever the grants say (CPU busy column), so lending a "
          f"device would not lend compute. The wall time is dominated by what lies outside the steps' span "
          f"({wall_minus_span:.0f} s of it: Ray, TransferQueue, FSDP and vLLM start-up before the first grant, "
          "shut-down after the last), which no scheduler changes. The steps' span is mostly the first step (warm-up: "
          f"the first vLLM batch, FSDP's first pass; median {first['verl-sync']:.1f} s under verl-sync, "
          f"{first['jigsaw']:.1f} s under jigsaw), and the arms differ mostly there, before and in the first rollout, "
          f"not in the grants: {decide}, and in the repeat on the quietest machine (load {quiet_load:.1f} at its "
          f"start) the steps' spans are {quiet_ratio:.2f}x, so the spread is read as the shared machine's noise. "
          f"The simulator predicts {pred:.2f}x; its absolute step times are those of its `cpu` profile for this "
          "model (a few hundred ms a step), not of verl's Python overheads, so only the ratio is compared. What "
          "would pay: verl rollout servers the coordinator can add and remove across jobs "
          "(`CheckpointEngineManager` + the balancer's server set, `replicas_elastic`), a training gang verl can "
          "re-place, and real accelerators, where a device idle between one job's stages is compute another job "
          "can use.")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--workdir", default="build/real-ab-hosts")
    p.add_argument("--render", action="store_true")
    p.add_argument("--append", action="store_true", help="one more repeat into the saved JSON (its steps)")
    p.add_argument("--migration", action="store_true",
                   help="the pair with migration: verl-a on 2 devices behind the jigsaw balancer, verl-b on 1")
    a = p.parse_args(argv)
    results, block = (MIGRATION_RESULTS, MIGRATION_BLOCK) if a.migration else (RESULTS, BLOCK)
    if a.render:  # re-rendered with the simulator's prediction as the cost model is now
        data = json.loads(results.read_text())
        data["predicted"] = predict(data["steps"], a.migration)
    else:
        if a.append:
            data = json.loads(results.read_text())
            repeats = 1
        else:
            data = {"steps": a.steps, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "predicted": predict(a.steps, a.migration), "repeats": [], "migration": a.migration}
            repeats = a.repeats
        for _ in range(repeats):
            i = len(data["repeats"])
            order = ARMS if i % 2 == 0 else ARMS[::-1]
            workdir = Path(a.workdir + ("-migration" if a.migration else "")) / f"r{i}"
            rep = {arm: run_arm(arm, data["steps"], workdir, a.migration) for arm in order}
            for position, arm in enumerate(order):
                rep[arm]["ran"] = "first" if position == 0 else "second"
            data["repeats"].append({arm: rep[arm] for arm in ARMS})
            results.parent.mkdir(parents=True, exist_ok=True)
            results.write_text(json.dumps(data, indent=1))
            print(json.dumps({arm: {k: v for k, v in r.items() if k != "jobs"} for arm, r in rep.items()}),
                  flush=True)
    write_doc_block(block, render(data))
    return 0 if _ok(data) else 1


if __name__ == "__main__":
    sys.exit(main())
