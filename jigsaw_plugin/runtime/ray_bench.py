"""``jigsaw bench --backend ray``: a policy A/B on real engines, run by the coordinator.

The driver (``run_ab_ray``) starts or joins Ray, creates a coordinator actor and asks it to
run the workload once per policy and repeat. Inside the coordinator
(``run_in_coordinator``) the same pure policy object as in the simulator drives
``LiveExecutor``: rollouts on pooled vLLM engines (engine_pool.py) through the router, the
training stages of the reference GRPO pipeline (runtime/reference/) in trainer actors,
every stage on the cores of the devices the policy granted (cpu_affinity.py). Both policies
see the same samples (the workload sampler is seeded by pipeline, step and seed).

Only the reference pipeline exists on this backend: every pipeline must use the
``tiny-qwen2`` model and a GRPO-style algorithm (no critic). The result JSON is the
simulator's (DESIGN.md 5) with ``backend: "ray"`` and the measured extras (``measured``).

Agentic pipelines (``turns``) and sandboxed rewards (``reward.kind: sandbox``) talk to a
tool server process over HTTP (runtime/tool_server.py): ``run_ab_ray`` starts one for the
whole A/B and stops it at the end; ``run_in_coordinator`` starts its own for one run when
it is given no ``tool_server_url``.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

__all__ = ["check_ray_workload", "run_ab_ray", "run_in_coordinator"]

RAY_MODELS = ("tiny-qwen2",)
RAY_ALGORITHMS = ("grpo", "dapo", "reinforce")
RAY_REWARDS = ("rule", "sandbox")

_POOL = None  # the coordinator process's EnginePool (engines outlive one run)
_MODELS: dict[int, Path] = {}  # seed -> folder (every pipeline starts from the same tiny model)
_TRAINER_PIDS: list[int] = []  # of the run in progress (clean-up tests)


def check_ray_workload(workload) -> None:
    """What the reference pipeline can run, as SpecErrors naming the field."""
    from jigsaw_plugin.errors import SpecError

    for i, p in enumerate(workload.pipelines):
        if p.model not in RAY_MODELS:
            raise SpecError(f"pipelines[{i}].model", p.model,
                            f"{', '.join(RAY_MODELS)} (the Ray backend runs the reference pipeline)")
        if p.algorithm not in RAY_ALGORITHMS:
            raise SpecError(f"pipelines[{i}].algorithm", p.algorithm,
                            f"{', '.join(RAY_ALGORITHMS)} (the reference pipeline has no critic)")
        if p.reward.kind not in RAY_REWARDS:
            raise SpecError(f"pipelines[{i}].reward.kind", p.reward.kind,
                            f"{', '.join(RAY_REWARDS)} (the reference pipeline has no reward model; a sandbox "
                            f"reward runs on the tool server)")
        if p.train_offload != "none":
            raise SpecError(f"pipelines[{i}].train_offload", p.train_offload,
                            "none (the reference pipeline's torch trainer keeps its state in the process it "
                            "trains in: there is no device memory to offload from on CPU)")


def _model_dir(seed: int) -> Path:
    from jigsaw_plugin.runtime.tiny_model import build_tiny_qwen2

    if seed not in _MODELS:
        root = Path(os.environ.get("JIGSAW_MODEL_CACHE", Path(tempfile.gettempdir()) / "jigsaw-models"))
        _MODELS[seed] = build_tiny_qwen2(root / f"tiny-qwen2-seed{seed}", seed=seed)
    return _MODELS[seed]


async def run_in_coordinator(workload: dict, policy: str, policy_options: dict, options: dict) -> dict:
    """One run of ``workload`` under ``policy`` on real engines (called in the coordinator)."""
    import ray

    from jigsaw_plugin.runtime.engine_pool import EnginePool
    from jigsaw_plugin.runtime.live import LiveExecutor, run_executor
    from jigsaw_plugin.runtime.reference import ReferenceStageRunner, ReferenceTrainer
    from jigsaw_plugin.runtime.reference.agentic import AgenticTools, SandboxReward
    from jigsaw_plugin.runtime.tool_server import ToolClient, ToolServer, needs_tool_server, tool_server_config
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.workload import parse_workload

    global _POOL
    wl = parse_workload(workload, base_dir=options.get("base_dir", "."))
    check_ray_workload(wl)
    seed = int(options.get("seed", 0))
    if _POOL is None:
        _POOL = EnginePool(options.get("engine_kwargs"), pin=bool(options.get("pin", True)))
    devices = range(wl.cluster.gpus)
    model = _model_dir(int(options.get("model_seed", 0)))
    models = {p.name: model for p in wl.pipelines}
    t0 = time.perf_counter()
    for p in wl.pipelines:
        await _POOL.ensure(p.name, models[p.name], devices)
    start_s = time.perf_counter() - t0

    tools = server = None
    if needs_tool_server(wl):  # agentic turns / a sandboxed reward: over HTTP to the tool server
        url = options.get("tool_server_url")
        if not url:
            server = ToolServer(tool_server_config(wl, seed)).start()
            url = server.url
        tools = AgenticTools(ToolClient(url))
    # OMP_WAIT_POLICY=PASSIVE: a trainer granted 2 cores runs 2 torch threads, and libgomp's
    # spinning at every barrier made a forward pass ~10x slower whenever the other core was
    # taken (an engine, another pipeline, a loaded machine): 1.2 s passive against 14-20 s
    # spinning for 32 x 300 tokens at load 27; one thread is unaffected (docs/reference_pipeline.md)
    trainer_cls = ray.remote(ReferenceTrainer).options(num_cpus=0, runtime_env={
        "env_vars": {"OMP_WAIT_POLICY": "PASSIVE"}})
    trainers = {p.name: trainer_cls.remote(str(models[p.name]), seed=seed, **options.get("trainer_kwargs", {}))
                for p in wl.pipelines}
    _TRAINER_PIDS[:] = [await t.__ray_call__.remote(lambda self: os.getpid()) for t in trainers.values()]
    try:
        for name, tr in trainers.items():  # every engine starts the run on the trainer's weights
            await _POOL.reset(name, await tr.state_dict_bf16.remote())
        runner = ReferenceStageRunner(trainers, pin_devices=bool(options.get("pin", True)),
                                      reward=SandboxReward(tools) if tools is not None else None)
        recorder = None
        hooks = None
        if options.get("record_events"):  # the run's hook events, as a host adapter emits them
            from jigsaw_plugin.events import EventRecorder
            from jigsaw_plugin.manager import Emitter, get_plugin_manager, register

            pm = get_plugin_manager(load_entrypoints=False, default_plugins=False)
            recorder = EventRecorder(include_progress=False)
            register(pm, recorder, name="recorder")
            hooks = Emitter(pm)
        live = LiveExecutor(
            wl, get_policy(policy, **policy_options), lambda p, devs: _POOL.lend(p.name, devs, runner.latest_weights),
            seed, stage_runner=runner, hooks=hooks, record_requests=recorder is not None,
            sampling=options.get("sampling", {"greedy": False, "temperature": 1.0, "sampling_seed": seed}),
            tools=tools)
        t_run = time.perf_counter()
        result = await run_executor(live, backend="ray")
        wall = time.perf_counter() - t_run
        versions = {n: int(await t.get_version.remote()) for n, t in trainers.items()}
    finally:
        for tr in trainers.values():
            ray.kill(tr)
        if server is not None:
            server.stop()
    result["backend"] = "ray"
    if recorder is not None:
        result["events"] = recorder.events
    rewards = {}
    for name, step in sorted(runner.rewards):
        rewards.setdefault(name, []).append(round(runner.mean_reward(name, step), 4))
    result["measured"] = {
        "wall_s": wall,
        "engine_start_s": start_s,
        "engines": len(_POOL.engines),
        "reward_mean_by_step": rewards,
        "weight_sync": {k: v["mode"] for k, v in runner.sync.items()},
        "trainer_versions": versions,
        "engine_weight_versions": {f"{p}@{d}": st["version"] for (p, d), st in _POOL.state.items()},
        "stage_wall_s": _stage_wall(runner.records),
    }
    if tools is not None:  # what the trajectories waited on the tool server
        result["measured"]["tool_server"] = {**tools.summary(), "sandbox_rewards_used": runner.reward.from_sandbox}
    return result


def _stage_wall(records) -> dict:
    out: dict = {}
    for r in records:
        out.setdefault(r.pipeline, {}).setdefault(r.stage, []).append(r.wall_s)
    return {p: {s: statistics.mean(v) for s, v in st.items()} for p, st in out.items()}


def shutdown_pool() -> None:
    """Stop the pooled engines (before the coordinator goes: vLLM processes exit cleanly)."""
    global _POOL
    if _POOL is not None:
        _POOL.shutdown()
        _POOL = None


# ---- the driver side -------------------------------------------------------------------------
class _PeakMemory:
    """Peak memory of this process and all its descendants (the local Ray cluster, its
    workers and the vLLM processes), sampled every ``period`` s, as the sum of their PSS
    (proportional set size: a page shared by k processes counts 1/k in each, so the sum
    is the memory the tree really holds; the RSS sum counts shared pages k times and is
    kept as ``peak_rss``, an upper bound)."""

    def __init__(self, period: float = 0.5):
        self.period, self.peak, self.peak_rss, self._stop = period, 0, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> tuple[int, int]:
        import psutil

        me = psutil.Process()
        pss = rss = 0
        for p in [me, *me.children(recursive=True)]:
            try:
                full = p.memory_full_info()
                pss, rss = pss + full.pss, rss + full.rss
            except psutil.Error:
                pass
        return pss, rss

    def _run(self):
        while not self._stop.is_set():
            pss, rss = self._sample()
            self.peak, self.peak_rss = max(self.peak, pss), max(self.peak_rss, rss)
            self._stop.wait(self.period)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _one_step(data: dict) -> dict:
    return {**data, "pipelines": [{**p, "steps": 1} for p in data["pipelines"]]}


def run_ab_ray(workload_path, baseline: str, candidate: str = "jigsaw", repeats: int = 3, seed: int = 0,
               baseline_options: dict | None = None, candidate_options: dict | None = None,
               log=print, warmup: bool = True, predict=None, **options) -> dict:
    """Baseline and candidate, ``repeats`` times side by side (order alternating), on real
    engines. Returns the bench JSON with the median run of each and the medians' ratio.

    ``predict(workload, policy, seed) -> result``: the simulator's prediction printed beside
    the measurement (``jigsaw_plugin.sim.simulate``; injected: the runtime imports no simulator).
    """
    import ray
    import yaml

    from jigsaw_plugin.runtime.coordinator import connect_coordinator
    from jigsaw_plugin.runtime.tool_server import ToolServer, needs_tool_server, tool_server_config
    from jigsaw_plugin.workload import load_workload

    wl = load_workload(workload_path)
    check_ray_workload(wl)
    data = yaml.safe_load(Path(workload_path).read_text())
    own_ray = not ray.is_initialized()
    if own_ray:
        ray.init(num_cpus=os.cpu_count(), resources={"jigsaw_device": wl.cluster.gpus}, include_dashboard=False,
                 log_to_driver=False, namespace="jigsaw-bench")
    runs: dict[str, list] = {baseline: [], candidate: []}
    opts = {baseline: baseline_options or {}, candidate: candidate_options or {}}
    client = None
    tool_server = None
    if needs_tool_server(wl) and not options.get("tool_server_url"):
        tool_server = ToolServer(tool_server_config(wl, seed)).start()  # one for the whole A/B
        options = {**options, "tool_server_url": tool_server.url}
        log(f"tool server at {tool_server.url} (pid {tool_server.pid})")
    try:
        with _PeakMemory() as mem:
            client = connect_coordinator(name=f"jigsaw-bench-{os.getpid()}", devices=wl.cluster.gpus)
            if warmup:  # untimed: engine start and first-request costs fall on neither policy
                res = client.run_workload(_one_step(data), baseline, opts[baseline], seed=seed + 1,
                                          base_dir=str(Path(workload_path).parent), **options)
                log(f"warm-up: engines started in {res['measured']['engine_start_s']:.0f} s")
            for r in range(repeats):
                order = (baseline, candidate) if r % 2 == 0 else (candidate, baseline)
                for pol in order:
                    res = client.run_workload(data, pol, opts[pol], seed=seed,
                                              base_dir=str(Path(workload_path).parent), **options)
                    # the machine's 1-minute load average as the run ended: shared machines are noisy
                    res["measured"]["load_1m"] = round(os.getloadavg()[0], 1)
                    runs[pol].append(res)
                    log(f"run {r + 1}/{repeats} {pol:>10}: {res['samples_per_s']:.2f} samples/s, "
                        f"makespan {res['makespan_s']:.1f} s, busy {res['gpu_busy_fraction']:.2f} "
                        f"(engines started in {res['measured']['engine_start_s']:.0f} s, "
                        f"load {res['measured']['load_1m']})")
            client.shutdown_pool()
    finally:
        if client is not None:
            client.shutdown()
        if own_ray:
            ray.shutdown()
        if tool_server is not None:
            tool_server.stop()

    def median_run(rs):
        return sorted(rs, key=lambda x: x["samples_per_s"])[len(rs) // 2]

    base, cand = median_run(runs[baseline]), median_run(runs[candidate])
    events = {side: r.pop("events") for side, r in (("baseline", base), ("candidate", cand)) if "events" in r}
    for rs in runs.values():
        for r in rs:
            r.pop("events", None)
    simulated = {}
    if predict is not None:
        sim_b, sim_c = predict(wl, baseline, seed=seed), predict(wl, candidate, seed=seed)
        simulated = {"simulated": {"baseline": sim_b["samples_per_s"], "candidate": sim_c["samples_per_s"],
                                   "throughput_ratio": sim_c["samples_per_s"] / sim_b["samples_per_s"],
                                   "gpu_busy_fraction": [sim_b["gpu_busy_fraction"], sim_c["gpu_busy_fraction"]]}}
    for rs in runs.values():
        for r in rs:
            r["workload"] = str(workload_path)
    return {
        "backend": "ray",
        "workload_spec": data,  # the spec as run (calibrate_cpu.py re-simulates it)
        "baseline": base,
        "candidate": cand,
        "throughput_ratio": cand["samples_per_s"] / base["samples_per_s"],
        "ratios_per_repeat": [c["samples_per_s"] / b["samples_per_s"]
                              for b, c in zip(runs[baseline], runs[candidate])],
        "samples_per_s": {k: [x["samples_per_s"] for x in v] for k, v in runs.items()},
        "runs": {k: [{"samples_per_s": x["samples_per_s"], "makespan_s": x["makespan_s"],
                      "gpu_busy_fraction": x["gpu_busy_fraction"], "load_1m": x["measured"]["load_1m"],
                      "migrations": sum(p["migrations"] for p in x["pipelines"].values()),
                      "stage_s": {n: p["stage_s"] for n, p in x["pipelines"].items()}} for x in v]
                 for k, v in runs.items()},
        "gpu_busy_fraction": {k: [x["gpu_busy_fraction"] for x in v] for k, v in runs.items()},
        **({"events": events} if events else {}),  # of the median runs (record_events=True)
        "peak_memory_gib": mem.peak / 2**30,  # PSS sum of every process of the run
        "peak_rss_sum_gib": mem.peak_rss / 2**30,
        **simulated,
    }
