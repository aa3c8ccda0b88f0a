"""A verl ``main_ppo`` job and an OpenRLHF job at the same time, on one Ray cluster and one
coordinator running a policy (``jigsaw``, or ``verl-sync`` = static halves).

Run from ``.venv-verl`` (verl's driver is started with this Python): this process starts a
Ray head with both hosts' resources (``cpu_device`` units for verl's gang, logical GPU slots
for OpenRLHF's ``{"GPU": 1, "CPU": 1}`` bundles), creates the coordinator with a pool of
``pool_devices``, then starts

- the verl job: ``adapters/verl/cpu_e2e.run`` (verl's own ``main_ppo``, 1 pretend device,
  GRPO, stage grants);
- the OpenRLHF job: ``cpu_run.py`` under ``.venv-openrlhf``'s Python (OpenRLHF's own
  ``train()`` through the adapter's entry point; its Ray workers run that Python through
  the job's ``py_executable``), 2 engines of which 1 is its static share, reward function,
  ``group_norm`` advantages, phase grants and engine release.

Test code (the OpenRLHF side uses the CPU stand-ins of ``cpu_standins.py``); shared by
``integration_tests/test_mixed_hosts.py`` and ``benchmarks/real_ab_mixed.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ORL_PYTHON = ROOT / ".venv-openrlhf" / "bin" / "python"

__all__ = ["MixedSettings", "JobResult", "MixedResult", "VERL", "ORL", "VERL_GRANTS", "ORL_GRANTS", "run_mixed",
           "problems", "declared_hosts", "orl_args", "partial_releases", "policy_migrations", "read_jsonl"]

COORDINATOR = "jigsaw-mixed"
NAMESPACE = "jigsaw"
VERL, ORL = "verl-job", "orl-job"
#: what each job asks a grant for, per step (verl: cpu_e2e's config; OpenRLHF: phase grants)
VERL_GRANTS = ("gen", "old_log_prob", "update_actor", "weight_sync")
ORL_GRANTS = ("gen", "train")


@dataclass(frozen=True)
class MixedSettings:
    """One mixed run. ``tail_fraction`` 1.0: OpenRLHF consolidates as soon as every request
    has ``migrate_min_tokens`` tokens (a tiny random model has no long tail of its own).

    The OpenRLHF job starts once the verl job has registered with the coordinator: verl's
    start-up (Ray workers, FSDP, vLLM, TransferQueue) is 2-3 minutes longer than OpenRLHF's
    here, and started together the OpenRLHF job finished before verl registered (nothing
    was shared). verl's steps take 2-3 s here and OpenRLHF needs about a minute from its
    start to its first grant: with 6 verl steps verl had finished by then, hence 30."""

    policy: str = "jigsaw"
    verl_steps: int = 30
    pool_devices: int = 2
    orl_engines: int = 2
    orl_active_engines: int = 1  # its static share of the pool
    orl_prompts: int = 16  # 4 prompts x 2 samples per step: 4 steps
    max_new_tokens: int = 64
    tail_fraction: float = 1.0
    timeout_s: float = 1500.0

    @property
    def orl_steps(self) -> int:
        return -(-self.orl_prompts // 4)


@dataclass(frozen=True)
class JobResult:
    name: str
    returncode: int
    wall_s: float
    log_path: str
    events_path: str


@dataclass(frozen=True)
class MixedResult:
    settings: MixedSettings
    wall_s: float
    jobs: tuple  # (verl JobResult, OpenRLHF JobResult)
    events: list  # the coordinator's event log
    scheduler: dict  # the coordinator's scheduler report (refusals, adapted, trace, busy_device_s)
    peak_pss_gib: float  # peak of the summed PSS of this run's processes (driver, Ray, both jobs)
    cpu_s: float  # CPU seconds those processes used
    load_avg_start: tuple
    load_avg_end: tuple


def orl_args(data: dict, out: Path, s: MixedSettings) -> list[str]:
    """OpenRLHF's arguments (the CPU tests' run) plus the adapter's flags under the coordinator."""
    return [
        "--actor.model_name_or_path", data["model"], "--data.prompt_dataset", data["prompts"],
        "--data.input_key", "input", "--data.label_key", "label", "--reward.remote_url", data["reward"],
        "--rollout.n_samples_per_prompt", "2", "--rollout.batch_size", "4", "--rollout.micro_batch_size", "4",
        "--train.batch_size", "8", "--train.micro_batch_size", "4", "--data.max_samples", str(s.orl_prompts),
        "--train.num_episodes", "1", "--rollout.max_new_tokens", str(s.max_new_tokens), "--data.max_len", "512",
        "--vllm.num_engines", str(s.orl_engines), "--vllm.gpu_memory_utilization", "0.05", "--vllm.enforce_eager",
        "--ds.attn_implementation", "eager", "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
        "--algo.kl.init_coef", "0.01", "--algo.advantage.estimator", "group_norm",
        "--ckpt.path", str(out / "ckpt"), "--ckpt.output_dir", str(out / "model"),
        "--jigsaw.enable", "--jigsaw.coordinator", COORDINATOR, "--jigsaw.pipeline", ORL,
        "--jigsaw.active_engines", str(s.orl_active_engines), "--jigsaw.tail_fraction", str(s.tail_fraction),
        "--jigsaw.migrate_min_tokens", "8", "--jigsaw.poll_interval_s", "0.05",
        "--jigsaw.lease_timeout_s", str(int(s.timeout_s)), "--jigsaw.events", str(out / f"{ORL}.events.jsonl"),
    ]


