"""Scheduler decision latency of the jigsaw policy as the pool and pipeline count grow.

Each case is a simulated run in a fresh process, one at a time. Every decide round is
timed in three parts, in CPU time of the simulation's thread (``time.thread_time``: up to
8 engineers share this machine's 2 cores, and their load would inflate wall time; wall
time of the whole round is given beside; not ``process_time``, which Linux samples at
scheduler ticks, 4 ms here, once the RLIMIT_CPU backstop below arms the process's CPU
timer):

* state: building the ``SchedulerState`` (the snapshot, plus the request rows and
  predictions the policy reads lazily during its round);
* policy: the policy's own time;
* decision: both, what a host waits for.

Inside the state build, the time spent in the ``jigsaw_predict_remaining`` hook (the
predictor itself, timed by a hook wrapper) is reported apart: per round (p99) and its
share of all state-build time, over all rounds and over the slowest 1% of rounds.

Two builds of the state, side by side in one invocation: ``incremental`` (the default
``RefreshPolicy``: rows kept while a replica's version holds, predictions cached until
stale) and ``from-scratch`` (``RefreshPolicy(exact=True)``: every row read and the
predictor asked every round, as before the incremental build).

The executor holds the cyclic garbage collector off during a decide round
(``ExecutorCore.decide``); the collections that then run after rounds are timed with
``gc.callbacks`` and reported beside (CPU ms in all, the longest one), so that what left
the round is not hidden.

Targets (issue 12): decision p99 <= 1 ms at 64 GPUs / 8 pipelines, <= 10 ms at 1024 / 32.

A case cannot run away: it stops after ``--rounds`` decide rounds or ``--cpu-budget``
CPU seconds, whichever comes first (its figures are then those of the rounds it ran, and
the table says so), and the kernel stops its process at twice the budget (RLIMIT_CPU).

A case's rounds are its first ones; ``--rounds 0`` runs it to its end (or its CPU
budget), and every case's rounds are also reported in tenths, in the order they ran (their
simulated time span, decision p50 / p99), so that the rollouts' tail rounds are seen apart
from the first ones. ``--breakdown`` times the state build's and the policy's functions
per round (``BREAKDOWN``) and prints the split of the slowest 1% of rounds.

The block's prose of what earlier stops measured and changed, and what is left, is kept in
benchmarks/notes/decision_latency.md (``history_notes``): a re-run that changes a figure
edits that file, not this script.

    python benchmarks/decision_latency.py --cases 64x8,1024x32 --rounds 400   # quick: prints, saves nothing
    python benchmarks/decision_latency.py --cases 64x8 --rounds 0             # the whole run
    python benchmarks/decision_latency.py --breakdown --cases 64x8 --rounds 0 # where the time goes
    python benchmarks/decision_latency.py --breakdown --large-mix 9018 --rounds 0 --cpu-budget 150
    python benchmarks/decision_latency.py --cases 1024x32 --rounds 16000 --policy-opt reprice_on_change=true
    python benchmarks/decision_latency.py --write        # every case; saves its results, writes its block
    python benchmarks/decision_latency.py --render --before OLD.json   # re-render the saved results
    python benchmarks/decision_latency.py --render --also "whole run=RUN.json" --repeats B1,B2 A1,A2
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import yaml
from common import EXAMPLES, ROOT, load, md_table, write_doc_block

from jigsaw_plugin.hookspecs import hookimpl

__all__ = ["CASES", "workload", "run", "measure"]

CASES = [(64, 8, 512), (256, 16, 256), (1024, 32, 256)]
MODES = ("incremental", "from-scratch")
BLOCK = "decision-latency"
RESULTS = ROOT / "benchmarks" / "results" / "decision_latency.json"


def workload(gpus: int, pipelines: int, prompts: int, steps: int = 2) -> dict:
    demo = yaml.safe_load((EXAMPLES / "demo.yaml").read_text())
    pipes = []
    for i in range(pipelines):
        p = copy.deepcopy(demo["pipelines"][i % 2])
        p.update(name=f"{p['name']}-{i}", prompts_per_step=prompts, samples_per_prompt=8, steps=steps)
        pipes.append(p)
    return {"version": 1, "cluster": {"gpus": gpus, "gpu": "h100", "gpus_per_node": 8}, "pipelines": pipes}


class _Stop(Exception):
    """The case's round or CPU budget is spent."""


class _Budget:
    """Ends a run once its budget is spent (a ``tryfirst`` jigsaw_schedule that answers
    nothing: about a microsecond of each round's policy time)."""

    def __init__(self, rounds: int, cpu_s: float):
        self.rounds, self.cpu_s, self.seen, self.start = rounds, cpu_s, 0, time.process_time()

    @hookimpl(tryfirst=True)
    def jigsaw_schedule(self, state):
        self.seen += 1
        if 0 < self.rounds < self.seen or time.process_time() - self.start > self.cpu_s:
            raise _Stop
        return None


