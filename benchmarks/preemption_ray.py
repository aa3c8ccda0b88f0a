"""Throughput under preemptions on Ray, real (issue 16, item 5), beside the simulator.

    flock /tmp/jigsaw-real.lock .venv-cpu/bin/python benchmarks/preemption_ray.py             # one repeat
    flock /tmp/jigsaw-real.lock .venv-cpu/bin/python benchmarks/preemption_ray.py --append    # one more repeat
    .venv-cpu/bin/python benchmarks/preemption_ray.py --render                                # the doc block only

One GRPO pipeline of the tiny model (runtime/preemption_run.py) on two one-core devices:
device 0 on demand, device 1 spot, preemptible at 0, 1 and 5 per device-hour (device time)
and replaced after 120 s, both time-scaled (``--time-scale``, default 30: one wall second
stands for 30 device seconds, so 5 per device-hour is one per 24 wall seconds). Recovery
``migrate`` (the preempted replica's requests resume on the on-demand one with their
tokens; the replacement pulls the latest weights from the parameter server; a preempted
trainer is restored from its checkpoint) against ``restart`` (the step's in-flight requests
are generated again from their first token; the rest is the same). A repeat runs every case
once on one seed (so migrate and restart see the same preemption times), in one Ray
session with one engine pool (engines started once; each run loads version 0 first).

The simulator's prediction for the same setup: the same workload in ``Simulation`` with
its time matched to the machine's (``k`` = the real rate-0 run's wall seconds over the
simulated rate-0 makespan): the rate per simulated second is the real one per wall second
times ``k``, the replacement delay the measured median one (delay plus the engine's start)
over ``k``; the mean over 20 seeds, converted back to samples per wall second.

Writes benchmarks/results/preemption_ray.json (every run, appended with ``--append``) and
the ``preemption-ray`` block of docs/benchmarks.md (medians over the repeats).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, md_table, write_doc_block  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "preemption_ray.json"
RATES = (0.0, 1.0, 5.0)
SIM_SEEDS = 20


def _cases(args, seed: int) -> list:
    from jigsaw_plugin.runtime.preemption_run import PreemptionCase

    base = PreemptionCase("", time_scale=args.time_scale, steps=args.steps, seed=seed,
                          prompts_per_step=args.prompts, response_len=(args.min_len, args.max_len))
    out = []
    for rate in args.rates:
        for recovery in (("migrate",) if rate == 0 else ("migrate", "restart")):
            out.append(replace(base, label=f"rate {rate:g} {recovery}", rate_per_hour=rate, recovery=recovery))
    return out


def _row(r) -> dict:
    return {
        "label": r.case.label, "rate_per_hour": r.case.rate_per_hour, "recovery": r.case.recovery,
        "time_scale": r.case.time_scale, "seed": r.case.seed, "steps": r.case.steps,
        "wall_s": r.wall_s, "samples": r.samples, "samples_per_s": r.samples_per_s,
        "preemptions": [asdict(p) for p in r.preemptions], "replacements": [asdict(x) for x in r.replacements],
        "pulls_ok": sum(p.ok for p in r.pulls), "pulls": len(r.pulls),
        "trainer_restores": len(r.trainer_restores), "stage_reruns": len(r.stage_reruns),
        "migrated": list(r.migrated), "restarted": list(r.restarted),
        "lost": r.samples_lost, "duplicated": r.samples_duplicated, "wrong_length": r.wrong_length,
        "staleness": {str(k): v for k, v in r.staleness.items()}, "staleness_bound": r.staleness_bound,
        "trainer_version": r.trainer_version, "segments": r.segments, "case": asdict(r.case),
    }


def _save(runs: list, pred: dict, notes=()) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"runs": runs, "prediction": pred, "notes": list(notes)}, indent=1))


async def _measure(args, seed: int, log=print, saved=(), notes=()) -> list:
    import ray

    from jigsaw_plugin.runtime.preemption_run import make_pool, run_case
    from jigsaw_plugin.runtime.tiny_model import build_tiny_qwen2

    model = build_tiny_qwen2(Path(args.workdir) / "tiny-qwen2-seed0", seed=0)
    ray.init(num_cpus=2, resources={"jigsaw_device": 2}, include_dashboard=False, log_to_driver=False,
             namespace="jigsaw-preemption-ray")
    pool = make_pool()
    rows = []
    try:
        for case in _cases(args, seed):
            load = os.getloadavg()
            r = await run_case(case, pool, model, workdir=Path(args.workdir) / f"seed{seed}" / case.label.replace(" ", "-"))
            row = dict(_row(r), load_before=load, load_after=os.getloadavg(), utc=time.strftime("%H:%M", time.gmtime()))
            rows.append(row)
            _save(list(saved) + rows, {}, notes)  # a run cut short keeps the cases it finished
            log(f"{case.label:>18}: {r.samples_per_s:.3f} samples/s, {r.wall_s:.1f} s, "
                f"{len(r.preemptions)} preemptions {[p.hit for p in r.preemptions]}, "
                f"{len(r.migrated)} resumed (tokens kept {sum(r.migrated)}), {len(r.restarted)} restarted "
                f"(tokens dropped {sum(r.restarted)}), pulls ok {row['pulls_ok']}/{row['pulls']}, "
                f"lost {r.samples_lost} dup {r.samples_duplicated} wrong {r.wrong_length}, staleness {r.staleness}, "
                f"load {load[0]:.1f}")
    finally:
        pool.shutdown()
        ray.shutdown()
    return rows


# ---- the simulator's prediction ----------------------------------------------------------------
def _simulate(case_dict: dict, rate_sim: float, replace_sim: float, seed: int) -> dict:
    from jigsaw_plugin.runtime.preemption_run import PreemptionCase, preemption_workload
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.sim import Simulation
    from jigsaw_plugin.workload import parse_workload

    case = PreemptionCase(**{**case_dict, "response_len": tuple(case_dict["response_len"])})
    spec = preemption_workload(replace(case, rate_per_hour=rate_sim, replace_s=replace_sim))
    return Simulation(parse_workload(spec), get_policy(case.policy), seed,
                      preemption_recovery=case.recovery).run()


def predict(runs: list) -> dict:
    """label -> the simulator's predicted samples per wall second (see the module docstring)."""
    base = [r for r in runs if r["rate_per_hour"] == 0]
    if not base:
        return {}
    sim0 = _simulate(base[0]["case"], 0.0, 0.0, 0)
    k = statistics.median(r["wall_s"] for r in base) / sim0["makespan_s"]
    downs = [x["down_s"] for r in runs for x in r["replacements"]]
    down = statistics.median(downs) if downs else 120.0 / base[0]["time_scale"]
    out = {"k": k, "replace_wall_s": down, "sim_rate0_makespan_s": sim0["makespan_s"]}
    for label in sorted({r["label"] for r in runs}):
        r = next(x for x in runs if x["label"] == label)
        rate_sim = r["rate_per_hour"] * r["time_scale"] * k
        sims = [_simulate(r["case"], rate_sim, down / k, s) for s in range(SIM_SEEDS)]
        out[label] = {"samples_per_s": statistics.mean(s["samples_per_s"] for s in sims) / k,
                      "preemptions": statistics.mean(s["preemptions"]["preemptions"] for s in sims),
                      "rate_sim_per_hour": rate_sim}
    return out


