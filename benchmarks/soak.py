"""Soak under churn: reference GRPO pipelines on real vLLM engines while engines and the
driver are killed, every sample counted (issue 17).

    .venv-cpu/bin/python benchmarks/soak.py --steps 4       # the benchmark (15-30 min on 2 cores: vLLM start-ups)
    .venv-cpu/bin/python benchmarks/soak.py --steps 4 --repeats 1 --no-docs   # a quick look

One Ray cluster and one coordinator (named actor, heartbeat timeout 3 s) for the whole
run. Each case starts a *driver* process (``soak.py driver``): it connects to the
coordinator (after the reaper released a killed predecessor's pipelines), registers the
pipelines and takes one lease of the pool per pipeline, starts an ``EnginePool`` (one vLLM
actor per pipeline on its home device: jigsaw with ``multiplex=False``, since 2 engines of
~3 GB each is what a shared 24 GB machine holds next to other work) and one ``ReferenceTrainer``
actor per pipeline, then runs the workload one step at a time through ``LiveExecutor``
(the ``jigsaw bench --backend ray`` machinery) with a ``LedgerStageRunner``, and writes a
``StepCheckpoint`` at every step end (runtime/reference/resume.py). Hook events go to the
coordinator's event log with the run's global step number.

Faults, at seeded random steps and random delays after the step starts:

- *engine*: SIGKILL of one engine actor's process (the harness knows the pids the driver
  reports; no other process is touched). The router resumes its requests elsewhere, the
  executor closes the replica, the policy launches another on the pipeline's home device,
  and the pool starts a fresh actor there; the requests resume on it with their prefix.
- *driver*: SIGKILL of the driver's process group. Ray kills the actors it owned (the
  engines' reaper kills their vLLM processes), the coordinator's reaper releases its
  leases (``driver_lost``), and the harness starts the driver again: it loads the last
  checkpoint and continues with the next step.

Checks of every case (raised as ``SoakFailure``): the ledger holds every sample of every
step exactly once, at its full length (the workload sampler's), each trainer's version
equals the step count (no update kept twice), every ``jigsaw_request_finished`` in the
event log has its sample's full length, one ``driver_lost`` release per pipeline per
driver kill, and at the end every pid the run reported (drivers, trainer actors, engine
actors and their vLLM processes) is gone. Throughput: kept samples per second from the
first step's start to the driver's last line (after it shut its engines and trainers
down; restarts included), medians of ``--repeats`` interleaved repeats. Writes benchmarks/results/soak.json and the ``soak`` block of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "soak.json"
DOCS = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- soak:start -->", "<!-- soak:end -->"
NAMESPACE = "jigsaw-soak"
HEARTBEAT_TIMEOUT_S = 10.0  # the default; 3 s reaped live drivers whose heartbeat thread starved at load 100+

__all__ = ["SoakCase", "SoakFailure", "SoakResult", "run_case", "soak_workload"]


class SoakFailure(AssertionError):
    """A soak check failed (names the check and what was seen)."""


@dataclass(frozen=True)
class SoakCase:
    """One soak run: the workload's size, and how many faults of each kind it gets."""

    label: str
    steps: int = 6
    pipelines: int = 2
    prompts_per_step: int = 2
    samples_per_prompt: int = 4
    response_len: tuple = (24, 96)  # uniform, tokens
    engine_kills: int = 0
    driver_kills: int = 0
    policy: str = "jigsaw"
    # each pipeline stays on its home device: one engine per pipeline (~3 GB each on CPU);
    # lending devices across pipelines would need an engine per pipeline and device
    policy_options: tuple = (("multiplex", False),)
    seed: int = 0
    devices: int = 2  # one core each


@dataclass(frozen=True)
class SoakResult:
    case: SoakCase
    wall_s: float  # first step's start to the driver's FINISHED (after its shutdown), restarts included
    samples: int  # kept (trained once, in the final model)
    samples_per_s: float
    step_s: tuple  # each step's wall time in the incarnation that committed it
    engine_kills: int
    driver_kills: int
    faults_seen: int  # jigsaw_request_aborted(reason="fault") in the event log
    driver_lost_releases: int
    regenerated_samples: int  # finished again after a driver restart (their first run was discarded)
    samples_lost: int
    samples_duplicated: int
    pids_checked: int
    pids_left: int
    coordinator_rss_mib: tuple = ()  # before, after
    unplanned_restarts: tuple = ()  # the driver died by itself: why
    events: int = 0
    notes: tuple = field(default_factory=tuple)