class _PredictorTimer:
    """CPU time of each ``jigsaw_predict_remaining`` call (the predictor inside the state
    build), summed per decide round by the benchmark's round wrapper."""

    def __init__(self):
        self.us, self.calls = 0.0, 0

    @hookimpl(hookwrapper=True)
    def jigsaw_predict_remaining(self, pipeline, requests, history):
        t0 = time.thread_time()
        yield
        self.us += (time.thread_time() - t0) * 1e6
        self.calls += 1


TARGETS_US = {(64, 8): 1_000.0, (1024, 32): 10_000.0}  # issue 12: decision p99


def _pct(xs: list, q: float) -> float:
    import numpy as np

    return float(np.percentile(xs, q)) if xs else float("nan")


def measure(job: tuple) -> dict:
    """One case in this process: (gpus, pipelines, prompts, mode, rounds, cpu_budget_s)."""
    from jigsaw_plugin.core.snapshot import EXACT, RefreshPolicy
    from jigsaw_plugin.manager import get_plugin_manager, register
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.sim import Simulation

    gpus, pipelines, prompts, mode, rounds, cpu_budget_s, *rest = job
    options = rest[0] if rest else {}  # the jigsaw policy's options (--policy-opt)
    limit = int(2 * cpu_budget_s) + 30
    resource.setrlimit(resource.RLIMIT_CPU, (limit, limit))  # the backstop: SIGXCPU past it
    budget = _Budget(rounds, cpu_budget_s)
    pm = get_plugin_manager()
    register(pm, budget, "decision-latency-budget")
    predictor = _PredictorTimer()
    register(pm, predictor, "decision-latency-predictor-timer")
    sim = Simulation(load(workload(gpus, pipelines, prompts)), get_policy("jigsaw", **options), 0, pm=pm)
    w = sim.world
    w.prediction_refresh = EXACT if mode == "from-scratch" else RefreshPolicy()
    # the round timers read this thread's CPU clock: once RLIMIT_CPU arms the process's CPU
    # timer, Linux samples the process clock (process_time) at scheduler ticks only (4 ms
    # steps here); the thread clock stays exact, and the simulation runs on this thread
    w.clock = time.thread_time
    wall, pred_us, pred_calls, sim_t = [], [], [], []
    decide = w.decide

    def timed_decide():  # wall time of the whole round, beside the CPU split
        predictor.us, predictor.calls = 0.0, 0
        sim_t.append(w.t)
        t0 = time.perf_counter()
        out = decide()
        # less the engines' advance before the round (its CPU time: one thread, no waits)
        wall.append((time.perf_counter() - t0) * 1e6 - w.engine_advance_us[-1])
        pred_us.append(predictor.us)
        pred_calls.append(predictor.calls)
        return out

    w.decide = timed_decide
    collections = []  # CPU s of each cyclic GC collection during the run
    started = []

    def on_gc(phase, info):
        if phase == "start":
            started.append(time.thread_time())
        elif started:
            collections.append(time.thread_time() - started.pop())

    gc.callbacks.append(on_gc)
    cpu0 = time.process_time()
    stopped = False
    try:
        sim.run()
    except _Stop:
        stopped = True
    finally:
        gc.callbacks.remove(on_gc)
    state, policy = w.state_build_us, w.policy_us
    n = min(len(state), len(policy), len(pred_us))
    total = [a + b for a, b in zip(state[:n], policy[:n])]
    slow = sorted(range(n), key=lambda i: -state[i])[:max(1, n // 100)]  # the slowest 1% of state builds
    return {
        "spread": spread(sim_t[:n], state[:n], policy[:n]),
        "gpus": gpus, "pipelines": pipelines, "prompts": prompts, "mode": mode,
        "requests_per_step": prompts * 8 * pipelines, "rounds": n, "stopped_by_budget": stopped,
        "sim_t_s": w.t,  # simulated time the rounds reached (how far into the rollouts)
        "state_p50_us": _pct(state, 50), "state_p99_us": _pct(state, 99),
        "policy_p50_us": _pct(policy, 50), "policy_p99_us": _pct(policy, 99),
        "decision_p50_us": _pct(total, 50), "decision_p99_us": _pct(total, 99),
        "decision_wall_p99_us": _pct(wall[:n], 99), "cpu_s": time.process_time() - cpu0,
        # the simulated engines decoding up to each round's time, before it (not in the decision)
        "engines_p50_us": _pct(w.engine_advance_us[:n], 50), "engines_p99_us": _pct(w.engine_advance_us[:n], 99),
        "gc_total_ms": sum(collections) * 1e3, "gc_max_ms": max(collections, default=0.0) * 1e3,
        "predictor_p99_us": _pct(pred_us[:n], 99), "predictor_calls": sum(pred_calls[:n]),
        "predictor_share": sum(pred_us[:n]) / max(sum(state[:n]), 1e-9),
        "slow_state_us": sum(state[i] for i in slow) / len(slow) if n else float("nan"),
        "slow_predictor_share": sum(pred_us[i] for i in slow) / max(sum(state[i] for i in slow), 1e-9) if n else 0.0,
        "slow_predictor_calls": sum(pred_calls[i] for i in slow) / len(slow) if n else 0.0,
    }


SPREAD_PARTS = 10


def spread(sim_t: list, state: list, policy: list, parts: int = SPREAD_PARTS) -> list:
    """The rounds in ``parts`` consecutive slices of equal count, in the order they ran:
    per slice its simulated time span and its decision p50 / p99 (and the state build's
    and the policy's p99), so that a run's tail rounds are seen apart from its first."""
    n = len(state)
    out = []
    for k in range(parts):
        a, b = k * n // parts, (k + 1) * n // parts
        if b <= a:
            continue
        total = [x + y for x, y in zip(state[a:b], policy[a:b])]
        out.append({"rounds": b - a, "t0_s": sim_t[a], "t1_s": sim_t[b - 1],
                    "decision_p50_us": _pct(total, 50), "decision_p99_us": _pct(total, 99),
                    "state_p99_us": _pct(state[a:b], 99), "policy_p99_us": _pct(policy[a:b], 99)})
    return out


def spread_table(results: list) -> str:
    """Each case's ``spread``: where in its run the slow rounds are."""
    rows = []
    for r in results:
        for k, part in enumerate(r.get("spread", ())):
            rows.append([r["gpus"], r["pipelines"], r["mode"], f"{k + 1} / {len(r['spread'])}", part["rounds"],
                         f"{part['t0_s']:.1f} - {part['t1_s']:.1f}",
                         f"{part['decision_p50_us']:.0f} / {part['decision_p99_us']:.0f}",
                         f"{part['state_p99_us']:.0f}", f"{part['policy_p99_us']:.0f}"])
    if not rows:
        return ""
    return ("\nThe same rounds in tenths, in the order they ran (each tenth the same count of rounds; "
            "simulated seconds it spans):\n\n"
            + md_table(["GPUs", "pipelines", "state build", "tenth", "rounds", "simulated s", "decision p50 / p99 us",
                        "state p99 us", "policy p99 us"], rows) + "\n")


def _run_jobs(jobs: list) -> list:
    """Each job in a fresh process, one at a time (the machine has 2 shared cores)."""
    with ProcessPoolExecutor(max_workers=1, max_tasks_per_child=1) as ex:
        return list(ex.map(measure, jobs))


def _load_avg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def table(results: list) -> str:
    rows = []
    for r in results:
        rounds = f"{r['rounds']}" + (" (budget)" if r["stopped_by_budget"] else "")
        sim_t = f"{r['sim_t_s']:.1f}" if "sim_t_s" in r else "-"
        rows.append([r["gpus"], r["pipelines"], f"{r['requests_per_step']:,}", r["mode"], rounds, sim_t,
                     f"{r['state_p50_us']:.0f} / {r['state_p99_us']:.0f}",
                     f"{r['policy_p50_us']:.0f} / {r['policy_p99_us']:.0f}",
                     f"{r['decision_p50_us']:.0f} / {r['decision_p99_us']:.0f}",
                     f"{r['decision_wall_p99_us']:.0f}",
                     f"{r['engines_p50_us']:.0f} / {r['engines_p99_us']:.0f}" if "engines_p50_us" in r else "-",
                     f"{r['cpu_s']:.0f}",
                     f"{r['gc_total_ms']:.0f} / {r['gc_max_ms']:.0f}" if "gc_total_ms" in r else "-",
                     (f"{r['predictor_p99_us']:.0f} / {100 * r['predictor_share']:.0f}% / "
                      f"{r['slow_state_us']:.0f} us, {100 * r['slow_predictor_share']:.0f}%, "
                      f"{r['slow_predictor_calls']:.1f} calls") if "predictor_share" in r else "-"])
    return md_table(["GPUs", "pipelines", "requests/step", "state build", "rounds", "simulated s", "state p50 / p99 us",
                     "policy p50 / p99 us", "decision p50 / p99 us", "decision p99 wall us",
                     "engines' advance before the round p50 / p99 us", "CPU s",
                     "GC after rounds: all / longest ms",
                     "predictor: p99 us / share of state / slowest 1% of state builds (mean, predictor share, calls)"],
                    rows)


def targets(results: list) -> str:
    """Whether each case's incremental build meets issue 12's target, and what is left."""
    lines = []
    for r in results:
        target = TARGETS_US.get((r["gpus"], r["pipelines"]))
        if target is None or r["mode"] != "incremental":
            continue
        met = r["decision_p99_us"] <= target
        lines.append(
            f"* {r['gpus']} GPUs / {r['pipelines']} pipelines: decision p99 {r['decision_p99_us']:,.0f} us against "
            f"{target:,.0f} us: **{'met' if met else 'not met'}**"
            + ("." if met else
               f" (the policy's own p99 is {r['policy_p99_us']:,.0f} us, "
               f"{'within' if r['policy_p99_us'] <= target else 'over'} the target by itself; the state build's "
               f"p99 {r['state_p99_us']:,.0f} us, of which the predictor is "
               f"{100 * r.get('predictor_share', float('nan')):.0f}% over all rounds and "
               f"{100 * r.get('slow_predictor_share', float('nan')):.0f}% in the slowest 1%)."))
    return "\n".join(lines)


NOTES = ROOT / "benchmarks" / "notes" / "decision_latency.md"
NOTE_MARKS = ("<!-- tables -->\n", "<!-- extra tables -->\n")


def history_notes(path: Path | None = None) -> tuple[str, str, str]:
    """The block's hand-kept prose (``NOTES``: what earlier stops measured and changed, what
    is left), in its three parts: above the tables, under them, after any extra tables. Kept
    out of the code so that a re-run edits a notes file, not this script."""
    path = path or NOTES
    try:
        text = path.read_text()
    except OSError as e:
        sys.exit(f"{path}: the block's notes cannot be read ({e})")
    if text.startswith("<!--"):
        text = text[text.index("-->") + len("-->"):].lstrip("\n")  # its own header comment
    parts = text.split(NOTE_MARKS[0])
    if len(parts) != 2 or parts[1].count(NOTE_MARKS[1]) != 1:
        sys.exit(f"{path}: expected one {NOTE_MARKS[0].strip()!r} line, then one {NOTE_MARKS[1].strip()!r} line")
    under, left = parts[1].split(NOTE_MARKS[1])
    return parts[0], under, left


def section(results: list, command: str, load_before: str, load_after: str, notes: str = "") -> str:
    above, under, left = history_notes()
    return f"""## Scheduler decision latency: state build and policy (jigsaw, `benchmarks/decision_latency.py`)

CPU microseconds per decide round (`time.thread_time` of the simulation's thread: the
process clock moves in 4 ms ticks once the run's RLIMIT_CPU backstop is armed; the wall
p99 is beside it), split into building the `SchedulerState` (snapshot plus the rows and
predictions the policy reads lazily) and the policy's own time; the simulated engines'
decode up to the round's time runs before the round and is given apart (stop 95, below). "incremental" is the
default build; "from-scratch" reads every row and asks the predictor every round.
Workloads: the demo's two pipelines repeated, 8 samples per prompt, 2 steps. "(budget)":
the case stopped at its round or CPU budget; its figures are those of the rounds it ran.
The predictor column times the `jigsaw_predict_remaining` hook inside the state build
(a hook wrapper): its per-round p99, its share of all state-build time, and the slowest
1% of state builds (their mean, the predictor's share of them, predictor calls per round).
Targets (issue 12): decision p99 <= 1,000 us at 64 / 8 and <= 10,000 us at 1024 / 32.

What the incremental build does each round (docs/predictor.md, "Incremental
predictions"): a replica whose requests did not change advances its running rows by one
scalar and its predicted work and longest remaining by running sums; a replica whose
requests changed a little keeps its rows (finished ones dropped as the executor reports
them); a new turn or a migrated request has only its GRPO groups asked, the whole
pipeline only when its predictions are stale by progress, history or an outlived row.
The cyclic garbage collector is held off for the round (`ExecutorCore.decide`); the
collections that then run between rounds are in the GC column. What earlier builds made
cheaper without changing a decision is in docs/predictor.md ("What a round costs").

{above}`{command}` (load average before: {load_before}; after: {load_after}; 2 cores shared)

{table(results)}

{targets(results)}
{spread_table(results)}
{under}{notes}
{left}"""


def _before_notes(path: str, label: str) -> str:
    """The table of an earlier build's run, under this one (run just before, on a copy)."""
    try:
        old = json.loads(Path(path).read_text())
        rows = old["results"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"--before: {path!r} is not a results file of this script ({e})")
    return (f"\nBefore, {label}: `{old.get('command', '?')}` (load average before: {old.get('load_before', '?')}; "
            f"after: {old.get('load_after', '?')})\n\n{table(rows)}\n")


def _also_notes(spec: str) -> str:
    """``LABEL=PATH``: another invocation's results (e.g. a whole run), its table, targets and
    tenths, under this one's."""
    label, sep, path = spec.partition("=")
    if not sep or not label or not path:
        sys.exit(f"--also: {spec!r} is not LABEL=PATH; allowed: a label, '=', a results file of this script")
    data = _load_results(path, "--also")
    results = data["results"]
    return (f"\n{label}: `{data.get('command', '?')}` (load average before: {data.get('load_before', '?')}; "
            f"after: {data.get('load_after', '?')})\n\n{table(results)}\n\n{targets(results)}\n"
            f"{spread_table(results)}")


def _load_results(path: str, flag: str) -> dict:
    try:
        data = json.loads(Path(path).read_text())
        data["results"]  # noqa: B018 - the one field every results file has
        return data
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"{flag}: {path!r} is not a results file of this script ({e})")


def repeats_table(before: list, after: list) -> str:
    """Medians over repeats (earlier build, then this one, best alternated run after run) of the
    incremental build's figures per case: one pair is at the mercy of the shared machine's
    load; the medians of several are the comparison."""
    import numpy as np

    fields = ("state_p50_us", "state_p99_us", "policy_p50_us", "policy_p99_us", "decision_p50_us", "decision_p99_us")
    rows = []
    for g, n, _ in CASES:
        runs = {}
        for label, data in (("before", before), ("after", after)):
            runs[label] = [r for d in data for r in d["results"]
                           if (r["gpus"], r["pipelines"], r["mode"]) == (g, n, "incremental")]
        if not runs["before"] or not runs["after"]:
            continue
        med = {k: {f: float(np.median([r[f] for r in v])) for f in fields} for k, v in runs.items()}
        # where the policy is the same code in both builds, the state build in units of its
        # p50 is a yardstick the machine's load moves less than microseconds (not where the
        # change is the policy's, as in the build these tables show)
        ratio = {k: float(np.median([r["state_p50_us"] / r["policy_p50_us"] for r in v])) for k, v in runs.items()}
        # the last tenth of the rounds (a long run's rollout tails, where the slow rounds are)
        last = {k: [r["spread"][-1]["decision_p99_us"] for r in v if r.get("spread")] for k, v in runs.items()}
        tenth = (f"{float(np.median(last['before'])):.0f} -> {float(np.median(last['after'])):.0f}"
                 if last["before"] and last["after"] else "-")
        rows.append([g, n, f"{len(runs['before'])} / {len(runs['after'])}"]
                    + [f"{med['before'][f]:.0f} -> {med['after'][f]:.0f}" for f in fields]
                    + [tenth, f"{ratio['before']:.2f} -> {ratio['after']:.2f}"])
    loads = ", ".join(d.get("load_before", "?").split()[0] for d in before + after)
    command = after[0].get("command", "?") if after else "?"
    return (f"\nMedians over repeats of each build (`{command}`, each build's runs alternated, the earlier "
            f"build's first; 1-minute load averages at their starts: {loads}; the shared machine's load moves a "
            f"run by 10-30%, so the two are side by side only where the loads are alike):\n\n"
            + md_table(["GPUs", "pipelines", "runs before / after", "state p50 us", "state p99 us", "policy p50 us",
                        "policy p99 us",
                        "decision p50 us", "decision p99 us", "last tenth: decision p99 us", "state p50 / policy p50"],
                       rows)
            + "\n")


def run(cases=None, modes=MODES, rounds: int = 2000, cpu_budget_s: float = 240.0) -> tuple[str, dict]:
    """The table and {(gpus, pipelines): decision p99 us} of the incremental build."""
    cases = cases or CASES
    jobs = [(g, n, pr, m, rounds, cpu_budget_s) for g, n, pr in cases for m in modes]
    results = _run_jobs(jobs)
    summary = {(r["gpus"], r["pipelines"]): r["decision_p99_us"] for r in results if r["mode"] == "incremental"}
    return table(results), summary


def predictor_calls(sizes=(64, 512, 1024, 4096)) -> list:
    """CPU microseconds per ``HistoryPredictor.predict`` call by batch size (3 steps x 512
    groups of 8 in the history, one step in flight) and the sum of the answers (equal
    before and after a change that only speeds the batch path up)."""
    import numpy as np

    from jigsaw_plugin.predict import HistoryPredictor, LengthHistory, RequestBatch as Batch

    rng = np.random.default_rng(0)
    history = LengthHistory(20480)
    for step in range(3):
        for group in range(512):
            for _ in range(8):
                if step < 2 or rng.random() < 0.5:
                    history.record_finished(step, group, 0, int(min(20480, rng.lognormal(6.5, 0.9))))
    predictor = HistoryPredictor()
    out = []
    for n in sizes:
        batch = Batch(np.full(n, 2), rng.integers(0, 512, n), np.zeros(n, np.int64),
                      rng.integers(0, 3000, n).astype(float), np.full(n, 20480.0))
        predictor.predict(batch, history)
        reps = 300 if n < 4096 else 60
        t0 = time.process_time()
        for _ in range(reps):
            pred = predictor.predict(batch, history)
        out.append({"requests": n, "cpu_us_per_call": (time.process_time() - t0) / reps * 1e6,
                    "sum": float(pred.sum())})
    return out


# What ``--breakdown`` times: (module, class or None, function). A profiler's view, taken
# in its own process only: each is wrapped with a thread-CPU timer (inclusive of what it
# calls; a call inside another call of itself is not counted twice).
BREAKDOWN = [
    ("jigsaw_plugin.core.executor", "ExecutorCore", "snapshot"),
    ("jigsaw_plugin.core.snapshot", None, "_pipeline_view"),
    ("jigsaw_plugin.core.snapshot", "_PipelineRequests", "_gather"),
    ("jigsaw_plugin.core.snapshot", None, "_read_many"),
    ("jigsaw_plugin.sim.replica", "Replica", "request_columns_of"),
    ("jigsaw_plugin.core.snapshot", "_ReplicaRows", "__init__"),
    ("jigsaw_plugin.core.snapshot", "_ReplicaRows", "advance"),
    ("jigsaw_plugin.core.snapshot", "_ReplicaRows", "carry"),
    ("jigsaw_plugin.core.snapshot", "_ReplicaRows", "outlived"),
    ("jigsaw_plugin.core.snapshot", "_PipelineRequests", "_stale"),
    ("jigsaw_plugin.core.snapshot", None, "_adopt_moved"),
    ("jigsaw_plugin.core.snapshot", "_PipelineRequests", "_predict_all"),
    ("jigsaw_plugin.core.snapshot", "_PipelineRequests", "_predict_groups"),
    ("jigsaw_plugin.core.snapshot", None, "_batch"),
    ("jigsaw_plugin.core.executor", "ExecutorCore", "predict_remaining"),
    ("jigsaw_plugin.core.snapshot", "_PipelineRequests", "views"),
    ("jigsaw_plugin.scheduler.jigsaw", "Jigsaw", "decide"),
    ("jigsaw_plugin.scheduler.jigsaw", "Jigsaw", "_consolidate_tails"),
    ("jigsaw_plugin.scheduler.jigsaw", "Jigsaw", "_price_move"),
    ("jigsaw_plugin.scheduler.state", "ReplicaView", "predicted_drain_s"),
    ("jigsaw_plugin.scheduler.jigsaw", "Jigsaw", "_widen_tails"),
    ("jigsaw_plugin.scheduler.jigsaw", "Jigsaw", "_early_passes"),
    ("jigsaw_plugin.scheduler.jigsaw", "Jigsaw", "_demands"),
    ("jigsaw_plugin.scheduler.jigsaw", "Jigsaw", "_limit_admission"),
    ("jigsaw_plugin.scheduler.state", "ReplicaView", "read_together"),
    ("jigsaw_plugin.scheduler.state", "ReplicaView", "kv_columns"),
    ("jigsaw_plugin.scheduler.admission", "FittingMemo", "fitting"),
    ("jigsaw_plugin.predict.history_predictor", None, "fit_model"),  # the name the predictor calls
]


def _timed(fn, name: str, spent: dict, calls: dict):
    import functools

    depth = [0]

    @functools.wraps(fn)
    def timed(*a, **k):
        if depth[0]:
            return fn(*a, **k)
        depth[0] += 1
        t0 = time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            spent[name] = spent.get(name, 0.0) + (time.thread_time() - t0) * 1e6
            calls[name] = calls.get(name, 0) + 1
            depth[0] -= 1
    return timed


def measure_breakdown(job: tuple) -> dict:
    """Per-function CPU time of each decide round of one case (``BREAKDOWN``), in this
    process: (gpus, pipelines, prompts, rounds, cpu_budget_s[, spec]); ``spec``: a workload
    dict to run instead of the case's (a large mix, ``--large-mix``). Returns the slowest
    1% of rounds (by decision time) with their split, and the mean split over all rounds."""
    import importlib

    from jigsaw_plugin.manager import get_plugin_manager, register
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.sim import Simulation

    gpus, pipelines, prompts, rounds, cpu_budget_s, *spec = job
    spent, calls = {}, {}
    for module, owner, name in BREAKDOWN:
        mod = importlib.import_module(module)
        holder = getattr(mod, owner, None) if owner else mod
        if holder is None or not hasattr(holder, name):
            continue  # an earlier build without it (the split is then the functions it has)
        label = f"{owner}.{name}" if owner else name
        setattr(holder, name, _timed(getattr(holder, name), label, spent, calls))
    pm = get_plugin_manager()
    register(pm, _Budget(rounds, cpu_budget_s), "decision-latency-budget")
    if spec:
        from jigsaw_plugin.workload import parse_workload

        wl = parse_workload(spec[0], base_dir=EXAMPLES)
    else:
        wl = load(workload(gpus, pipelines, prompts))
    sim = Simulation(wl, get_policy("jigsaw"), 0, pm=pm)
    w = sim.world
    w.clock = time.thread_time
    decide, per_round = w.decide, []

    def split_decide():
        spent.clear()
        calls.clear()
        t = w.t
        out = decide()
        per_round.append((w.state_build_us[-1] + w.policy_us[-1], t, dict(spent), dict(calls)))
        return out

    w.decide = split_decide
    try:
        sim.run()
    except _Stop:
        pass
    slow = sorted(per_round, key=lambda r: -r[0])[:max(1, len(per_round) // 100)]
    mean = {}
    for _, _, sp, _ in per_round:
        for k, v in sp.items():
            mean[k] = mean.get(k, 0.0) + v / len(per_round)
    return {"gpus": gpus, "pipelines": pipelines, "rounds": len(per_round),
            "slowest": [{"decision_us": d, "sim_t_s": t, "us": sp, "calls": c} for d, t, sp, c in slow],
            "mean_us": mean}


def breakdown_text(b: dict) -> str:
    """The slowest 1% of rounds of a ``measure_breakdown`` run: each function's mean time
    over them, its calls per round, and its mean over all rounds."""
    slow = b["slowest"]
    names = sorted({k for r in slow for k in r["us"]} | set(b["mean_us"]),
                   key=lambda k: -sum(r["us"].get(k, 0.0) for r in slow))
    rows = [[k, f"{sum(r['us'].get(k, 0.0) for r in slow) / len(slow):.0f}",
             f"{sum(r['calls'].get(k, 0) for r in slow) / len(slow):.1f}", f"{b['mean_us'].get(k, 0.0):.0f}"]
            for k in names]
    d = sum(r["decision_us"] for r in slow) / len(slow)
    span = f"{min(r['sim_t_s'] for r in slow):.1f}-{max(r['sim_t_s'] for r in slow):.1f}"
    return (f"{b['gpus']} GPUs / {b['pipelines']} pipelines, {b['rounds']} rounds; the slowest {len(slow)} "
            f"(1%): decision {d:.0f} us on average (timers included), at simulated {span} s. Inclusive CPU us "
            f"(a function's time includes the timed functions it calls):\n\n"
            + md_table(["function", "slowest 1%: us per round", "calls per round", "all rounds: us per round"], rows))


def _policy_options(pairs: list) -> dict:
    """``--policy-opt KEY=VALUE`` pairs as the jigsaw policy's options, checked by
    ``get_policy`` (a field it has, a value of its kind) before any run."""
    from jigsaw_plugin.errors import SpecError
    from jigsaw_plugin.scheduler import get_policy, parse_options

    try:
        opts = parse_options(pairs)
        get_policy("jigsaw", **opts)
    except SpecError as e:
        sys.exit(f"decision_latency.py: {e}")
    return opts


def _parse_cases(text: str) -> list:
    known = {(g, n): pr for g, n, pr in CASES}
    out = []
    for part in text.split(","):
        try:
            g, n = (int(x) for x in part.lower().split("x"))
        except ValueError:
            sys.exit(f"--cases: {part!r} is not GPUSxPIPELINES; allowed: "
                     + ", ".join(f"{g}x{n}" for g, n, _ in CASES))
        if (g, n) not in known:
            sys.exit(f"--cases: {part!r} is not a case; allowed: " + ", ".join(f"{g}x{n}" for g, n, _ in CASES))
        out.append((g, n, known[(g, n)]))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(f"{g}x{n}" for g, n, _ in CASES),
                    help="comma-separated GPUSxPIPELINES (default: all)")
    ap.add_argument("--modes", default=",".join(MODES), help="incremental, from-scratch or both")
    ap.add_argument("--rounds", type=int, default=2000,
                    help="decide rounds per case at most (0: no limit, the whole run within --cpu-budget)")
    ap.add_argument("--cpu-budget", type=float, default=240.0, help="CPU seconds per case at most")
    ap.add_argument("--write", action="store_true", help="write the block into docs/benchmarks.md")
    ap.add_argument("--before", metavar="JSON", help="results file of an earlier build's run (this script's "
                    "benchmarks/results/decision_latency.json, taken from a copy of that build): shown under it")
    ap.add_argument("--before-label", default="the previous build", help="what --before measured")
    ap.add_argument("--breakdown", action="store_true",
                    help="only time the state build's and the policy's functions per round (a profiler's "
                         "view: BREAKDOWN) and print the split of the slowest 1%% of rounds of each case")
    ap.add_argument("--large-mix", type=int, default=None, metavar="SEED",
                    help="with --breakdown: the large mix of random_mixes.py --large drawn from SEED (e.g. 9018) "
                         "instead of the cases")
    ap.add_argument("--predictor-calls", action="store_true",
                    help="only time HistoryPredictor.predict by batch size (docs/predictor.md)")
    ap.add_argument("--render", action="store_true",
                    help="measure nothing: re-render the block from the saved results (with --before, "
                         "--before-label; --write writes it)")
    ap.add_argument("--results", default=None,
                    help="results file to save to (or --render from); default: the block's own "
                         f"({RESULTS.relative_to(ROOT)}), which a measurement saves to only with --write")
    ap.add_argument("--repeats", nargs=2, action="append", default=[], metavar=("BEFORE_JSONS", "AFTER_JSONS"),
                    help="with --render: comma-separated results files of alternated repeats of the earlier build "
                         "and of this one; their medians are shown under the tables (repeatable: one table each)")
    ap.add_argument("--policy-opt", action="append", default=[], metavar="KEY=VALUE",
                    help="a jigsaw config field for the measured runs (repeatable), e.g. reprice_on_change=true")
    ap.add_argument("--also", action="append", default=[], metavar="LABEL=PATH",
                    help="with --render: another invocation's results file shown under the main table "
                         "(its command, table, targets and tenths), e.g. a whole run; repeatable")
    args = ap.parse_args(argv)
    if args.large_mix is not None and not args.breakdown:
        ap.error("--large-mix: only with --breakdown (the block's cases are the demo's pipelines repeated)")
    results_path = Path(args.results) if args.results else RESULTS
    notes = _before_notes(args.before, args.before_label) if args.before else ""
    for spec in args.also:
        notes += _also_notes(spec)
    for pair in args.repeats:
        before, after = ([_load_results(f, "--repeats") for f in files.split(",")] for files in pair)
        notes += repeats_table(before, after)
    if args.render:
        try:
            saved = json.loads(results_path.read_text())
            text = section(saved["results"], saved["command"], saved["load_before"], saved["load_after"], notes)
        except (OSError, ValueError, KeyError, TypeError) as e:
            sys.exit(f"--render: {str(results_path)!r} is not a results file of this script ({e})")
        print(text)
        if args.write:
            write_doc_block(BLOCK, text)
        return
    if args.predictor_calls:
        print(f"load average {_load_avg()}")
        for row in predictor_calls():
            print(json.dumps(row))
        return
    if args.breakdown:
        print(f"load average {_load_avg()}")
        jobs = [(g, n, pr, args.rounds, args.cpu_budget) for g, n, pr in _parse_cases(args.cases)]
        if args.large_mix is not None:
            from random_mixes import large_mixes

            name, spec = large_mixes(args.large_mix, 1)[0]
            print(f"large mix {name}")
            jobs = [(spec["cluster"]["gpus"], len(spec["pipelines"]), 0, args.rounds, args.cpu_budget, spec)]
        for job in jobs:
            with ProcessPoolExecutor(max_workers=1, max_tasks_per_child=1) as ex:
                b = ex.submit(measure_breakdown, job).result()
            print(breakdown_text(b) + "\n")
        print(f"load average {_load_avg()}")
        return
    modes = tuple(m.strip() for m in args.modes.split(","))
    bad = [m for m in modes if m not in MODES]
    if bad:
        sys.exit(f"--modes: {bad[0]!r}; allowed: {', '.join(MODES)}")
    if args.rounds < 0 or not 0 < args.cpu_budget <= 3600:
        sys.exit(f"--rounds {args.rounds} / --cpu-budget {args.cpu_budget}: allowed --rounds >= 0 (0: the whole "
                 f"run) and --cpu-budget in (0, 3600] seconds")
    cases = _parse_cases(args.cases)
    load_before = _load_avg()
    options = _policy_options(args.policy_opt)
    results = _run_jobs([(g, n, pr, m, args.rounds, args.cpu_budget, options) for g, n, pr in cases for m in modes])
    load_after = _load_avg()
    command = "python benchmarks/decision_latency.py " + " ".join(argv if argv is not None else sys.argv[1:])
    # saved before the block is rendered: a rendering fault loses no measurement. A probe (no
    # --write, no --results) leaves the block's saved results alone: docs/benchmarks.md's
    # targets table is rendered from them (benchmarks/report.py), and a quick run of other
    # cases over them made the doc differ from its render
    save = bool(args.write or args.results)
    if save:
        results_path.parent.mkdir(parents=True, exist_ok=True)
        results_path.write_text(json.dumps({"command": command.strip(), "load_before": load_before,
                                            "load_after": load_after, "results": results}, indent=2))
    text = section(results, command.strip(), load_before, load_after, notes)
    print(text)
    if not save:
        print(f"\n(not saved: --write saves to {RESULTS.relative_to(ROOT)} and writes the block, "
              f"--results PATH saves there)")
    if args.write:
        write_doc_block(BLOCK, text)


if __name__ == "__main__":
    main()
