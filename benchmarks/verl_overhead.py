"""Overhead of the jigsaw verl plugin on a verl step: hooks + event recording + graph building.

Two measurements, both on CPU:

1. ``micro`` (any venv with jigsaw-plugin): the hooks one verl step fires (step start/end,
   8 stages x start/end, weight_sync stage + weight sync start/end: 22 calls) through the trainer's own
   ``StageReporter`` (a plugin manager with the entry-point plugins and an
   ``EventRecorder``), repeated; then ``build_from_events`` on the recorded run. Reports
   microseconds per hook call and per step (median of repeats).
2. ``--verl`` (in ``.venv-verl``): verl 0.9.1's real ``fit`` on the jigsaw trainer with the
   CPU stack of integration_tests/verl (TransferQueue, a colocated CPU ``RayWorkerGroup``,
   the tiny Qwen2 computing log-probs and updates): the time spent inside the plugin
   (every ``StageReporter.emit`` and size computation, timed in situ) against verl's step
   time (``jigsaw_step_start`` .. ``_end``), plus the graph build of the run.

Usage::

    .venv/bin/python benchmarks/verl_overhead.py                 # micro only
    .venv-verl/bin/python benchmarks/verl_overhead.py --verl --steps 6 --out /tmp/verl_overhead.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STAGE_ORDER = ("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor")


def micro(steps: int = 2000, repeats: int = 5) -> dict:
    from jigsaw_plugin.adapters.verl.reporter import StageReporter
    from jigsaw_plugin.graph import build_from_events

    per_hook, per_hook_cpu, per_step, graph_per_step = [], [], [], []
    for _ in range(repeats):
        rep = StageReporter("bench")
        rep.register_pipeline({"algorithm": "ppo", "mode": "sync"})
        calls = 0
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(steps):
            rep.step_start()
            for stage in STAGE_ORDER:
                rep.stage_start(stage, (0, 1) if stage != "adv" else (), 64, 8192)
                rep.stage_end(stage, 64, 8192)
            with rep.weight_sync(version=rep.step + 1, devices=(0, 1)):
                pass
            rep.step_end()
            calls += 2 + 2 * len(STAGE_ORDER) + 4
        elapsed, cpu = time.perf_counter() - t0, time.thread_time() - c0
        per_hook.append(elapsed / calls * 1e6)
        per_hook_cpu.append(cpu / calls * 1e6)
        per_step.append(elapsed / steps * 1e6)
        t1 = time.perf_counter()
        graph = build_from_events(rep.recorder.events)
        graph_per_step.append((time.perf_counter() - t1) / steps * 1e6)
    return {"hooks_per_step": 2 + 2 * len(STAGE_ORDER) + 4, "steps": steps, "repeats": repeats,
            "per_hook_us_median": statistics.median(per_hook),
            "per_hook_cpu_us_median": statistics.median(per_hook_cpu), "per_step_hooks_us_median": statistics.median(per_step),
            "graph_build_per_step_us_median": statistics.median(graph_per_step), "graph_nodes": len(graph)}


def in_verl(steps: int) -> dict:
    """verl's real fit on the jigsaw trainer (CPU stack of integration_tests/verl), timed in situ."""
    import os

    sys.path.insert(0, str(ROOT / "integration_tests" / "verl"))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "integration_tests" / "verl"), os.environ.get("PYTHONPATH", "")])
    import transfer_queue as tq
    from conftest import compose_verl, start_ray  # the integration tests' helpers
    from verl.trainer.ppo.v1 import get_trainer_cls

    import cpu_standins as cs
    from jigsaw_plugin.adapters.verl import reporter as reporter_mod
    from jigsaw_plugin.adapters.verl import trainer as trainer_mod
    from jigsaw_plugin.graph import build_from_events
    from jigsaw_plugin.runtime.tiny_model import build_tiny_qwen2

    spent = [0.0, 0, 0.0]  # wall seconds inside the plugin, hook calls, CPU seconds (this thread)

    original_emit = reporter_mod.StageReporter.emit
    original_sizes = trainer_mod.batch_sizes

    def timed_emit(self, hook, **kwargs):
        t, c = time.perf_counter(), time.thread_time()
        try:
            return original_emit(self, hook, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t
            spent[2] += time.thread_time() - c
            spent[1] += 1

    def timed_sizes(*args, **kwargs):
        t = time.perf_counter()
        try:
            return original_sizes(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t

    reporter_mod.StageReporter.emit = timed_emit
    trainer_mod.batch_sizes = timed_sizes
    model = str(build_tiny_qwen2(Path("/tmp") / "jigsaw_verl_bench_tiny"))
    start_ray()
    cfg = compose_verl("trainer.v1.trainer_mode=jigsaw", "+jigsaw.pipeline=bench", "algorithm.adv_estimator=gae",
                       "actor_rollout_ref.actor.use_kl_loss=true", model_path=model)
    cfg.transfer_queue.enable = True
    tq.init(cfg.transfer_queue)
    try:
        trainer = get_trainer_cls("jigsaw")(config=cfg)
        agent = cs.prepare_trainer(trainer, model, steps=steps)
        trainer.fit(agent)
    finally:
        tq.close()
    events = trainer.jigsaw.reporter.recorder.events
    starts = {e["step"]: e["t"] for e in events if e["hook"] == "jigsaw_step_start"}
    ends = {e["step"]: e["t"] for e in events if e["hook"] == "jigsaw_step_end"}
    step_s = [ends[s] - starts[s] for s in sorted(ends)]
    t = time.perf_counter()
    graph = build_from_events(events)
    graph_s = time.perf_counter() - t
    plugin_s = spent[0] + graph_s
    return {"steps": len(step_s), "step_s": step_s, "step_s_total": sum(step_s), "hook_calls": spent[1],
            "plugin_hooks_s": spent[0], "graph_build_s": graph_s, "graph_nodes": len(graph),
            "per_hook_us_in_situ": spent[0] / max(1, spent[1]) * 1e6,
            "per_hook_cpu_us_in_situ": spent[2] / max(1, spent[1]) * 1e6,
            "overhead_pct_of_step_time": 100.0 * plugin_s / sum(step_s)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--verl", action="store_true", help="also time verl's real fit (needs .venv-verl)")
    ap.add_argument("--steps", type=int, default=6, help="verl steps for --verl (default 6)")
    ap.add_argument("--micro-steps", type=int, default=2000)
    ap.add_argument("--out", help="also write the JSON here (verl prints its metrics to stdout)")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.micro_steps < 1:
        print("verl_overhead.py: --steps and --micro-steps must be >= 1", file=sys.stderr)
        return 2
    out = {"micro": micro(args.micro_steps)}
    if args.verl:
        out["verl"] = in_verl(args.steps)
    text = json.dumps(out, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
