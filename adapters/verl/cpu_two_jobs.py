"""Two verl ``main_ppo`` jobs on one Ray cluster and one jigsaw coordinator, on CPU.

``python -m jigsaw_plugin.adapters.verl.cpu_two_jobs`` (``make verl-e2e-two-jobs``) starts a Ray
head in this process (``cpu_device`` units for both jobs' gangs, ``VERL_PLATFORM=cpu`` and
``JIGSAW_TQ_PER_JOB=1`` in the environment its workers inherit), creates the coordinator
with a pool of ``pool_devices`` (default 1: the jobs take turns on it, phase by phase), then
runs the two jobs (``cpu_e2e`` runs joined to the cluster, ``+jigsaw.coordinator``) one after
the other and then at the same time, and prints one JSON line: each run's result, the wall
times, and the coordinator's lease intervals.

``run_concurrent`` runs the two jobs at the same time on a coordinator running a policy
(``jigsaw``, ``verl-sync`` = static halves): each stage of each job starts when the policy
grants it (benchmarks/real_ab_hosts.py, integration_tests/verl/test_host_policy.py).

What a coordinator can change in such a run: *when* each stage of each job runs (grants).
What it cannot: verl places each job's gang when it builds its worker groups (placement
groups held for the whole run, so the Ray cluster needs ``cpu_device`` for both gangs), and
on CPU sleep/wake are no-ops (both jobs' engines stay resident).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from jigsaw_plugin.adapters.verl.cpu_device import PLATFORM_ENV, PLATFORM_NAME, RAY_RESOURCE
from jigsaw_plugin.adapters.verl.cpu_e2e import E2EResult, E2ESettings, prepare, run

__all__ = ["TwoJobResult", "ConcurrentResult", "lease_intervals", "overlapping", "run_two_jobs", "run_concurrent",
           "router_yaml",
           "grant_problems", "verl_log_problems", "GRANTED_STAGES", "VERL_TIMERS", "main"]

#: The stages a verl job of ``cpu_e2e``'s config asks a grant for (rule reward inside the
#: agent loop, no reference; advantages run on the driver: no grant).
GRANTED_STAGES = ("gen", "old_log_prob", "update_actor", "weight_sync")

COORDINATOR = "jigsaw-verl-cpu"
NAMESPACE = "jigsaw"


@dataclass(frozen=True)
class TwoJobResult:
    sequential: list[E2EResult]
    concurrent: list[E2EResult]
    sequential_wall_s: float
    concurrent_wall_s: float
    leases: list[dict]  # the concurrent runs' leases: pipeline, devices, purpose, start, end (coordinator clock)


@dataclass(frozen=True)
class ConcurrentResult:
    """Two jobs at the same time under one coordinator policy."""

    policy: str
    pool_devices: int
    runs: list[E2EResult]
    wall_s: float
    events: list[dict]  # the coordinator's event log (its grants, refusals, the hosts' hooks)
    scheduler: dict  # the coordinator's scheduler report (refusals, adapted decisions, trace)
    peak_pss_gib: float  # peak of the summed PSS of this process and its descendants (every process of the run)


def lease_intervals(events: list[dict]) -> list[dict]:
    """Pair the coordinator's ``jigsaw_lease_granted`` / ``_released`` events per pipeline."""
    open_, out = {}, []
    for e in events:
        if e["hook"] == "jigsaw_lease_granted":
            open_[e["pipeline"]] = {"pipeline": e["pipeline"], "devices": list(e["devices"]),
                                    "purpose": e.get("purpose"), "start": e["t"]}
        elif e["hook"] == "jigsaw_lease_released" and e["pipeline"] in open_:
            lease = open_.pop(e["pipeline"])
            out.append({**lease, "end": e["t"]})
    return sorted(out, key=lambda x: x["start"])


def overlapping(leases: list[dict]) -> list[tuple[dict, dict]]:
    """Pairs of leases of different pipelines that hold a common device at the same time."""
    bad = []
    for i, a in enumerate(leases):
        for b in leases[i + 1:]:
            if a["pipeline"] != b["pipeline"] and set(a["devices"]) & set(b["devices"]) \
                    and a["start"] < b["end"] and b["start"] < a["end"]:
                bad.append((a, b))
    return bad


