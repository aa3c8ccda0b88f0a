"""The ``jigsaw`` command: simulate, compare (A/B with a report), graph, check the set-up.

User mistakes (a bad workload, an unknown policy, a folder that is not a saved run) print
one paragraph and exit 2; no traceback. Messages go to stderr through ``logging``
(``-v`` more, ``-q`` less); progress is drawn on stderr only when it is a terminal.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from jigsaw_plugin.errors import SpecError

__all__ = ["main", "build_parser"]

_log = logging.getLogger("jigsaw_plugin")

EXAMPLES = """\
examples:
  jigsaw demo                                      # every policy on the bundled demo workload, and an A/B report
  jigsaw sim W.yaml --policy jigsaw --json r.json --trace t.json
  jigsaw bench W.yaml --baseline verl-sync --out runs/ab1   # result.json, report.md, figures, traces
  jigsaw report runs/ab1 runs/ab2                  # re-render saved runs and compare them
  jigsaw graph W.yaml --pipeline NAME --out g.png --out g.dot
  jigsaw doctor --host ray                         # is this environment ready for real runs?
"""


def _table(results: list[dict], reference: dict | None = None) -> str:
    """One row per result; with ``reference``, a throughput ratio column against it."""
    from jigsaw_plugin.core.result import pipelines_total

    ref = f"{'vs ' + reference['policy']:>16}" if reference else ""
    head = (f"{'policy':<14}{'makespan_s':>12}{'samples/s':>12}{'tokens/s':>12}{'busy':>7}{'stale':>7}"
            f"{'migr':>7}{'kv_pre':>8}{ref}")
    rows = [head, "-" * len(head)]
    for r in results:
        stale = max((p["max_staleness"] for p in r["pipelines"].values()), default=0)
        migr = sum(p["migrations"] for p in r["pipelines"].values())
        # sequences the engines preempted on a KV-cache overflow ("-": not observed)
        kv = pipelines_total(r, "kv_preemptions")
        kv_pre = "-" if kv is None else str(kv)
        ratio = f"{r['samples_per_s'] / reference['samples_per_s']:>15.2f}x" if reference else ""
        rows.append(f"{r['policy']:<14}{r['makespan_s']:>12.1f}{r['samples_per_s']:>12.2f}"
                    f"{r['tokens_per_s']:>12.0f}{r['gpu_busy_fraction']:>7.2f}{stale:>7d}{migr:>7d}{kv_pre:>8}{ratio}")
    return "\n".join(rows)


def _write_json(obj, path) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(obj, indent=2))


def _check_writable(flag: str, path, folder: bool = False) -> None:
    """``path`` (a folder, or a file's folder) can be created and written, checked before a
    run, so that a bad ``--out`` or ``--json`` costs no simulated run (it used to fail with a
    traceback after the run, its results lost)."""
    if not path:
        return
    where = Path(path) if folder else Path(path).parent
    try:
        where.mkdir(parents=True, exist_ok=True)
        ok = os.access(where, os.W_OK)
    except OSError:
        ok = False
    if not ok or (not folder and Path(path).is_dir()):
        raise SpecError(flag, str(path), "a folder this user can create and write to" if folder
                        else "a file path in a folder this user can create and write to")


def _int_at_least(least: int):
    """An argparse type: an integer >= ``least`` (a seed: >= 0, numpy's generators take no
    other; a repeat count: >= 1)."""
    def parse(text: str) -> int:
        error = argparse.ArgumentTypeError(f"got {text!r}; allowed: an integer >= {least}")
        try:
            v = int(text)
        except ValueError:
            raise error from None
        if v < least:
            raise error
        return v
    return parse


_seed = _int_at_least(0)


def cmd_sim(args) -> int:
    from jigsaw_plugin.bench.perfetto import write_perfetto_trace
    from jigsaw_plugin.bench.progress import SimProgress, progress_enabled
    from jigsaw_plugin.bench.spans import MIGRATION_HOOKS, timeline_of
    from jigsaw_plugin.events import EventRecorder
    from jigsaw_plugin.manager import Emitter, get_plugin_manager, register
    from jigsaw_plugin.scheduler import get_policy, parse_options
    from jigsaw_plugin.sim import Simulation
    from jigsaw_plugin.bench.bundled import resolve_workload
    from jigsaw_plugin.workload import load_workload

    for flag, path in (("--json", args.json), ("--trace", args.trace), ("--events", args.events)):
        _check_writable(flag, path)
    args.workload = str(resolve_workload(args.workload))  # a path, or a bundled workload's key or name
    workload = load_workload(args.workload)
    policy = get_policy(args.policy, **parse_options(args.policy_opt))
    # the scheduler and cost model run as plugins of this manager, beside any plugin the
    # user installed through the entry-point group "jigsaw_plugin"; every hook goes
    # through it, as a host adapter's would
    pm = get_plugin_manager()
    recorder = EventRecorder(include_progress=False) if args.events else None
    if recorder is not None:
        register(pm, recorder, "event-recorder")
    migrations = EventRecorder(include_progress=False, hooks=MIGRATION_HOOKS)
    register(pm, migrations, "trace-migrations")
    _log.debug("simulating %s under %s, seed %d", args.workload, policy.name, args.seed)
    total = sum(p.steps for p in workload.pipelines)
    with SimProgress(f"simulating {policy.name}", total, progress_enabled(args.quiet)) as bar:
        register(pm, bar, "progress")
        sim = Simulation(workload, policy, seed=args.seed, hooks=Emitter(pm), record_requests=bool(args.events), pm=pm,
                         predictor=args.predictor)
        result = sim.run()
    _write_json(result, args.json)
    if recorder is not None:
        recorder.to_jsonl(args.events)
    if args.trace:
        write_perfetto_trace(timeline_of(sim, migrations.events), args.trace, title=policy.name)
    print(_table([result]))
    return 0


def _save_and_render(recorded, out: str, argv) -> list[Path]:
    from jigsaw_plugin.bench.provenance import command_line, versions
    from jigsaw_plugin.bench.report import render_report
    from jigsaw_plugin.bench.rundir import save_run

    saved = save_run(out, recorded.bench, recorded.baseline, recorded.candidate, command_line(argv), versions())
    return render_report(saved)


def _print_written(paths: list[Path]) -> None:
    print(f"report: {paths[0]}")
    for p in paths[1:]:
        print(f"  {p}")


def cmd_demo(args) -> int:
    from jigsaw_plugin.bench.ab import run_ab_recorded
    from jigsaw_plugin.bench.bundled import bundled_workload
    from jigsaw_plugin.scheduler import get_policy, policy_names
    from jigsaw_plugin.sim import simulate
    from jigsaw_plugin.workload import load_workload

    if args.out is None:
        args.out = "runs/demo-real" if args.real else "runs/demo"
    _check_writable("--out", args.out, folder=True)
    if args.real:
        return _demo_real(args)
    path = Path(args.workload) if args.workload else bundled_workload("demo.yaml")
    workload = load_workload(path)
    print(f"workload {path}: {len(workload.pipelines)} pipelines on {workload.cluster.gpus} x "
          f"{workload.cluster.gpu}, seed {args.seed} (simulated)")
    results = [simulate(workload, get_policy(name), seed=args.seed) for name in policy_names()]
    print(_table(results, reference=next(r for r in results if r["policy"] == "verl-sync")))
    if args.out:
        recorded = run_ab_recorded(workload, "verl-sync", "jigsaw", seed=args.seed)
        print(f"\nA/B report, jigsaw vs verl-sync ({recorded.bench['throughput_ratio']:.2f}x):")
        _print_written(_save_and_render(recorded, args.out, args.argv))
    return 0


def _demo_real(args) -> int:
    """The agentic pair on real engines (an agentic reference pipeline whose tool calls and
    sandboxed reward go to a tool server process over HTTP, beside a long-tail GRPO
    pipeline): verl-sync's static partition vs jigsaw, side by side (runtime/ray_bench.py)."""
    from jigsaw_plugin.bench.ab import format_ab
    from jigsaw_plugin.bench.bundled import bundled_workload
    from jigsaw_plugin.workload import load_workload

    path = Path(args.workload) if args.workload else bundled_workload("real_ab_agentic_2cpu.yaml")
    workload = load_workload(path)
    agentic = [p.name for p in workload.pipelines if p.agentic]
    print(f"workload {path}: {len(workload.pipelines)} reference pipelines on {workload.cluster.gpus} "
          f"x {workload.cluster.gpu} (REAL: vLLM engines and torch trainers; one device = one core)"
          + (f"; agentic: {', '.join(agentic)} (tool calls and sandboxed reward over HTTP to a tool server "
             f"process)" if agentic else ""))
    recorded = _run_real_ab(args, workload, path, "verl-sync", "jigsaw", ablate=None, baseline_options=None)
    print(format_ab(recorded.bench))
    if args.out:
        _print_written(_save_and_render(recorded, args.out, args.argv))
    return 0


def _run_real_ab(args, workload, path, baseline, candidate, ablate, baseline_options):
    from jigsaw_plugin.bench.ab import check_backend, run_ab_recorded
    from jigsaw_plugin.bench.progress import Activity, progress_enabled

    check_backend("ray", workload)  # refused before anything starts
    with Activity("real A/B run", progress_enabled(args.quiet)) as activity:
        activity.update("starting the engines (one per pipeline and device; 1-2 minutes), then an untimed warm-up")
        return run_ab_recorded(workload, baseline, candidate, seed=args.seed, backend="ray", ablate=ablate,
                               baseline_options=baseline_options, workload_path=path, repeats=args.repeats,
                               log=activity.update)


def cmd_bench(args) -> int:
    from jigsaw_plugin.bench.ab import format_ab, run_ab_recorded
    from jigsaw_plugin.bench.progress import progress_enabled
    from jigsaw_plugin.bench.rundir import bench_json
    from jigsaw_plugin.bench.bundled import resolve_workload
    from jigsaw_plugin.scheduler import parse_options, policy_names
    from jigsaw_plugin.workload import load_workload

    for flag, name in (("--baseline", args.baseline), ("--candidate", args.candidate)):
        if name not in policy_names():  # named by the flag given, before the workload is read
            raise SpecError(flag, name, ", ".join(policy_names()))
    _check_writable("--json", args.json)
    _check_writable("--out", args.out, folder=True)
    args.workload = str(resolve_workload(args.workload))  # a path, or a bundled workload's key or name
    workload = load_workload(args.workload)
    baseline_options = parse_options(args.baseline_opt, "--baseline-opt")
    if args.backend == "ray":
        recorded = _run_real_ab(args, workload, args.workload, args.baseline, args.candidate, args.ablate,
                                baseline_options)
    else:
        recorded = run_ab_recorded(workload, args.baseline, args.candidate, seed=args.seed, backend=args.backend,
                                   ablate=args.ablate, baseline_options=baseline_options,
                                   workload_path=args.workload, repeats=args.repeats,
                                   progress=progress_enabled(args.quiet), predictor=args.predictor)
    _write_json(bench_json(recorded.bench), args.json)
    print(format_ab(recorded.bench))
    if args.out:
        _print_written(_save_and_render(recorded, args.out, args.argv))
    return 0


def cmd_report(args) -> int:
    from jigsaw_plugin.bench.report import compare_markdown, render_report
    from jigsaw_plugin.bench.rundir import load_run

    runs = [load_run(d) for d in args.dirs]  # every folder checked before anything is written
    for saved in runs:
        paths = render_report(saved)
        print(f"{saved.folder}: {saved.bench['candidate']['policy']} / {saved.bench['baseline']['policy']} "
              f"{saved.bench['throughput_ratio']:.2f}x -> {paths[0]} (+ {len(paths) - 1} figures and traces)")
    table = compare_markdown(runs)
    if len(runs) > 1:
        print("\n" + table)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(table + "\n")
        print(f"comparison: {args.out}")
    return 0


def cmd_doctor(args) -> int:
    from jigsaw_plugin.bench.doctor import run_doctor

    text, code = run_doctor(["sim", *(args.host or [])])
    print(text)
    return code


def cmd_policies(args) -> int:
    from jigsaw_plugin.scheduler import policy_names

    print("\n".join(policy_names()))
    return 0


def cmd_graph(args) -> int:
    from jigsaw_plugin.bench.bundled import resolve_workload
    from jigsaw_plugin.graph.command import run_graph, run_graph_from_events

    if args.workload and not args.from_events:
        args.workload = str(resolve_workload(args.workload))  # a path, or a bundled workload's key or name
    for out in args.out:
        if args.from_events:
            run_graph_from_events(args.from_events, out, pipeline=args.pipeline)
        elif not args.workload or not args.pipeline:
            raise SpecError("jigsaw graph", args.workload, "WORKLOAD --pipeline NAME, or --from-events FILE")
        else:
            run_graph(args.workload, args.pipeline, out, steps=args.steps, seed=args.seed,
                      max_samples=args.max_samples)
    return 0


def cmd_plan(args) -> int:
    from jigsaw_plugin.bench.bundled import resolve_workload
    from jigsaw_plugin.plan import run_plan

    args.workload = str(resolve_workload(args.workload))  # a path, or a bundled workload's key or name
    print(run_plan(args.workload, args.pipeline, args.trainer_gpus, args.json, args.trainer_class))
    return 0


def _sub(sub, name: str, help_text: str, example: str, common) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help_text, description=help_text, parents=[common],
                          epilog=f"example:\n  {example}", formatter_class=argparse.RawDescriptionHelpFormatter)