def declared_hosts(s: MixedSettings):
    """The two ``HostPipeline``s as the jobs declare them (verl's session, the OpenRLHF
    adapter's ``host.py``), for the simulator's prediction."""
    from types import SimpleNamespace as NS

    from jigsaw_plugin.adapters.openrlhf.host import openrlhf_host_pipeline
    from jigsaw_plugin.runtime.capabilities import HostCapabilities
    from jigsaw_plugin.runtime.host_executor import HostPipeline

    # adapters/verl/session.py host_pipeline() on cpu_e2e's config (1 device, GRPO, no reference)
    verl = HostPipeline(VERL, "tiny-qwen2", "grpo", 2, 2, 16, 64, s.verl_steps, 1,
                        HostCapabilities("verl", training_width=1))
    args = NS(train=NS(async_enable=False), vllm=NS(tensor_parallel_size=1), eval=NS(dataset=None),
              algo=NS(advantage=NS(estimator="group_norm")), actor=NS(model_name_or_path="tiny-qwen2-tok"),
              rollout=NS(batch_size=4, n_samples_per_prompt=2, max_new_tokens=s.max_new_tokens), data=NS(max_len=512))
    orl = openrlhf_host_pipeline(ORL, args, n_engines=s.orl_engines, n_train=1,
                                 active_engines=s.orl_active_engines, steps=s.orl_steps, request_migration=True)
    return [verl, orl]