def soak_workload(case: SoakCase) -> dict:
    """The workload of one executor run (one step): ``case.pipelines`` GRPO pipelines on
    the tiny model, ``case.devices`` devices (one core each)."""
    lo, hi = case.response_len
    return {
        "version": 1,
        "cluster": {"gpus": case.devices, "gpu": "cpu", "gpus_per_node": case.devices},
        "pipelines": [{
            "name": f"soak-{chr(97 + i)}", "model": "tiny-qwen2", "algorithm": "grpo", "mode": "sync",
            "prompts_per_step": case.prompts_per_step, "samples_per_prompt": case.samples_per_prompt,
            "max_response_len": int(hi), "prompt_len": {"dist": "const", "value": 16},
            "response_len": {"dist": "uniform", "low": int(lo), "high": int(hi)},
            "reward": {"kind": "rule", "latency_s": {"dist": "const", "value": 0.0}},
            "steps": 1,
        } for i in range(case.pipelines)],
    }


def step_seed(seed: int, step: int) -> int:
    """The sampler seed of global step ``step`` (each executor run is one step, its step 0)."""
    return int(seed) * 1_000_003 + int(step)


def targets(case: SoakCase, step: int) -> dict:
    """(pipeline, sample index) -> (prompt tokens, full response tokens) of global ``step``."""
    from jigsaw_plugin.workload import parse_workload, sample_step

    wl = parse_workload(soak_workload(case))
    out = {}
    for p in wl.pipelines:
        s = sample_step(p, 0, step_seed(case.seed, step))
        for i in range(len(s.prompt_len)):
            off, turns = int(s.turn_offset[i]), int(s.turns[i])
            resp = int(sum(s.gen_tokens[off:off + turns])) + int(sum(s.observation_len[off:off + turns - 1]))
            out[(p.name, i)] = (int(s.prompt_len[i]), resp)
    return out


# ---- the driver process ----------------------------------------------------------------------
def _say(*parts) -> None:
    print(*parts, flush=True)


def _actor_pids(self) -> list[int]:  # runs inside an actor (__ray_call__): its pid and children
    import psutil

    return [os.getpid()] + [c.pid for c in psutil.Process().children(recursive=True)]