def build_parser() -> argparse.ArgumentParser:
    from jigsaw_plugin.bench.ab import ABLATIONS, OFF_BY_DEFAULT  # the help lists them

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="count", default=0, help="more messages (debug)")
    common.add_argument("-q", "--quiet", action="store_true", help="no progress, warnings and errors only")

    ap = argparse.ArgumentParser(prog="jigsaw", description=__doc__.split("\n\n")[0], epilog=EXAMPLES,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    from jigsaw_plugin import __version__

    ap.add_argument("--version", action="version", version=f"jigsaw-plugin {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = _sub(sub, "sim", "simulate a workload under one policy: result JSON, Perfetto trace, hook events",
             "jigsaw sim W.yaml --policy jigsaw --json r.json --trace t.json", common)
    s.add_argument("workload", help="workload YAML (docs/workload.md), or a bundled one by key (a-f) or name (demo)")
    s.add_argument("--policy", default="verl-sync", help="a policy name (jigsaw policies); default verl-sync")
    s.add_argument("--policy-opt", action="append", metavar="KEY=VALUE", help="policy config field (repeatable)")
    s.add_argument("--seed", type=_seed, default=0)
    s.add_argument("--json", help="write the result JSON here")
    s.add_argument("--trace", help="write a Chrome trace here (ui.perfetto.dev: one track per device)")
    s.add_argument("--events", help="record every hook event of the run to this JSONL file")
    s.add_argument("--predictor", default="history", choices=("history", "oracle"),
                   help="remaining-length predictor: history (default) or oracle (an ablation reading true lengths)")
    s.set_defaults(func=cmd_sim)

    b = _sub(sub, "bench", "A/B: a baseline and a candidate on the same workload, seed and samples; "
             "--out DIR writes result.json, spans.json, report.md, PNG figures and one Perfetto trace per run",
             "jigsaw bench examples/workloads/a_sync4_32gpu.yaml --baseline verl-sync --out runs/a", common)
    b.add_argument("workload", help="workload YAML, or a bundled one by key (a-f) or name (demo)")
    b.add_argument("--baseline", required=True, help="the baseline policy (e.g. verl-sync)")
    b.add_argument("--baseline-opt", action="append", metavar="KEY=VALUE", help="baseline config field")
    b.add_argument("--candidate", default="jigsaw", help="the candidate policy; default jigsaw")
    b.add_argument("--backend", default="sim", help="sim (simulator, default) or ray (real engines and trainers)")
    b.add_argument("--repeats", type=_int_at_least(1), default=3, help="ray backend: side-by-side runs per policy (median)")
    b.add_argument("--ablate", action="append", metavar="MECHANISM",
                   help="flip one jigsaw mechanism from its default: switch off " + ", ".join(ABLATIONS)
                        + "; switch on " + ", ".join(OFF_BY_DEFAULT))
    b.add_argument("--seed", type=_seed, default=0)
    b.add_argument("--predictor", default="history", choices=("history", "oracle"),
                   help="the candidate's remaining-length predictor (oracle: an ablation reading true lengths)")
    b.add_argument("--out", metavar="DIR", help="folder for the saved run and its report")
    b.add_argument("--json", help="also write the bench JSON here")
    b.set_defaults(func=cmd_bench)

    r = _sub(sub, "report", "re-render saved runs (report.md, figures, traces) without re-running them, "
             "and compare them in one table", "jigsaw report runs/a runs/b --out runs/compare.md", common)
    r.add_argument("dirs", nargs="+", metavar="DIR", help="folders written by jigsaw bench --out")
    r.add_argument("--out", help="also write the comparison table (Markdown) here")
    r.set_defaults(func=cmd_report)

    g = _sub(sub, "graph", "a pipeline's sub-stage graph as a picture (.png: layered by stage, coloured by "
             "kind), Graphviz DOT (.dot) or JSON (.json)",
             "jigsaw graph examples/workloads/demo.yaml --pipeline dapo-math-7b --steps 1 --max-samples 16 "
             "--out g.png --out g.dot", common)
    g.add_argument("workload", nargs="?", help="workload YAML, or a bundled one by key (a-f) or name (demo); not with --from-events")
    g.add_argument("--pipeline", help="the pipeline to graph (required with WORKLOAD)")
    g.add_argument("--from-events", help="build from a run's recorded hook events (jigsaw sim --events)")
    g.add_argument("--out", required=True, action="append", help="output file: .json, .dot or .png (repeatable)")
    g.add_argument("--steps", type=int, help="the first N steps (default: the spec's steps)")
    g.add_argument("--seed", type=_seed, default=0)
    g.add_argument("--max-samples", type=int, help="at most N samples per step")
    g.set_defaults(func=cmd_graph)

    d = _sub(sub, "demo", "every policy on the bundled demo workload (simulated) and an A/B report of "
             "jigsaw vs verl-sync; --real: the agentic pair (tool server over HTTP) on real engines",
             "jigsaw demo --out runs/demo", common)
    d.add_argument("--workload", help="another workload (default: the bundled demo.yaml / "
                   "real_ab_agentic_2cpu.yaml with --real)")
    d.add_argument("--seed", type=_seed, default=0)
    d.add_argument("--real", action="store_true", help="run verl-sync vs jigsaw for real (needs the [cpu] extra)")
    d.add_argument("--repeats", type=_int_at_least(1), default=3, help="--real: side-by-side runs per policy")
    d.add_argument("--out", metavar="DIR", help="folder for the A/B report and figures (default ./runs/demo, "
                   "with --real ./runs/demo-real; '' for none)")
    d.set_defaults(func=cmd_demo)

    dr = _sub(sub, "doctor", "check the set-up: hosts and versions, entry points, devices, and a verdict "
              "per use with the command that fixes each problem", "jigsaw doctor --host ray --host verl", common)
    dr.add_argument("--host", action="append", metavar="USE",
                    help="exit 1 unless this use is ready: sim, ray, verl, openrlhf (repeatable)")
    dr.set_defaults(func=cmd_doctor)

    pl = _sub(sub, "plan", "ECHO-2's capacity model: how many rollout devices of which class keep the learner "
              "busy at the staleness bound, and the cost per step (docs/plan.md)",
              "jigsaw plan examples/workloads/c_async2_16gpu.yaml --trainer-gpus 4", common)
    pl.add_argument("workload", help="workload YAML with an async pipeline, or a bundled one by key (c) or name")
    pl.add_argument("--pipeline", help="the pipeline to plan (default: the first async one)")
    pl.add_argument("--trainer-class", help="the device class the trainer runs on (default: the first on-demand "
                    "class without a link)")
    pl.add_argument("--trainer-gpus", type=int, help="trainer devices of that class (default: the whole class "
                    "when the spec lists classes, else half the pipeline's share)")
    pl.add_argument("--json", help="also write the plan as JSON here")
    pl.set_defaults(func=cmd_plan)

    p = _sub(sub, "policies", "list the registered policies", "jigsaw policies", common)
    p.set_defaults(func=cmd_policies)
    return ap


def main(argv=None) -> int:
    from jigsaw_plugin.bench.progress import setup_logging

    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    setup_logging(args.verbose, args.quiet)
    try:
        return args.func(args)
    except SpecError as e:
        print(f"jigsaw {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