def _start_cluster(devices: int):
    import ray

    for key, value in ((PLATFORM_ENV, PLATFORM_NAME), ("JIGSAW_TQ_PER_JOB", "1"), ("VLLM_CPU_KVCACHE_SPACE", "1")):
        os.environ[key] = value  # inherited by the cluster's raylet, hence by every worker
    kw = dict(num_cpus=32, resources={RAY_RESOURCE: devices}, include_dashboard=False, log_to_driver=False,
              object_store_memory=400 * 1024 * 1024, namespace=NAMESPACE)
    for attempt in (1, 2):  # Ray's node start has a hard-coded 30 s timeout (loaded machine)
        try:
            return ray.init(**kw)
        except Exception:
            ray.shutdown()
            if attempt == 2:
                raise
            time.sleep(5)


class _PeakPss:
    """Samples the summed proportional set size (PSS: shared pages split among their users)
    of this process and its descendants (the Ray head started here, its workers, the
    main_ppo drivers and their vLLM engines) every 2 s. Other engineers' processes on this
    machine run as the same user, so a per-user sum would count them too."""

    def __init__(self):
        import threading

        import psutil

        self._psutil, self.peak, self._stop = psutil, 0, threading.Event()
        self.base = self._sample()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _sample(self) -> int:
        me = self._psutil.Process()
        total = 0
        for proc in [me, *me.children(recursive=True)]:
            try:
                total += proc.memory_full_info().pss
            except (self._psutil.NoSuchProcess, self._psutil.AccessDenied, self._psutil.ZombieProcess):
                pass  # exited between the listing and the read
        return total

    def _loop(self) -> None:
        while not self._stop.wait(2.0):
            self.peak = max(self.peak, self._sample())

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return round(self.peak / 2**30, 2)


def run_concurrent(workdir: Path, steps: int = 2, policy: str = "jigsaw", pool_devices: int = 2,
                   timeout_s: float = 1200.0, lookahead_s: float | None = None,
                   pipelines: tuple[str, ...] = ("verl-a", "verl-b"),
                   policy_modules: tuple[str, ...] = (), job_devices: tuple[int, ...] | None = None,
                   routed: tuple[str, ...] = (), response_len: int = 16) -> ConcurrentResult:
    """Jobs (1 pretend device each, default two; ``job_devices``: each job's) at the same
    time, on a coordinator running ``policy`` (``policy_modules``: modules registering it,
    when it is not jigsaw-plugin's). ``routed``: jobs whose rollout goes through the jigsaw
    balancer taking this coordinator's migration commands (``router_yaml``; each job's
    balancer record is ``<workdir>/<job>/migration_commands.jsonl``)."""
    import ray

    from jigsaw_plugin.runtime.coordinator import connect_coordinator

    workdir = Path(workdir).resolve()
    job_devices = tuple(job_devices or (1,) * len(pipelines))
    _start_cluster(devices=max(2, sum(job_devices)))
    try:
        address = ray.get_runtime_context().gcs_address
        jobs = []
        for p, n in zip(pipelines, job_devices, strict=True):
            extra = (f"actor_rollout_ref.rollout.router_config_path={router_yaml(workdir / p, p)}",) \
                if p in routed else ()
            jobs.append(E2ESettings(devices=n, steps=steps, workdir=workdir / p, pipeline=p, ray_address=address,
                                    coordinator=COORDINATOR, extra=extra, response_len=response_len,
                                    max_model_len=max(128, 64 + response_len)))
        for j in jobs:  # the model and dataset first, one at a time (building two at once races)
            prepare(Path(j.workdir).resolve())
        options = {"horizon_s": lookahead_s} if lookahead_s is not None and policy == "jigsaw" else None
        client = connect_coordinator(name=COORDINATOR, namespace=NAMESPACE, devices=pool_devices, policy=policy,
                                     policy_options=options, policy_modules=tuple(policy_modules))
        memory = _PeakPss()
        t0 = time.monotonic()
        with ThreadPoolExecutor(len(jobs)) as pool:
            runs = list(pool.map(lambda j: run(j, timeout_s=timeout_s), jobs))
        wall = time.monotonic() - t0
        peak = memory.stop()
        events, report = client.events(), client.scheduler_report()
        client.shutdown()
        with open(workdir / "coordinator_events.jsonl", "w") as f:  # for a look after the run
            f.writelines(json.dumps(e, default=repr) + "\n" for e in events)
    finally:
        ray.shutdown()
    return ConcurrentResult(policy, pool_devices, runs, round(wall, 1), events, report, peak)