async def _drive(args) -> None:
    import asyncio

    import ray

    from jigsaw_plugin.core.pipelines import build_pipelines
    from jigsaw_plugin.manager import Emitter, get_plugin_manager, register
    from jigsaw_plugin.runtime.coordinator import CoordinatorForwarder, connect_coordinator
    from jigsaw_plugin.runtime.engine_pool import EnginePool
    from jigsaw_plugin.runtime.live import LiveExecutor, run_executor
    from jigsaw_plugin.runtime.reference import ReferenceTrainer
    from jigsaw_plugin.runtime.reference.resume import (LedgerStageRunner, load_checkpoint, restore_trainer,
                                                        save_checkpoint, skip_dead_engines, trainer_state,
                                                        wait_until_released)
    from jigsaw_plugin.runtime.tiny_model import build_tiny_qwen2
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.workload import parse_workload

    raw = json.loads(args.case)
    case = SoakCase(**{**raw, "response_len": tuple(raw["response_len"]),
                       "policy_options": tuple(tuple(kv) for kv in raw["policy_options"])})
    wl = parse_workload(soak_workload(case))
    homes = {p.name: p.static_devices for p in build_pipelines(wl)}  # the engines the policy lends
    names = [p.name for p in wl.pipelines]
    client = connect_coordinator(name=args.coordinator, namespace=NAMESPACE, heartbeat_s=0.5, loss_timeout_s=30.0)
    waited = wait_until_released(client, names, timeout_s=120)  # a killed predecessor's, by the reaper
    _say("REJOINED", f"{waited:.2f}")
    for n in names:
        client.register_pipeline(n, {"framework": "soak"})
    # the pool's devices: a restarted driver waits here until the reaper frees the dead one's
    held = {n: client.acquire(n, "gen", 1, timeout_s=120) for n in names}
    _say("LEASED", json.dumps({n: list(d) for n, d in held.items()}))
    model = build_tiny_qwen2(Path(args.models) / "tiny-qwen2-seed0", seed=0)
    pool = EnginePool({}, pin=True)
    trainer_cls = ray.remote(ReferenceTrainer).options(num_cpus=0)
    trainers = {n: trainer_cls.remote(str(model), seed=case.seed) for n in names}
    ckpt = load_checkpoint(args.ckpt)
    start = 0
    if ckpt is not None:
        start = ckpt.completed_steps
        for n in names:
            await restore_trainer(trainers[n], Path(ckpt.trainers[n]).read_bytes())
    trainer_pids = [p for t in trainers.values() for p in await t.__ray_call__.remote(_actor_pids)]
    _say("TRAINERS", json.dumps(trainer_pids))
    devices = {n: (homes[n] if dict(case.policy_options).get("multiplex", True) is False else range(wl.cluster.gpus))
               for n in names}
    if start < case.steps:  # (a driver killed after its last checkpoint has nothing left to run)
        await asyncio.gather(*(pool.ensure(n, model, devices[n]) for n in names))
        for n in names:  # engines start from the resumed weights
            await pool.reset(n, await trainers[n].state_dict_bf16.remote())
    _say("RESUMED", start)
    step_box = [start]
    runner = LedgerStageRunner(trainers, pin_devices=True, engines=skip_dead_engines, step_of=lambda s: step_box[0])

    class GlobalStep(CoordinatorForwarder):
        """Forwards hook events with the run's global step (each executor run is step 0)."""

        def _record(self, hook_name, arguments):
            if "step" in arguments:
                arguments = {**arguments, "step": int(arguments["step"]) + step_box[0]}
            super()._record(hook_name, arguments)

    pm = get_plugin_manager(load_entrypoints=False, default_plugins=False)
    register(pm, GlobalStep(client), name="forwarder")
    for g in range(start, case.steps):
        step_box[0] = g
        pids = {}
        for key, engine in pool.engines.items():
            try:
                pids[f"{key[0]}@{key[1]}"] = await asyncio.wait_for(engine.handle.__ray_call__.remote(_actor_pids), 30)
            except Exception:  # noqa: BLE001 - a killed actor not yet replaced has no pid
                pass
        _say("STEP", g, json.dumps(pids))
        t0 = time.perf_counter()
        live = LiveExecutor(wl, get_policy(case.policy, **dict(case.policy_options)), lambda p, devs: pool.lend(p.name, devs, runner.latest_weights),
                            step_seed(case.seed, g), stage_runner=runner, hooks=Emitter(pm),
                            sampling={"greedy": False, "temperature": 1.0, "sampling_seed": step_seed(case.seed, g)})
        await run_executor(live, backend="ray")
        rows = [r for r in runner.trained if r.step == g]
        states = {n: await trainer_state(trainers[n]) for n in names}
        save_checkpoint(args.ckpt, g + 1, states, rows)
        _say("DONE", g, f"{time.perf_counter() - t0:.3f}", len(live.faults))
    versions = {n: int(await trainers[n].get_version.remote()) for n in names}
    client.flush()
    pool.shutdown()
    for t in trainers.values():
        ray.kill(t)
    for n in names:
        client.release(n, held[n])
        client.unregister_pipeline(n)
    client.close()
    _say("FINISHED", json.dumps(versions))


def driver_main(argv) -> int:
    import asyncio

    import ray

    ap = argparse.ArgumentParser(prog="soak.py driver")
    ap.add_argument("--address", required=True)
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--case", required=True)
    args = ap.parse_args(argv)
    ray.init(address=args.address, namespace=NAMESPACE, log_to_driver=False)
    try:
        asyncio.run(_drive(args))
    finally:
        ray.shutdown()
    return 0


# ---- the harness -----------------------------------------------------------------------------
def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _is_ray_worker(pid: int) -> bool:
    """Guard against pid reuse: only a Ray worker process is ever signalled."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().startswith(b"ray::")
    except OSError:
        return False


def _last_error(log: Path) -> str:
    """The last exception line of a driver's stderr (what killed it)."""
    lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    errs = [x for x in lines if "Error" in x.split(":", 1)[0] or x.startswith(("ray.exceptions", "soak."))]
    return (errs or lines or ["(no output)"])[-1][:300]