# ---- the doc block ------------------------------------------------------------------------------
def _all_checks_pass(runs: list) -> bool:
    return all(r["lost"] == r["duplicated"] == r["wrong_length"] == 0 and r["trainer_version"] == r["steps"]
               and all(int(k) <= r["staleness_bound"] for k in r["staleness"]) and r["pulls_ok"] == r["pulls"]
               for r in runs)


def render(runs: list, pred: dict, command: str, notes=()) -> str:
    labels = sorted({r["label"] for r in runs}, key=lambda s: (float(s.split()[1]), s))
    by = {lab: [r for r in runs if r["label"] == lab] for lab in labels}
    med0 = statistics.median(r["samples_per_s"] for r in by[labels[0]]) if labels else 1.0
    sim0 = pred.get(labels[0], {}).get("samples_per_s") if labels else None
    rows = []
    for lab in labels:
        rs = by[lab]
        med = statistics.median(r["samples_per_s"] for r in rs)
        hits = [p["hit"] for r in rs for p in r["preemptions"]]
        downs = [x["down_s"] for r in rs for x in r["replacements"]]
        p = pred.get(lab, {})
        rows.append([
            f"{rs[0]['rate_per_hour']:g}", f"{rs[0]['rate_per_hour'] * rs[0]['time_scale'] / 60:.2f}", rs[0]["recovery"],
            len(rs), f"{med:.3f}", f"{med / med0:.2f}x",
            f"{len(hits)} ({hits.count('replica')} / {hits.count('stage')} / {hits.count('idle')})",
            sum(len(r["migrated"]) for r in rs), f"{sum(sum(r['migrated']) for r in rs)} / "
                                                 f"{sum(sum(r['restarted']) for r in rs)}",
            f"{statistics.median(downs):.0f}" if downs else "-",
            f"{sum(r['pulls_ok'] for r in rs)}/{sum(r['pulls'] for r in rs)}",
            sum(r["trainer_restores"] for r in rs),
            f"{sum(r['lost'] for r in rs)} / {sum(r['duplicated'] for r in rs)} / {sum(r['wrong_length'] for r in rs)}",
            max(int(k) for r in rs for k in r["staleness"]) if any(r["staleness"] for r in rs) else "-",
            f"{p['samples_per_s']:.3f} ({p['samples_per_s'] / sim0:.2f}x)" if p and sim0 else "-",
        ])
    loads = [r["load_before"][0] for r in runs] + [r["load_after"][0] for r in runs]
    first = runs[0]
    text = [
        "### Preemption on Ray, real (issue 16, item 5)", "",
        f"`{command}` ({len(runs)} runs, {time.strftime('%Y-%m-%d', time.gmtime())}, {first['utc']}-{runs[-1]['utc']} UTC; "
        f"load average {min(loads):.1f}-{max(loads):.1f} over the runs on the shared 2-core machine). One GRPO pipeline of the "
        f"tiny model, {first['case']['prompts_per_step']} x {first['case']['samples_per_prompt']} samples per step, responses "
        f"{first['case']['response_len'][0]}-{first['case']['response_len'][1]} tokens, {first['steps']} steps, policy "
        f"`{first['case']['policy']}`; device 0 on demand, device 1 spot (its vLLM engine and, while a training stage runs "
        f"there, the trainer actor). **Time-scaled:** one wall second stands for {first['time_scale']:g} device seconds, so "
        f"the rates per device-hour are per {3600 / first['time_scale']:.0f} wall seconds and the 120 s replacement delay is "
        f"{120 / first['time_scale']:g} wall seconds (plus the replacement engine's real start). Samples/s: trained samples "
        f"over the executor's run; median over the repeats (seeds {sorted({r['seed'] for r in runs})}; migrate and restart "
        f"of one seed see the same preemption times).", "",
        md_table(["rate / device-h", "scaled: per wall min", "recovery", "runs", "samples/s (median)", "vs rate 0",
                  "preemptions (replica / stage / idle)", "requests resumed", "tokens kept / dropped",
                  "down s (median)", "pulls bit-identical", "trainer restores", "lost / dup / wrong length",
                  "max staleness", "simulator: samples/s (vs rate 0)"], rows), "",
        ("Every run: " if _all_checks_pass(runs) else "**Not every run passed these checks (see the table):** ")
        + "each sample of every step trained once at its full length (the trainer's checkpoint ledger against "
        "the workload sampler), the trainer's version equal to the step count, every sample generated within the "
        "staleness bound (0: sync), and every replacement engine holding the parameter server's newest version as of its "
        "pull (the sha256 of the tensors its vLLM worker loaded equal to the published version's). `down s`: from the "
        "preemption to the replacement joining (the scaled delay plus the fresh engine's start and weight pull on this "
        "machine).",
    ]
    text += ["", "Each run (label, seed: wall seconds of the executor's run; each preemption as what it hit @ wall "
                 "seconds into the run, then how long the device was down):", ""]
    for r in runs:
        pre = ", ".join(f"{p['hit']} @ {p['at_s']:.0f} s" + (f" (down {x['down_s']:.0f} s)" if x else "")
                        for p, x in zip(r["preemptions"], r["replacements"] + [None] * len(r["preemptions"])))
        text.append(f"- {r['label']}, seed {r['seed']}: {r['wall_s']:.1f} s, load {r['load_before'][0]:.1f}; "
                    f"{len(r['preemptions'])} preemption(s){': ' + pre if pre else ''}")
    text += [""] + [f"Note: {n}" for n in notes] if notes else []
    if pred:
        text += ["", f"Simulator: the same workload and policy in `Simulation`, its clock matched to this machine's "
                     f"(k = {pred['k']:.2f} wall seconds per simulated second, from the rate-0 runs), rates times k, "
                     f"replacement delay {pred['replace_wall_s']:.0f} wall s (the measured median), mean of {SIM_SEEDS} "
                     f"seeds, in samples per wall second."]
    return "\n".join(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--time-scale", type=float, default=30.0)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--min-len", type=int, default=128)
    ap.add_argument("--max-len", type=int, default=320)
    ap.add_argument("--seed", type=int, default=None, help="default: 0, or the next unused seed with --append")
    ap.add_argument("--rates", type=float, nargs="+", default=list(RATES), help="preemptions per device-hour")
    ap.add_argument("--append", action="store_true", help="add this repeat to the runs already in the results file")
    ap.add_argument("--render", action="store_true", help="no runs: re-render the doc block from the results file")
    ap.add_argument("--no-docs", action="store_true")
    ap.add_argument("--workdir", default="/tmp/jigsaw-preemption-ray")
    args = ap.parse_args(argv)
    from jigsaw_plugin.errors import SpecError

    if not args.time_scale > 0 or args.steps < 1 or args.prompts < 1 or not 1 <= args.min_len <= args.max_len:
        raise SpecError("--time-scale/--steps/--prompts/--min-len/--max-len",
                        (args.time_scale, args.steps, args.prompts, args.min_len, args.max_len),
                        "time scale > 0, steps >= 1, prompts >= 1, 1 <= min-len <= max-len")
    saved = json.loads(RESULTS.read_text()) if RESULTS.exists() and (args.append or args.render) else {}
    old, notes = saved.get("runs", []), saved.get("notes", [])  # notes: what a reader must know, kept by hand
    runs = list(old)
    if not args.render:
        seed = args.seed if args.seed is not None else (max((r["seed"] for r in old), default=-1) + 1)
        runs += asyncio.run(_measure(args, seed, saved=old, notes=notes))
    pred = predict(runs)
    _save(runs, pred, notes)
    command = ("flock /tmp/jigsaw-real.lock .venv-cpu/bin/python benchmarks/preemption_ray.py --time-scale 300 "
               "--steps 6 [--append]")
    text = render(runs, pred, command, notes)
    print(text)
    if not args.no_docs:
        write_doc_block("preemption-ray", text)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # a SpecError (bad option) is one line; anything else is a real failure
        from jigsaw_plugin.errors import SpecError

        if isinstance(e, SpecError):
            print(f"preemption_ray.py: {e}", file=sys.stderr)
            sys.exit(2)
        raise