def router_yaml(jobdir: Path, pipeline: str) -> Path:
    """verl's ``router_config_path`` file selecting the jigsaw balancer for ``pipeline``: its
    request events go to this coordinator, it takes the coordinator's migrations and records
    each in ``<jobdir>/migration_commands.jsonl``."""
    jobdir.mkdir(parents=True, exist_ok=True)
    path = jobdir / "jigsaw_router.yaml"
    path.write_text(f"router_class: jigsaw_plugin.adapters.verl.router.JigsawLoadBalancer\npipeline: {pipeline}\n"
                    f"coordinator: {COORDINATOR}\nnamespace: {NAMESPACE}\n"
                    f"commands_path: {jobdir / 'migration_commands.jsonl'}\n")
    return path


def _jsonl(path: str) -> list[dict]:
    p = Path(path)
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []


def grant_problems(r: ConcurrentResult, steps: int, samples: int = 4) -> list[str]:
    """What does not hold of a policy run (empty: all holds): each stage of each step of each
    job granted exactly once and in verl's order; the job saw the same grants (its own event
    file); each step's update trained on every sample its rollout generated; refusals name
    the capability; no device granted to two jobs at once (the policy's device trace)."""
    problems = []
    grants = [e for e in r.events if e.get("hook") == "jigsaw_stage_granted"]
    for job in r.runs:
        if job.returncode != 0:
            problems.append(f"{job.log_path}: exit {job.returncode}")
    for name, job in zip(("verl-a", "verl-b")[:len(r.runs)], r.runs):
        mine = [(e["step"], e["stage"]) for e in grants if e["pipeline"] == name]
        want = [(k, st) for k in range(steps) for st in GRANTED_STAGES]
        if mine != want:
            problems.append(f"{name}: grants {mine}, expected {want}")
        host = [tuple(e["devices"]) for e in _jsonl(job.events_path) if e["hook"] == "jigsaw_lease_granted"]
        if host != [tuple(e["devices"]) for e in grants if e["pipeline"] == name]:
            problems.append(f"{name}: the host's own leases {host} differ from the coordinator's grants")
        ends = [e for e in _jsonl(job.events_path) if e["hook"] == "jigsaw_stage_end"]
        for k in range(steps):
            got = {st: [e["samples"] for e in ends if e["stage"] == st and e["step"] == k]
                   for st in ("gen", "update_actor")}
            if got != {"gen": [samples], "update_actor": [samples]}:
                problems.append(f"{name} step {k}: samples generated / trained {got}, expected {samples} once each")
    for refused in r.scheduler.get("refusals", []):
        if "=false" not in refused["reason"]:
            problems.append(f"a refusal that names no capability: {refused}")
    spans = [x for x in r.scheduler.get("trace", []) if x[2]]
    for i, a in enumerate(spans):
        for b in spans[i + 1:]:
            if a[0].split()[0] != b[0].split()[0] and set(a[2]) & set(b[2]) and a[3] < b[4] and b[3] < a[4]:
                problems.append(f"device granted to two jobs at once: {a} / {b}")
    return problems


#: verl's own timers (its console metrics) of the stages a grant covers, and the slack
#: allowed between them and the stage's span in the job's event file: the hooks fire just
#: inside verl's ``marked_timer`` blocks, so the two differ by the hook calls only.
VERL_TIMERS = {"gen": "timing_s/gen", "old_log_prob": "timing_s/old_log_prob", "update_actor": "timing_s/update_actor"}
_TIMER_SLACK_S, _TIMER_SLACK_FRACTION = 0.25, 0.1