def _rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


class _Driver:
    """One driver process and a thread reading its protocol lines into a queue."""

    def __init__(self, cmd, log):
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True,
                                     cwd=ROOT)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(60)


def _plan(case: SoakCase, rng: random.Random) -> tuple[dict, dict]:
    """Seeded fault plan: global step -> [delays] for engine kills and driver kills (a
    driver kill happens in the first run of its step only)."""
    eng, drv = {}, {}
    for _ in range(case.engine_kills):
        eng.setdefault(rng.randrange(case.steps), []).append(rng.uniform(0.3, 2.5))
    for _ in range(case.driver_kills):
        drv.setdefault(rng.randrange(1, case.steps) if case.steps > 1 else 0, []).append(rng.uniform(0.5, 3.0))
    return eng, drv


def run_case(case: SoakCase, client, address: str, workdir: Path, log=print, timeout_s: float = 1800,
             max_unplanned: int = 2) -> SoakResult:
    """Run one soak case against the coordinator ``client`` on the Ray cluster at
    ``address``; raises ``SoakFailure`` if a sample is lost, duplicated or short, or a
    pid is left behind. A driver that dies by itself (not killed by the plan: Ray's OOM
    killer on a crowded machine) is restarted too, at most ``max_unplanned`` times, and
    reported in ``unplanned_restarts`` with its last error line."""
    rng = random.Random(case.seed * 7919 + case.engine_kills * 31 + case.driver_kills)
    engine_plan, driver_plan = _plan(case, rng)
    workdir.mkdir(parents=True, exist_ok=True)
    ckpt, models = workdir / f"ckpt-{case.label}-{time.time_ns()}", workdir / "models"
    events_before = len(client.events())
    coord_pid = client.info()["pid"]
    rss0 = _rss_mib(coord_pid)
    cmd = [sys.executable, str(Path(__file__).resolve()), "driver", "--address", address,
           "--coordinator", client.name, "--ckpt", str(ckpt), "--models", str(models),
           "--case", json.dumps(asdict(case))]
    errlog = open(workdir / f"driver-{case.label}.log", "a")
    pids: set[int] = set()
    engine_pids: list[int] = []
    kills = {"engine": 0, "driver": 0}
    restarts = {"planned": 0, "unplanned": 0}
    killed: set[int] = set()
    unplanned: list[str] = []
    first_step_t = None
    step_wall: dict[int, float] = {}
    versions = None
    deadline = time.monotonic() + timeout_s
    timers: list[threading.Timer] = []
    driver = _Driver(cmd, errlog)
    pids.add(driver.proc.pid)

    def kill_engine():
        live = [p for p in engine_pids if _alive(p) and _is_ray_worker(p) and p not in killed]
        if live and driver.proc.poll() is None:  # not while the driver (their owner) is down
            victim = rng.choice(live)
            killed.add(victim)
            os.kill(victim, signal.SIGKILL)
            kills["engine"] += 1
            log(f"  [{case.label}] SIGKILL engine actor pid {victim}")

    try:
        while versions is None:
            if time.monotonic() > deadline:
                raise SoakFailure(f"{case.label}: no end within {timeout_s} s")
            try:
                line = driver.lines.get(timeout=5)
            except queue.Empty:
                continue
            if line is None:  # the driver exited
                rc = driver.proc.wait(60)
                planned = kills["driver"] > restarts["planned"] and rc in (-signal.SIGKILL, 128 + signal.SIGKILL)
                if not planned:  # it crashed by itself (Ray's OOM killer on a shared machine): say why
                    errlog.flush()
                    why = _last_error(Path(errlog.name))
                    unplanned.append(f"exit {rc}: {why}")
                    log(f"  [{case.label}] driver exited by itself with {rc}: {why}")
                    if len(unplanned) > max_unplanned:
                        raise SoakFailure(f"{case.label}: driver exited with {rc} ({why}); see {errlog.name}")
                restarts["planned" if planned else "unplanned"] += 1
                driver = _Driver(cmd, errlog)  # restart: it resumes from its checkpoint
                pids.add(driver.proc.pid)
                log(f"  [{case.label}] driver restarted (pid {driver.proc.pid})")
                continue
            kind, _, rest = line.partition(" ")
            if kind in ("REJOINED", "RESUMED", "DONE", "FINISHED"):
                log(f"  [{case.label}] {time.strftime('%H:%M:%S')} {line}")
            if kind == "TRAINERS":
                pids.update(json.loads(rest))
            elif kind == "STEP":
                g, payload = rest.split(" ", 1)
                g = int(g)
                first_step_t = first_step_t or time.monotonic()
                engine_pids = [v[0] for v in json.loads(payload).values()]
                for v in json.loads(payload).values():
                    pids.update(v)
                for delay in engine_plan.pop(g, []):
                    timers.append(threading.Timer(delay, kill_engine))
                    timers[-1].start()
                for delay in driver_plan.pop(g, []):
                    def kill_driver(d=driver, g=g):
                        kills["driver"] += 1
                        log(f"  [{case.label}] SIGKILL driver pid {d.proc.pid} in step {g}")
                        d.kill()
                    timers.append(threading.Timer(delay, kill_driver))
                    timers[-1].start()
            elif kind == "DONE":
                g, wall, _faults = rest.split()
                step_wall[int(g)] = float(wall)
            elif kind == "FINISHED":
                versions = json.loads(rest)
        end_t = time.monotonic()
        driver.proc.wait(120)
    finally:
        for t in timers:
            t.cancel()
        if driver.proc.poll() is None:
            driver.kill()
        errlog.close()

    # ---- count every sample -------------------------------------------------------------------
    from jigsaw_plugin.runtime.reference.resume import load_checkpoint

    state = load_checkpoint(ckpt)
    want = {}
    for g in range(case.steps):
        for (p, i), t in targets(case, g).items():
            want[(p, g, i)] = t
    seen: dict[tuple, int] = {}
    short = []
    for r in state.ledger:
        key = (r.pipeline, r.step, r.index)
        seen[key] = seen.get(key, 0) + 1
        if want.get(key) != (r.prompt_tokens, r.response_tokens):
            short.append((key, (r.prompt_tokens, r.response_tokens), want.get(key)))
    lost = [k for k in want if k not in seen]
    dup = [k for k, c in seen.items() if c > 1]
    if state.completed_steps != case.steps or lost or dup or short:
        raise SoakFailure(f"{case.label}: {len(lost)} samples lost {lost[:5]}, {len(dup)} duplicated {dup[:5]}, "
                          f"{len(short)} not at full length {short[:5]}")
    if set(versions.values()) != {case.steps}:
        raise SoakFailure(f"{case.label}: trainer versions {versions}, expected {case.steps} each (one update per step)")
    events = client.events()[events_before:]
    finished: dict[tuple, int] = {}
    for e in events:
        if e["hook"] == "jigsaw_request_finished":
            from jigsaw_plugin.ids import RequestId

            key = (e["pipeline"], int(e["step"]), RequestId.parse(e["request_id"], turn=False).sample)
            finished[key] = finished.get(key, 0) + 1
            if int(e["generated_tokens"]) != want[key][1]:
                raise SoakFailure(f"{case.label}: request {e['request_id']} of step {e['step']} finished with "
                                  f"{e['generated_tokens']} tokens, its full length is {want[key][1]}")
    if set(finished) != set(want):
        raise SoakFailure(f"{case.label}: the event log's finished samples differ from the workload's: "
                          f"{sorted(set(want) - set(finished))[:5]} missing")
    lost_releases = [e for e in events if e["hook"] == "jigsaw_lease_released" and e.get("reason") == "driver_lost"]
    dead_drivers = kills["driver"] + len(unplanned)  # a crashed driver's leases are reaped too
    if len(lost_releases) != case.pipelines * dead_drivers:
        raise SoakFailure(f"{case.label}: {len(lost_releases)} driver_lost releases for {dead_drivers} dead drivers")
    faults = sum(1 for e in events if e["hook"] == "jigsaw_request_aborted" and e.get("reason") == "fault")
    # ---- every pid gone -------------------------------------------------------------------
    end = time.monotonic() + 90
    while [p for p in pids if _alive(p)] and time.monotonic() < end:
        time.sleep(1)
    left = [p for p in pids if _alive(p)]
    if left:
        raise SoakFailure(f"{case.label}: processes left behind: {left}")
    wall = end_t - first_step_t
    samples = len(want)
    return SoakResult(case, wall, samples, samples / wall, tuple(step_wall[g] for g in sorted(step_wall)),
                      kills["engine"], kills["driver"], faults, len(lost_releases),
                      sum(c - 1 for c in finished.values()), len(lost), len(dup), len(pids), len(left),
                      (round(rss0, 1), round(_rss_mib(coord_pid), 1)), tuple(unplanned), len(events))