def _build_orl_data(root: Path, n_prompts: int) -> dict:
    """The OpenRLHF job's model, prompts and reward function, built by its own venv."""
    root.mkdir(parents=True, exist_ok=True)
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; "
            "from fixtures import build_model_with_tokenizer, write_prompts, write_reward_func; r = Path(sys.argv[2]); "
            "print(json.dumps({'model': str(build_model_with_tokenizer(r / 'tiny-qwen2-tok')), "
            "'prompts': str(write_prompts(r / 'prompts.jsonl', int(sys.argv[3]))), "
            "'reward': str(write_reward_func(r / 'reward_func.py'))}))")
    out = subprocess.run([str(ORL_PYTHON), "-c", code, str(HERE), str(root), str(n_prompts)], capture_output=True,
                         text=True, timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


class _Usage:
    """Peak summed PSS and CPU seconds of this process and all its descendants (the Ray
    head, its workers, both jobs' drivers), sampled every 2 s: other engineers' processes
    on the shared machine are not counted."""

    def __init__(self):
        import psutil

        self._psutil, self.peak, self._cpu = psutil, 0, {}
        self._stop = threading.Event()
        self.base = self._sample()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _sample(self) -> int:
        me = self._psutil.Process()
        total = 0
        for proc in [me, *me.children(recursive=True)]:
            try:
                with proc.oneshot():
                    try:
                        total += proc.memory_full_info().pss
                    except (self._psutil.AccessDenied, AttributeError):
                        total += proc.memory_info().rss
                    t = proc.cpu_times()
                    self._cpu[(proc.pid, proc.create_time())] = t.user + t.system
            except self._psutil.Error:
                continue  # it exited meanwhile
        return total

    def _loop(self) -> None:
        while not self._stop.wait(2.0):
            self.peak = max(self.peak, self._sample())

    def stop(self) -> tuple[float, float]:
        self._stop.set()
        self._thread.join()
        self._sample()
        return round(max(0, self.peak - self.base) / 2**30, 2), round(sum(self._cpu.values()), 1)


def _start_cluster(s: MixedSettings):
    import ray

    from jigsaw_plugin.adapters.verl.cpu_device import PLATFORM_ENV, PLATFORM_NAME, RAY_RESOURCE

    for key, value in ((PLATFORM_ENV, PLATFORM_NAME), ("JIGSAW_TQ_PER_JOB", "1"), ("VLLM_CPU_KVCACHE_SPACE", "1")):
        os.environ[key] = value  # inherited by the raylet, hence by every worker
    # OpenRLHF: its engines' bundles plus the actor and the reference (logical GPU slots)
    kw = dict(num_cpus=32, num_gpus=s.orl_engines + 2, resources={RAY_RESOURCE: 1}, include_dashboard=False,
              log_to_driver=False, object_store_memory=400 * 1024 * 1024, namespace=NAMESPACE)
    for attempt in (1, 2):  # Ray's node start has a hard-coded 30 s timeout (loaded machine)
        try:
            return ray.init(**kw)
        except Exception:
            ray.shutdown()
            if attempt == 2:
                raise
            time.sleep(5)


def _run_orl(args: list[str], out: Path, address: str, timeout_s: float) -> JobResult:
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    env.update({"RAY_ADDRESS": address, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONUNBUFFERED": "1"})
    log_path = out / f"{ORL}.log"
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([str(ORL_PYTHON), str(HERE / "cpu_run.py"), *args], stdout=log,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # this job's own process group only
            rc = proc.wait()
    return JobResult(ORL, rc, round(time.monotonic() - t0, 1), str(log_path), str(out / f"{ORL}.events.jsonl"))


def run_mixed(workdir: Path, s: MixedSettings) -> MixedResult:
    """Both jobs at the same time under ``s.policy``; see the module docstring."""
    import ray

    from jigsaw_plugin.adapters.verl.cpu_e2e import E2ESettings, prepare
    from jigsaw_plugin.adapters.verl.cpu_e2e import run as run_verl
    from jigsaw_plugin.runtime.coordinator import connect_coordinator

    workdir = Path(workdir).resolve()
    if not ORL_PYTHON.exists():
        raise FileNotFoundError(f"{ORL_PYTHON} missing: build it with `make venv-openrlhf`")
    data = _build_orl_data(workdir / "orl-data", s.orl_prompts)
    verl_dir, orl_dir = workdir / "verl", workdir / "orl"
    prepare(verl_dir)  # the model and dataset before the clock starts
    _start_cluster(s)
    try:
        address = ray.get_runtime_context().gcs_address
        client = connect_coordinator(name=COORDINATOR, namespace=NAMESPACE, devices=s.pool_devices,
                                     policy=s.policy)
        verl_settings = E2ESettings(devices=1, steps=s.verl_steps, workdir=verl_dir, pipeline=VERL, ray_address=address,
                                    coordinator=COORDINATOR)
        usage, load0, t0 = _Usage(), os.getloadavg(), time.monotonic()
        results: dict[str, JobResult] = {}

        def verl_job():
            r = run_verl(verl_settings, timeout_s=s.timeout_s)
            results[VERL] = JobResult(VERL, r.returncode, r.wall_s, r.log_path, r.events_path)

        def orl_job():
            results[ORL] = _run_orl(orl_args(data, orl_dir, s), orl_dir, address, s.timeout_s)

        threads = [threading.Thread(target=f) for f in (verl_job, orl_job)]
        threads[0].start()
        while threads[0].is_alive() and VERL not in client.info()["pipelines"]:
            time.sleep(1.0)  # the OpenRLHF job starts once verl has registered (MixedSettings)
        threads[1].start()
        for t in threads:
            t.join()
        wall = round(time.monotonic() - t0, 1)
        peak, cpu_s = usage.stop()
        load1 = os.getloadavg()
        events, report = client.events(), client.scheduler_report()
        client.shutdown()
        with open(workdir / "coordinator_events.jsonl", "w") as f:
            f.writelines(json.dumps(e, default=repr) + "\n" for e in events)
    finally:
        ray.shutdown()
    return MixedResult(s, wall, (results[VERL], results[ORL]), events, report, peak, cpu_s,
                       tuple(round(x, 2) for x in load0), tuple(round(x, 2) for x in load1))


def read_jsonl(path: str) -> list[dict]:
    p = Path(path)
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []


def partial_releases(r: MixedResult) -> list[dict]:
    """OpenRLHF's engine releases during a rollout, as the coordinator's log shows them: a
    ``jigsaw_lease_released`` of the OpenRLHF job before that step's ``gen`` ended."""
    out, step, in_gen = [], None, False
    for e in r.events:
        if e.get("pipeline") != ORL:
            continue
        if e["hook"] == "jigsaw_stage_granted" and e["stage"] == "gen":
            step, in_gen, held = e["step"], True, set(e["devices"])
        elif e["hook"] == "jigsaw_lease_released" and in_gen and set(e["devices"]) < held:
            out.append({**e, "step": step})
            held -= set(e["devices"])
        elif e["hook"] == "jigsaw_stage_end" and e.get("stage") == "gen":
            in_gen = False
    return out


def policy_migrations(r: MixedResult) -> list[dict]:
    """The OpenRLHF migrations the coordinator's policy chose, one per command it issued
    (``jigsaw_migration_issued`` in the coordinator's log), each with what became of it:
    ``done`` (the coordinator's ``jigsaw_migration_done``) with OpenRLHF's own
    ``jigsaw_request_migrated`` for that request (its event file), or ``dropped`` with the
    reason, or ``open`` (neither: a lost command)."""
    log = [e for e in r.events if e.get("pipeline") == ORL]
    host = [e for e in read_jsonl(r.jobs[1].events_path) if e["hook"] == "jigsaw_request_migrated"]
    out = []
    for cmd in (e for e in log if e["hook"] == "jigsaw_migration_issued"):
        done = [e for e in log if e["hook"] == "jigsaw_migration_done" and e["request_id"] == cmd["request_id"]
                and e["t"] >= cmd["t"]]
        dropped = [e for e in log if e["hook"] == "jigsaw_migration_dropped" and e.get("seq") == cmd["seq"]]
        moved = [e for e in host if e["request_id"] == cmd["request_id"]]
        status = "done" if done else "dropped" if dropped else "open"
        out.append({"seq": cmd["seq"], "step": cmd.get("step"), "request_id": cmd["request_id"],
                    "src_server": cmd["src_server"], "dst_server": cmd["dst_server"], "decision": cmd.get("decision"),
                    "status": status, "reason": dropped[0].get("reason") if dropped else "",
                    "host_migrated": [{k: e[k] for k in ("src_replica", "dst_replica", "generated_tokens", "step")}
                                      for e in moved]})
    return out


def problems(r: MixedResult) -> list[str]:
    """What does not hold of a mixed run (empty: all holds).

    - both jobs exit 0;
    - each job's stages granted exactly once per step, in its order (coordinator's log);
    - each host ran on what it was granted (its own event file: verl's leases, OpenRLHF's
      ``gen`` and training stage devices);
    - every sample trained exactly once: verl 4 per step generated and trained; OpenRLHF
      8 per step generated and trained, every request finished once within its budget, a
      migrated one resumed with its prefix and the rest of its budget;
    - at each rollout grant the coordinator holds for the pipeline exactly the granted devices;
    - refusals name the capability; no device granted to both jobs at once;
    - every migration command the policy issued for OpenRLHF was carried out (OpenRLHF's own
      event file shows the request moved from the command's engine to its destination) or
      dropped with a reason, none left open (``policy_migrations``).
    """
    s, out = r.settings, []
    for job in r.jobs:
        if job.returncode != 0:
            out.append(f"{job.name}: exit {job.returncode} (log {job.log_path})")
    grants = [e for e in r.events if e.get("hook") == "jigsaw_stage_granted"]
    for name, want_stages, steps in ((VERL, VERL_GRANTS, s.verl_steps), (ORL, ORL_GRANTS, s.orl_steps)):
        mine = [(e["step"], e["stage"]) for e in grants if e["pipeline"] == name]
        want = [(k, st) for k in range(steps) for st in want_stages]
        if mine != want:
            out.append(f"{name}: grants {mine}, expected {want}")
    by_grant = {(e["pipeline"], e["step"], e["stage"]): tuple(e["devices"]) for e in grants}
    verl_job, orl_job = r.jobs
    verl_ev, orl_ev = read_jsonl(verl_job.events_path), read_jsonl(orl_job.events_path)
    host = [tuple(e["devices"]) for e in verl_ev if e["hook"] == "jigsaw_lease_granted"]
    if host != [tuple(e["devices"]) for e in grants if e["pipeline"] == VERL]:
        out.append(f"{VERL}: the host's own leases {host} differ from the coordinator's grants")
    verl_ends = [e for e in verl_ev if e["hook"] == "jigsaw_stage_end"]
    orl_starts = [e for e in orl_ev if e["hook"] == "jigsaw_stage_start"]
    orl_ends = [e for e in orl_ev if e["hook"] == "jigsaw_stage_end"]
    for k in range(s.verl_steps):
        got = {st: [e["samples"] for e in verl_ends if e["stage"] == st and e["step"] == k]
               for st in ("gen", "update_actor")}
        if got != {"gen": [4], "update_actor": [4]}:
            out.append(f"{VERL} step {k}: samples generated / trained {got}, expected 4 once each")
    for k in range(s.orl_steps):
        got = {st: [e["samples"] for e in orl_ends if e["stage"] == st and e["step"] == k]
               for st in ("gen", "update_actor")}
        if got != {"gen": [8], "update_actor": [8]}:
            out.append(f"{ORL} step {k}: samples generated / trained {got}, expected 8 once each")
        for stage, grant in (("gen", "gen"), ("update_actor", "train")):
            ran = [tuple(e["devices"]) for e in orl_starts if e["stage"] == stage and e["step"] == k]
            if ran != [by_grant.get((ORL, k, grant))]:
                out.append(f"{ORL} step {k}: {stage} ran on {ran}, granted {by_grant.get((ORL, k, grant))}")
    out += _request_problems(orl_ev, s.max_new_tokens)
    out += _idle_holds(r.events)
    for m in policy_migrations(r):
        if m["status"] == "open":
            out.append(f"{ORL}: policy migration {m['seq']} of {m['request_id']} neither done nor dropped")
        elif m["status"] == "done" and not any(str(h["src_replica"]) == m["src_server"]
                                               and str(h["dst_replica"]) == m["dst_server"]
                                               for h in m["host_migrated"]):
            out.append(f"{ORL}: policy migration {m} done in the coordinator's log, but OpenRLHF's own events "
                       f"show no such move")
    for refused in r.scheduler.get("refusals", []):
        if "=false" not in refused["reason"]:
            out.append(f"a refusal that names no capability: {refused}")
    spans = [x for x in r.scheduler.get("trace", []) if x[2]]
    for i, a in enumerate(spans):
        for b in spans[i + 1:]:
            if a[0].split()[0] != b[0].split()[0] and set(a[2]) & set(b[2]) and a[3] < b[4] and b[3] < a[4]:
                out.append(f"device granted to two jobs at once: {a} / {b}")
    return out


def _idle_holds(events: list[dict]) -> list[str]:
    """At each rollout grant, the devices the coordinator holds for the pipeline are the
    grant's: none held for a replica the host will never run on (the coordinator's log)."""
    out, held = [], defaultdict(set)
    for e in events:
        if e.get("hook") == "jigsaw_lease_granted":
            held[e["pipeline"]] |= set(e["devices"])
        elif e.get("hook") == "jigsaw_lease_released":
            held[e["pipeline"]] -= set(e["devices"])
        elif e.get("hook") == "jigsaw_stage_granted" and e["stage"] == "gen" \
                and held[e["pipeline"]] != set(e["devices"]):
            out.append(f"{e['pipeline']} step {e['step']}: rollout granted {e['devices']} while the coordinator "
                       f"holds {sorted(held[e['pipeline']])} for it")
    return out


def _request_problems(events: list[dict], max_new_tokens: int) -> list[str]:
    """OpenRLHF's requests (its own event file): each finished once, none longer than its
    budget; a migrated one resumed on its destination with prompt + prefix and the rest of
    its budget, so its response is its full length (a response may stop early at EOS: the
    tiny random model draws it now and then)."""
    out = []
    finished = Counter(e["request_id"] for e in events if e["hook"] == "jigsaw_request_finished")
    if not finished or set(finished.values()) != {1}:
        out.append(f"{ORL}: requests finished {dict(finished)} (each must finish once)")
    long = [e for e in events if e["hook"] == "jigsaw_request_finished" and e["generated_tokens"] > max_new_tokens]
    if long:
        out.append(f"{ORL}: {len(long)} request(s) finished longer than {max_new_tokens} tokens: {long[:2]}")
    subs = defaultdict(list)
    for e in events:
        if e["hook"] == "jigsaw_request_submitted":
            subs[e["request_id"]].append(e)
    for m in (e for e in events if e["hook"] == "jigsaw_request_migrated"):
        first, again = subs[m["request_id"]][0], subs[m["request_id"]][-1]
        if not (again["replica"] == m["dst_replica"] != m["src_replica"]
                and again["prompt_tokens"] == first["prompt_tokens"] + m["generated_tokens"]
                and again["max_tokens"] == first["max_tokens"] - m["generated_tokens"]):
            out.append(f"{ORL}: migration {m} not resumed with its prefix and the rest of its budget")
    return out


def main(argv: list[str] | None = None) -> int:
    """``python integration_tests/openrlhf/mixed.py WORKDIR [POLICY] [POOL] [ORL_SHARE]``: one run, its checks as JSON."""
    argv = list(sys.argv[1:] if argv is None else argv)
    s = MixedSettings(policy=argv[1] if len(argv) > 1 else "jigsaw",
                      pool_devices=int(argv[2]) if len(argv) > 2 else 2,
                      orl_active_engines=int(argv[3]) if len(argv) > 3 else 1)
    r = run_mixed(Path(argv[0]), s)
    found = problems(r)
    print(json.dumps({"wall_s": r.wall_s, "jobs": [j.__dict__ for j in r.jobs], "peak_pss_gib": r.peak_pss_gib,
                      "cpu_s": r.cpu_s, "load": [r.load_avg_start, r.load_avg_end],
                      "partial_releases": len(partial_releases(r)), "problems": found,
                      "policy_migrations": policy_migrations(r),
                      "busy_device_s": r.scheduler.get("busy_device_s"),
                      "refusals": r.scheduler.get("refusals")}, default=repr))
    return 0 if not found else 1


if __name__ == "__main__":
    sys.exit(main())