def verl_log_problems(r: ConcurrentResult, steps: int, samples: int = 4) -> list[str]:
    """What verl's own console log (its per-step metrics, ``E2EResult.steps``) contradicts
    of the grants and of "every sample trained exactly once at its full length" (empty:
    nothing). Per job and step: one metrics line per step; verl trained ``samples`` samples
    (its ``perf/total_num_tokens`` over prompt + response length per sample) and exactly the
    tokens the granted ``update_actor`` stage reported; no response aborted (verl's
    ``response/aborted_ratio``) and the rollout's generated tokens (the job's event file)
    equal verl's response lengths; verl's own stage timers match the spans of the stages
    the policy granted (so verl ran those stages inside the grants)."""
    problems = []
    for name, job in zip(("verl-a", "verl-b")[:len(r.runs)], r.runs):
        log = Path(job.log_path).read_text(errors="replace") if Path(job.log_path).exists() else ""
        lines = [int(m.group(1)) for m in re.finditer(r"(?:^|\s)step:(\d+) - ", log, re.M)]
        if sorted(lines) != list(range(1, steps + 1)):
            problems.append(f"{name}: verl's step lines {sorted(lines)}, expected one each of 1..{steps}")
            continue
        host = _jsonl(job.events_path)
        for m in job.steps:
            k = m["step"] - 1  # verl counts steps from 1, the hooks from 0
            spans = {e["stage"]: e for e in host if e["hook"] == "jigsaw_stage_start" and e["step"] == k}
            ends = {e["stage"]: e for e in host if e["hook"] == "jigsaw_stage_end" and e["step"] == k}
            per_sample = m["prompt_length/mean"] + m["response_length/mean"]
            trained = m["perf/total_num_tokens"] / per_sample if per_sample else 0.0
            if abs(trained - samples) > 0.01:
                problems.append(f"{name} step {k}: verl trained {trained:.2f} samples, expected {samples}")
            if "update_actor" in spans and spans["update_actor"]["tokens"] != round(m["perf/total_num_tokens"]):
                problems.append(f"{name} step {k}: the granted update_actor read {spans['update_actor']['tokens']} "
                                f"tokens, verl trained {m['perf/total_num_tokens']:.0f}")
            if m.get("response/aborted_ratio", 0.0) != 0.0:
                problems.append(f"{name} step {k}: verl reports aborted responses ({m['response/aborted_ratio']})")
            generated = ends.get("gen", {}).get("tokens")
            if generated != round(samples * m["response_length/mean"]):
                problems.append(f"{name} step {k}: the rollout reported {generated} generated tokens, verl's "
                                f"responses hold {samples * m['response_length/mean']:.0f}")
            for stage, timer in VERL_TIMERS.items():
                if stage not in spans or stage not in ends or timer not in m:
                    problems.append(f"{name} step {k}: no granted span or no verl timer {timer} for {stage}")
                    continue
                span = ends[stage]["t"] - spans[stage]["t"]
                if abs(span - m[timer]) > _TIMER_SLACK_S + _TIMER_SLACK_FRACTION * m[timer]:
                    problems.append(f"{name} step {k}: verl's {timer} {m[timer]:.2f} s, the granted {stage} "
                                    f"span {span:.2f} s")
    return problems


def run_two_jobs(workdir: Path, steps: int = 2, pool_devices: int = 1, timeout_s: float = 1200.0) -> TwoJobResult:
    import ray

    from jigsaw_plugin.runtime.coordinator import connect_coordinator

    workdir = Path(workdir).resolve()
    _start_cluster(devices=2)
    try:
        address = ray.get_runtime_context().gcs_address
        jobs = [E2ESettings(devices=1, steps=steps, workdir=workdir / p, pipeline=p, ray_address=address,
                            coordinator=COORDINATOR) for p in ("verl-a", "verl-b")]
        client = connect_coordinator(name=COORDINATOR, namespace=NAMESPACE, devices=pool_devices)
        t0 = time.monotonic()
        sequential = [run(replace(j, pipeline=f"{j.pipeline}-seq"), timeout_s=timeout_s) for j in jobs]
        sequential_wall = time.monotonic() - t0
        n_seq = len(client.events())
        t0 = time.monotonic()
        with ThreadPoolExecutor(len(jobs)) as pool:
            concurrent = list(pool.map(lambda j: run(j, timeout_s=timeout_s), jobs))
        concurrent_wall = time.monotonic() - t0
        leases = lease_intervals(client.events()[n_seq:])
        client.shutdown()
    finally:
        ray.shutdown()
    return TwoJobResult(sequential, concurrent, round(sequential_wall, 1), round(concurrent_wall, 1), leases)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", default="build/verl-e2e/two-jobs")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--pool-devices", type=int, default=1)
    a = p.parse_args(argv)
    result = run_two_jobs(Path(a.workdir), steps=a.steps, pool_devices=a.pool_devices)
    out = asdict(result)
    for key in ("sequential", "concurrent"):
        for r in out[key]:
            r.pop("steps")  # the per-step metrics are in each run's log
    out["overlapping_leases"] = len(overlapping(result.leases))
    print(json.dumps(out), flush=True)
    ok = all(r.returncode == 0 for r in [*result.sequential, *result.concurrent])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