# ---- the benchmark -----------------------------------------------------------------------------
def cases(steps: int, devices: int = 2) -> list[SoakCase]:
    """No faults, then each fault kind at a low and a high rate (kills per run of ``steps``)."""
    return [
        SoakCase("none", steps=steps, devices=devices),
        SoakCase("engine-low", steps=steps, devices=devices, engine_kills=max(1, steps // 4)),
        SoakCase("driver-low", steps=steps, devices=devices, driver_kills=1),
        SoakCase("engine-high", steps=steps, devices=devices, engine_kills=max(2, steps // 2)),
        SoakCase("driver-high", steps=steps, devices=devices, driver_kills=max(2, steps // 3)),
    ]


def _load() -> str:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def render(data: dict) -> str:
    rows = ["| case | engine kills | driver kills | kills per step | samples / s (median) | vs none | "
            "step s (median) | faults seen | driver_lost releases | unplanned driver restarts | samples regenerated | "
            "lost | duplicated | pids checked / left |", "|" + " --- |" * 14]
    base = statistics.median(r["samples_per_s"] for r in data["runs"]["none"])
    for label, runs in data["runs"].items():
        sps = statistics.median(r["samples_per_s"] for r in runs)
        each = ", ".join(f"{r['samples_per_s']:.2f}" for r in runs)
        kills = runs[0]["case"]["engine_kills"] + runs[0]["case"]["driver_kills"]
        rows.append(
            f"| {label} | {sum(r['engine_kills'] for r in runs)} | {sum(r['driver_kills'] for r in runs)} | "
            f"{kills / runs[0]['case']['steps']:.2f} | {sps:.2f} ({each}) | "
            f"{sps / base:.2f}x | {statistics.median(s for r in runs for s in r['step_s']):.1f} | "
            f"{sum(r['faults_seen'] for r in runs)} | {sum(r['driver_lost_releases'] for r in runs)} | "
            f"{sum(len(r['unplanned_restarts']) for r in runs)} | "
            f"{sum(r['regenerated_samples'] for r in runs)} | {sum(r['samples_lost'] for r in runs)} | "
            f"{sum(r['samples_duplicated'] for r in runs)} | {sum(r['pids_checked'] for r in runs)} / "
            f"{sum(r['pids_left'] for r in runs)} |")
    c = data["runs"]["none"][0]["case"]
    rss = [r["coordinator_rss_mib"] for rs in data["runs"].values() for r in rs]
    return "\n".join([
        START,
        "### Soak under churn (issue 17)",
        "",
        *(["Partial: the benchmark was stopped before every case ran; the rows below are the cases that did.", ""]
          if data.get("partial") else []),
        f"`{data['command']}` ({data['when']}, load average {data['load_before']} before, {data['load_after']} after; "
        f"2-core machine shared with other work). {c['pipelines']} reference GRPO pipelines, "
        f"{c['prompts_per_step'] * c['samples_per_prompt']} samples per step each, responses "
        f"{c['response_len'][0]}-{c['response_len'][1]} tokens, {c['steps']} steps per run, "
        f"{c['devices']} devices (one core each), policy `{c['policy']}` with {dict(c['policy_options'])} (each pipeline "
        f"on its home device: one vLLM engine per pipeline, ~3 GB each, is what the shared machine holds); "
        f"{data['repeats']} repeat(s) of every case, "
        "interleaved. Engine kill: SIGKILL of an engine actor's process at a random time in a random step; "
        "driver kill: SIGKILL of the driver's process group, restarted from its last completed step "
        "(runtime/reference/resume.py). Samples/s: kept samples from the first step's start to the driver's last "
        "line (after it shut its engines and trainers down, about 10 s of every run), restarts included (a driver restart pays the start of its engines, an engine kill the start of "
        "the replacement, 20-120 s each on this crowded machine).",
        "",
        *rows,
        "",
        "Every run: each sample of every step trained exactly once at its full length (the checkpoint's ledger), "
        "each trainer's version equal to the step count, every `jigsaw_request_finished` at full length, one "
        "`driver_lost` lease release per pipeline per driver kill, and every pid gone at the end "
        "(`integration_tests/test_soak.py` runs a short case with both kinds of kill). "
        f"Coordinator RSS before / after each run (MiB): {', '.join(f'{a:.0f}/{b:.0f}' for a, b in rss)}.",
        *[x for note in data.get("notes", []) for x in ("", note)],  # added to the JSON by hand, kept by --render
        *([""] + [f"Unplanned driver restarts (the driver died by itself, e.g. Ray's OOM killer on the crowded "
                  f"machine; restarted like a killed one): {'; '.join(why)}."] if (why := [w for rs in data["runs"].values()
                                                                                      for r in rs for w in r["unplanned_restarts"]]) else []),
        END,
    ])


def write_docs(block: str) -> None:
    text = DOCS.read_text()
    if START in text and END in text:
        text = text[:text.index(START)] + block + text[text.index(END) + len(END):]
    else:
        anchor = "## Figures of the bundled workloads"
        at = text.index(anchor) if anchor in text else len(text)
        text = text[:at] + block + "\n\n" + text[at:]
    DOCS.write_text(text)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["driver"]:
        return driver_main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--devices", type=int, default=2, help="devices (cores) of the pool")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", nargs="*", help="case labels to run (default: all)")
    ap.add_argument("--render", action="store_true", help="re-render the docs block from the JSON")
    ap.add_argument("--no-docs", action="store_true")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args(argv)
    if args.render:
        write_docs(render(json.loads(RESULTS.read_text())))
        return 0
    import tempfile

    import ray

    from jigsaw_plugin.runtime.coordinator import connect_coordinator

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="jigsaw-soak-"))
    todo = [c for c in cases(args.steps, args.devices) if not args.only or c.label in args.only]
    load_before = _load()

    def save(runs, partial):
        data = {"command": "benchmarks/soak.py " + " ".join(argv), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "load_before": load_before, "load_after": _load(), "repeats": args.repeats, "partial": partial,
                "runs": {k: v for k, v in runs.items() if v}}
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(data, indent=1))
        if not args.no_docs:
            write_docs(render(data))
        return data

    # Ray's memory monitor kills this cluster's workers (the coordinator first) when the
    # *machine* nears full, whoever fills it: on a shared machine that is other work's doing.
    # The soak injects its own faults; the kernel's OOM killer still guards the machine.
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    ray.init(num_cpus=2, resources={"jigsaw_device": 2}, include_dashboard=False, log_to_driver=False,
             namespace=NAMESPACE)
    runs: dict[str, list] = {c.label: [] for c in todo}
    try:
        client = connect_coordinator(name="soak", namespace=NAMESPACE, devices=2,
                                     heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S, max_events_in_memory=2000)
        address = ray.get_runtime_context().gcs_address
        for r in range(args.repeats):
            order = todo if r % 2 == 0 else todo[::-1]
            for case in order:
                res = run_case(case, client, address, workdir)
                runs[case.label].append(asdict(res))
                save(runs, partial=True)  # what has run so far survives an interrupted benchmark
                print(f"repeat {r + 1} {case.label:>12}: {res.samples_per_s:.2f} samples/s, wall {res.wall_s:.0f} s, "
                      f"kills {res.engine_kills} engine / {res.driver_kills} driver, faults seen {res.faults_seen}, "
                      f"regenerated {res.regenerated_samples}, lost {res.samples_lost}, pids {res.pids_checked} all gone "
                      f"(load {_load()})", flush=True)
        client.shutdown()
    finally:
        ray.shutdown()
    print(render(save(runs, partial=False)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
