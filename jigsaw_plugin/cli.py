"""The ``jigsaw`` command: sim, bench, graph, demo, policies.

User mistakes (a bad workload, an unknown policy) print one paragraph and exit 2; no
traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from jigsaw_plugin.errors import SpecError

__all__ = ["main"]

REPO_EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "workloads"


def _policy_options(pairs: list[str]) -> dict:
    opts = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SpecError("--policy-opt", pair, "KEY=VALUE, e.g. rollout_gpus=4")
        try:
            opts[key] = json.loads(value)
        except json.JSONDecodeError:
            opts[key] = value
    return opts


def _table(results: list[dict]) -> str:
    head = f"{'policy':<14}{'makespan_s':>12}{'samples/s':>12}{'tokens/s':>12}{'busy':>7}{'stale':>7}{'migr':>7}"
    rows = [head, "-" * len(head)]
    for r in results:
        stale = max((p["max_staleness"] for p in r["pipelines"].values()), default=0)
        migr = sum(p["migrations"] for p in r["pipelines"].values())
        rows.append(f"{r['policy']:<14}{r['makespan_s']:>12.1f}{r['samples_per_s']:>12.2f}"
                    f"{r['tokens_per_s']:>12.0f}{r['gpu_busy_fraction']:>7.2f}{stale:>7d}{migr:>7d}")
    return "\n".join(rows)


def _write_json(obj, path) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(obj, indent=2))


def cmd_sim(args) -> int:
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.sim import Simulation
    from jigsaw_plugin.sim.chrome_trace import write_chrome_trace
    from jigsaw_plugin.workload import load_workload

    workload = load_workload(args.workload)
    policy = get_policy(args.policy, **_policy_options(args.policy_opt))
    from jigsaw_plugin.manager import Emitter, get_plugin_manager, register

    # the scheduler and cost model run as plugins of this manager, beside any plugin the
    # user installed through the entry-point group "jigsaw_plugin"
    pm = get_plugin_manager()
    hooks = recorder = None
    if args.events:  # every hook goes through the plugin manager, as a host adapter's would
        from jigsaw_plugin.events import EventRecorder

        recorder = EventRecorder(include_progress=False)
        register(pm, recorder, "event-recorder")
        hooks = Emitter(pm)
    sim = Simulation(workload, policy, seed=args.seed, hooks=hooks, record_requests=bool(args.events), pm=pm)
    result = sim.run()
    _write_json(result, args.json)
    if recorder is not None:
        recorder.to_jsonl(args.events)
    if args.trace:
        write_chrome_trace(sim.world.trace, args.trace, workload.cluster.gpus_per_node)
    print(_table([result]))
    return 0


def cmd_demo(args) -> int:
    from jigsaw_plugin.scheduler import get_policy, policy_names
    from jigsaw_plugin.sim import simulate
    from jigsaw_plugin.workload import load_workload

    if args.real:
        return _demo_real(args)
    path = Path(args.workload) if args.workload else REPO_EXAMPLES / "demo.yaml"
    workload = load_workload(path)
    print(f"workload {path}: {len(workload.pipelines)} pipelines on {workload.cluster.gpus} x "
          f"{workload.cluster.gpu}, seed {args.seed} (simulated)")
    results = [simulate(workload, get_policy(name), seed=args.seed) for name in policy_names()]
    print(_table(results))
    base = next(r for r in results if r["policy"] == "verl-sync")
    for r in results:
        print(f"  {r['policy']:<14} throughput vs verl-sync: {r['samples_per_s'] / base['samples_per_s']:.2f}x")
    return 0


def _demo_real(args) -> int:
    """The reference GRPO pipeline pair on real engines: verl-sync's static partition vs
    jigsaw, side by side (runtime/ray_bench.py)."""
    from jigsaw_plugin.bench.ab import format_ab, run_ab
    from jigsaw_plugin.workload import load_workload

    path = Path(args.workload) if args.workload else REPO_EXAMPLES / "real_ab_2cpu.yaml"
    workload = load_workload(path)
    print(f"workload {path}: {len(workload.pipelines)} reference GRPO pipelines on {workload.cluster.gpus} "
          f"x {workload.cluster.gpu} (REAL: vLLM engines and torch trainers; one device = one core)")
    print("starting the engines (one per pipeline and device; 1-2 minutes), then a warm-up run ...", flush=True)
    ab = run_ab(workload, "verl-sync", "jigsaw", seed=args.seed, backend="ray", workload_path=path,
                repeats=args.repeats)
    print(format_ab(ab))
    return 0


def cmd_bench(args) -> int:
    from jigsaw_plugin.bench.ab import format_ab, run_ab, write_ab
    from jigsaw_plugin.workload import load_workload

    workload = load_workload(args.workload)
    ab = run_ab(workload, args.baseline, args.candidate, seed=args.seed, backend=args.backend,
                ablate=args.ablate, baseline_options=_policy_options(args.baseline_opt),
                workload_path=args.workload, repeats=args.repeats)
    write_ab(ab, args.out, args.json)
    print(format_ab(ab))
    return 0


def cmd_policies(args) -> int:
    from jigsaw_plugin.scheduler import policy_names

    print("\n".join(policy_names()))
    return 0


def cmd_graph(args) -> int:
    from jigsaw_plugin.graph.command import run_graph

    if args.from_events:
        from jigsaw_plugin.graph.command import run_graph_from_events

        return run_graph_from_events(args.from_events, args.out, pipeline=args.pipeline)
    if not args.workload or not args.pipeline:
        raise SpecError("jigsaw graph", args.workload, "WORKLOAD --pipeline NAME, or --from-events FILE")
    return run_graph(args.workload, args.pipeline, args.out, steps=args.steps, seed=args.seed,
                     max_samples=args.max_samples)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="jigsaw", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)

    s = sub.add_parser("sim", help="simulate a workload under one policy")
    s.add_argument("workload")
    s.add_argument("--policy", default="verl-sync")
    s.add_argument("--policy-opt", action="append", metavar="KEY=VALUE", help="policy config field")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--json", help="write the result JSON here")
    s.add_argument("--trace", help="write a Chrome trace (Perfetto) here")
    s.add_argument("--events", help="record every hook event of the run to this JSONL file")
    s.set_defaults(func=cmd_sim)

    d = sub.add_parser("demo", help="compare every policy on the bundled demo workload (simulated), "
                                     "or --real: the reference pipeline pair on real engines")
    d.add_argument("--workload")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--real", action="store_true", help="run verl-sync vs jigsaw for real (needs .venv-cpu)")
    d.add_argument("--repeats", type=int, default=3, help="--real: side-by-side runs per policy")
    d.set_defaults(func=cmd_demo)

    g = sub.add_parser("graph", help="export a pipeline's sub-stage graph (.json, .dot, .png)")
    g.add_argument("workload", nargs="?")
    g.add_argument("--pipeline")
    g.add_argument("--from-events", help="build from a run's recorded hook events (jigsaw sim --events)")
    g.add_argument("--out", required=True)
    g.add_argument("--steps", type=int)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--max-samples", type=int)
    g.set_defaults(func=cmd_graph)

    b = sub.add_parser("bench", help="A/B: a baseline and a candidate on the same workload and seed")
    b.add_argument("workload")
    b.add_argument("--baseline", required=True)
    b.add_argument("--baseline-opt", action="append", metavar="KEY=VALUE", help="baseline config field")
    b.add_argument("--candidate", default="jigsaw")
    b.add_argument("--backend", default="sim", help="sim (simulator) or ray (real engines and trainers)")
    b.add_argument("--repeats", type=int, default=3, help="ray backend: side-by-side runs per policy (median)")
    b.add_argument("--ablate", action="append", metavar="MECHANISM",
                   help="switch one jigsaw mechanism off: migration, resize, lookahead, multiplex")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--out", help="folder for baseline.json, candidate.json, bench.json")
    b.add_argument("--json", help="write the bench JSON here")
    b.set_defaults(func=cmd_bench)

    p = sub.add_parser("policies", help="list the registered policies")
    p.set_defaults(func=cmd_policies)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SpecError as e:
        print(f"jigsaw {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
