"""jigsaw against every baseline on the bundled workloads (a)-(d), ablations, trade-offs.

For verl-sync the rollout tensor-parallel size is a user choice that moves its throughput,
so it is swept (1, 2, 4) and the best is reported beside the default, so that jigsaw is
compared with a tuned baseline, not a weak one. The disaggregated baselines choose their
rollout/training split from an offline profile of the workload (``estimates.balanced_split``), as
StreamRL and AReaL do by profiling.
"""

from __future__ import annotations

import copy

import yaml
from common import EXAMPLES, GAP_HEAD, ROOT, dump, gap_row, md_table, run_many

from jigsaw_plugin.workload import parse_workload

from jigsaw_plugin.bench import ab
from jigsaw_plugin.bench.bundled import BUNDLED_WORKLOADS

RESULTS = ROOT / "benchmarks" / "results" / "policies.json"
# each disaggregated baseline's best rollout size per pipeline, from a sweep (tuned_splits)
SPLITS = ROOT / "benchmarks" / "results" / "async_splits.json"

# (a)-(d) of the bundled registry; (e) and (f) have their own script (workloads_ef.py)
WORKLOADS = {w.key: (w.file, w.title) for w in BUNDLED_WORKLOADS if w.key in "abcd"}
BASELINES = ("verl-sync", "one-step-off", "streamrl", "areal", "rollmux")
ASYNC_BASELINES = ("one-step-off", "streamrl", "areal")
# `jigsaw bench --ablate`'s mechanisms: those on by default switched off, then those off by
# default switched on ("with ...")
ABLATIONS = ab.ABLATIONS + ab.OFF_BY_DEFAULT
OFF_BY_DEFAULT = ab.OFF_BY_DEFAULT
SHOWN_ABLATIONS = ABLATIONS


def _label(a: str) -> str:
    return f"with {a}" if a in OFF_BY_DEFAULT else f"no {a}"


def with_tp(fname: str, tp: int) -> dict:
    d = yaml.safe_load((EXAMPLES / fname).read_text())
    d = copy.deepcopy(d)
    for p in d["pipelines"]:
        p["rollout_tp"] = max(tp, 1 if "32b" not in p["model"] else 4)
    return d


def _alone(spec: dict, name: str, share: int) -> dict:
    """``spec`` with only pipeline ``name``, on a pool of its own share: a disaggregated
    baseline runs each pipeline on its share alone (and a pipeline's samples are seeded by
    its name), so its run there is its run in the mix."""
    one = copy.deepcopy(spec)
    one["pipelines"] = [dict(p, gpus=share) for p in one["pipelines"] if p["name"] == name]
    one["cluster"] = dict(one["cluster"], gpus=share)
    return one


def tuned_splits() -> dict:
    """Each disaggregated baseline's rollout size per pipeline, swept (every size its share
    allows, each pipeline alone on its share) and the fastest kept: the split a user tunes,
    as "verl-sync best tp" tunes verl-sync, so that jigsaw is not compared with a split the
    baseline's own rule got wrong. {workload key: {policy: {pipeline: rollout devices}}}"""
    from jigsaw_plugin.core.pipelines import build_pipelines
    from jigsaw_plugin.costmodel import CostModel, hardware_profile
    from jigsaw_plugin.scheduler.estimates import rollout_tp, split_rollout_sizes

    jobs, keys = [], []
    for key, (fname, _) in WORKLOADS.items():
        spec = yaml.safe_load((EXAMPLES / fname).read_text())
        wl = parse_workload(spec, base_dir=EXAMPLES)
        cost = CostModel.for_nodes(hardware_profile(wl.cluster.gpu), wl.cluster.gpus_per_node)
        for p in build_pipelines(wl):
            share = len(p.static_devices)
            for b in ASYNC_BASELINES:
                for r in split_rollout_sizes(rollout_tp(p, cost), p.model, cost, share):
                    jobs.append((_alone(spec, p.name, share), b, {"rollout_gpus": r}, 0))
                    keys.append((key, b, p.name, r))
    best: dict = {}
    for (key, b, name, r), res in zip(keys, run_many(jobs)):
        cur = best.setdefault(key, {}).setdefault(b, {}).get(name)
        if cur is None or res["makespan_s"] < cur[1] - 1e-9:
            best[key][b][name] = (r, res["makespan_s"])
    return {key: {b: {name: r for name, (r, _) in per.items()} for b, per in pols.items()}
            for key, pols in best.items()}


def jobs_for(fname: str, splits: dict | None = None) -> list:
    """The runs of one workload, in the order ``run`` reads them: the baselines, verl-sync
    at tp 2 and 4, the disaggregated baselines at their tuned splits (``splits``: policy ->
    {pipeline: rollout devices}), jigsaw, its ablations, the oracle ablation."""
    jobs = [(fname, b, None, 0) for b in BASELINES]
    jobs += [(with_tp(fname, tp), "verl-sync", None, 0) for tp in (2, 4)]
    jobs += [(fname, b, {"rollout_gpus": (splits or {}).get(b, {})}, 0) for b in ASYNC_BASELINES]
    jobs += [(fname, "jigsaw", None, 0)]
    jobs += [(fname, "jigsaw", ab.ablation_options("jigsaw", [a]), 0) for a in ABLATIONS]
    jobs += [(fname, "jigsaw", None, 0, "oracle")]  # ablation: true lengths instead of the predictor
    return jobs


def _pct(x) -> str:
    return "-" if x is None else f"{x:.0%}"


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _is_jigsaw(job) -> bool:
    return job[1] == "jigsaw"


def _rerun(all_jobs: list, jigsaw: bool) -> list:
    """Re-run only jigsaw's jobs (``jigsaw``: the policy changed) or only the baselines'
    (a baseline changed), keeping the other side's saved runs, which the change does not
    touch; a saved file from an older job list is refused."""
    import json

    saved = json.loads(RESULTS.read_text())
    kept = [r for r in saved if (r["policy"] == "jigsaw") != jigsaw]
    expected = sum(1 for j in all_jobs if _is_jigsaw(j) != jigsaw)
    if len(kept) != expected:
        flag = "--jigsaw-only" if jigsaw else "--baselines-only"
        raise SystemExit(f"{RESULTS}: {len(kept)} saved runs to keep, {expected} expected; run without {flag}")
    fresh = iter(run_many([j for j in all_jobs if _is_jigsaw(j) == jigsaw]))
    kept = iter(kept)
    return [next(fresh) if _is_jigsaw(j) == jigsaw else next(kept) for j in all_jobs]


def _rebound(all_jobs: list, spans: dict) -> list:
    """The saved runs with their bounds derived again (after a change to ``core/bounds.py``
    alone): a run's bounds are a function of its workload's samples (seed 0 for every
    policy), its cost model and the simulator's capabilities, not of its policy, so each
    workload's default jigsaw run is repeated and its bounds replace every saved run's of
    that workload; the repeat's makespan must be the saved one's (no policy changed)."""
    import json

    saved = json.loads(RESULTS.read_text())
    if len(saved) != len(all_jobs):
        raise SystemExit(f"{RESULTS}: {len(saved)} saved runs, {len(all_jobs)} expected; run without --rebound")
    firsts = {key: next(i for i in range(start, start + n) if all_jobs[i][1] == "jigsaw" and all_jobs[i][2] is None)
              for key, (start, n) in spans.items()}
    for (key, i), fresh in zip(firsts.items(), run_many([all_jobs[i] for i in firsts.values()])):
        if abs(fresh["makespan_s"] - saved[i]["makespan_s"]) > 1e-6 * saved[i]["makespan_s"]:
            raise SystemExit(f"({key}) jigsaw {fresh['makespan_s']:.1f} s, saved {saved[i]['makespan_s']:.1f} s: "
                             "a policy changed; run without --rebound")
        start, n = spans[key]
        for r in saved[start:start + n]:
            r["bounds"] = fresh["bounds"]
    return saved


def _rerun_defaults(all_jobs: list) -> list:
    """Re-run only jigsaw's runs with its default options (the default predictor and the
    oracle ablation), every other run the saved one: a change of a default moves these
    first, and the ablation rows (one run each per workload) then read against this build's
    defaults. A saved file from an older job list is refused."""
    import json

    saved = json.loads(RESULTS.read_text())
    if len(saved) != len(all_jobs):
        raise SystemExit(f"{RESULTS}: {len(saved)} saved runs, {len(all_jobs)} jobs now; run with --add-ablation "
                         f"or without --defaults")
    new = [j for j in all_jobs if _is_jigsaw(j) and j[2] is None]
    fresh = iter(run_many(new))
    return [next(fresh) if _is_jigsaw(j) and j[2] is None else old for j, old in zip(all_jobs, saved)]


def _add_ablation(all_jobs: list, names: str) -> list:
    """Run only the jobs of the ablations ``names`` (comma-separated); every other run is
    the saved one. The saved file holds the job list in the same order, without those
    ablations (newly added) or with them (re-run in place: their rules changed)."""
    import json

    saved = json.loads(RESULTS.read_text())
    wanted = set(names.split(","))
    unknown = sorted(wanted - set(ABLATIONS))
    if unknown:
        raise SystemExit(f"--add-ablation: {', '.join(unknown)} is not one of {', '.join(ABLATIONS)}")
    new = [j for j in all_jobs if _is_jigsaw(j) and j[2] is not None and len(j[2]) == 1 and set(j[2]) <= wanted]
    fresh = iter(run_many(new))
    if len(saved) == len(all_jobs):
        return [next(fresh) if j in new else old for j, old in zip(all_jobs, saved)]
    if len(saved) + len(new) != len(all_jobs):
        raise SystemExit(f"{RESULTS}: {len(saved)} saved runs + {len(new)} new != {len(all_jobs)} jobs")
    kept = iter(saved)
    return [next(fresh) if j in new else next(kept) for j in all_jobs]


def run(reuse: bool = False, jigsaw_only: bool = False, add_ablation: str | None = None,
        baselines_only: bool = False, rebound: bool = False, defaults: bool = False) -> tuple[str, dict]:
    """``reuse``: render the runs saved by the last call (benchmarks/results/policies.json);
    ``rebound``: the saved runs with their bounds derived again (``_rebound``);
    ``jigsaw_only``: re-run only the jigsaw runs, the baselines' from the saved file;
    ``baselines_only``: re-run only the baselines, jigsaw's from the saved file;
    ``add_ablation``: run only these ablations' jobs (comma-separated; new, or re-run), the rest
    from the saved file; ``defaults``: re-run only jigsaw's default runs (``_rerun_defaults``)."""
    import json

    if reuse or jigsaw_only or add_ablation or rebound or defaults:
        splits = json.loads(SPLITS.read_text())
    else:
        splits = tuned_splits()
        dump(splits, SPLITS)
    all_jobs, spans = [], {}
    for key, (fname, _) in WORKLOADS.items():
        jobs = jobs_for(fname, splits[key])
        spans[key] = (len(all_jobs), len(jobs))
        all_jobs += jobs
    if reuse:
        import json

        results = json.loads(RESULTS.read_text())
        if len(results) != len(all_jobs):  # read by position: a shorter file would misalign every row
            raise SystemExit(f"{RESULTS}: {len(results)} saved runs, {len(all_jobs)} jobs now (an ablation added "
                             f"since: run it with --add-ablation NAME[,NAME])")
    elif rebound:
        results = _rebound(all_jobs, spans)
        dump(results, RESULTS)
    elif jigsaw_only:
        results = _rerun(all_jobs, jigsaw=True)
        dump(results, RESULTS)
    elif baselines_only:
        results = _rerun(all_jobs, jigsaw=False)
        dump(results, RESULTS)
    elif add_ablation:
        results = _add_ablation(all_jobs, add_ablation)
        dump(results, RESULTS)
    elif defaults:
        results = _rerun_defaults(all_jobs)
        dump(results, RESULTS)
    else:
        results = run_many(all_jobs)
        dump(results, RESULTS)  # kept: a later failure of the report must not cost the runs
    sections, summary = [], {}
    main_rows, abl_cols, lat_rows, bound_rows, pred_rows, gap_rows = [], [], [], [], [], []
    for key, (fname, title) in WORKLOADS.items():
        start, n = spans[key]
        rs = results[start:start + n]
        by = {r["policy"]: r for r in rs[: len(BASELINES)]}
        at = len(BASELINES)
        tuned = max([by["verl-sync"]] + rs[at: at + 2], key=lambda r: r["samples_per_s"])
        split = {r["policy"]: r for r in rs[at + 2: at + 2 + len(ASYNC_BASELINES)]}
        at += 2 + len(ASYNC_BASELINES)
        jig = rs[at]
        abl = rs[at + 1: at + 1 + len(ABLATIONS)]
        oracle = rs[-1]
        # the best asynchronous run: each disaggregated baseline at its own split or its tuned one
        best_async = max([by[b] for b in ASYNC_BASELINES] + list(split.values()), key=lambda r: r["samples_per_s"])
        sps = jig["samples_per_s"]
        summary[key] = {
            "vs_verl_sync": sps / by["verl-sync"]["samples_per_s"],
            "vs_tuned_verl_sync": sps / tuned["samples_per_s"],
            "vs_best_async": sps / best_async["samples_per_s"],
            "best_async": best_async["policy"] + (" tuned split" if best_async["options"] else ""),
            "busy": jig["gpu_busy_fraction"],
            "p99_us": jig["scheduler"]["decision_p99_us"],
            "p50_us": jig["scheduler"]["decision_p50_us"],
            "gap_recovered": ab.gap_recovered(by["verl-sync"], jig),
            "bound_ratio": by["verl-sync"]["makespan_s"] / jig["bounds"]["makespan_lower_bound_s"],
            # the most any policy could gain over the best asynchronous run on the cost model
            "async_bound_ratio": best_async["makespan_s"] / jig["bounds"]["makespan_lower_bound_s"],
            # the latency trade-off: each pipeline's mean step under jigsaw over its mean step
            # alone on its static share (verl-sync), the largest
            "max_step_ratio": max(pj["mean_step_s"] / by["verl-sync"]["pipelines"][name]["mean_step_s"]
                                  for name, pj in jig["pipelines"].items()),
        }
        row = [f"({key}) {title}"]
        for b in BASELINES:
            row.append(f"{by[b]['samples_per_s']:.1f}" + (f" / {split[b]['samples_per_s']:.1f}" if b in split else ""))
        row += [f"{tuned['samples_per_s']:.1f}", f"{sps:.1f}",
                f"**{summary[key]['vs_verl_sync']:.2f}x** / {summary[key]['vs_tuned_verl_sync']:.2f}x",
                f"{summary[key]['vs_best_async']:.2f}x ({summary[key]['best_async']})",
                f"{jig['gpu_busy_fraction']:.2f} (verl {by['verl-sync']['gpu_busy_fraction']:.2f})"]
        main_rows.append(row)
        shown = [a for name, a in zip(ABLATIONS, abl) if name in SHOWN_ABLATIONS]
        # one column per workload: a row per mechanism reads down (36 columns did not)
        abl_cols.append([f"{sps:.1f}"] + [
            f"{a['samples_per_s']:.1f} ({100 * (a['samples_per_s'] / sps - 1):+.0f}%)" for a in shown + [oracle]])
        for name, r in (("verl-sync", by["verl-sync"]), ("jigsaw", jig)):
            row = gap_row(f"({key})", name, r)
            if row:
                gap_rows.append(row)
        b = jig["bounds"]
        acc = jig["predictor"]
        bound_rows.append([f"({key})", f"{b['work_s']:.0f}", f"{b['critical_path_s']:.0f}",
                           f"{b['makespan_lower_bound_s']:.0f}", f"{summary[key]['bound_ratio']:.2f}x",
                           f"{by['verl-sync']['makespan_s']:.0f}", f"{jig['makespan_s']:.0f}",
                           f"{_pct(summary[key]['gap_recovered'])}",
                           f"{by['verl-sync']['effective_utilisation']:.2f} / {jig['effective_utilisation']:.2f}",
                           f"{jig['gpu_busy_fraction']:.2f}"])
        pred_rows.append([f"({key})", f"{sps:.1f}", f"{oracle['samples_per_s']:.1f}",
                          f"{sps / oracle['samples_per_s'] - 1:+.1%}", _num(acc.get("remaining_tokens_mae"), ".0f"),
                          _num(acc.get("remaining_tokens_rel_error"), ".2f"), _num(acc.get("rank_corr"), ".2f"),
                          _num(acc.get("remaining_s_mae"), ".1f"), acc.get("notes"),
                          _pct(ab.gap_recovered(by["verl-sync"], oracle))])
        for name, pj in jig["pipelines"].items():
            pv = by["verl-sync"]["pipelines"][name]
            lat_rows.append([f"({key})", name, f"{pv['mean_step_s']:.1f}", f"{pj['mean_step_s']:.1f}",
                             f"{pj['mean_step_s'] / pv['mean_step_s']:.2f}", pj["migrations"], pj["max_staleness"]])
    sections.append(md_table(
        ["workload"] + [f"{b} samples/s" + (" (own split / tuned)" if b in ASYNC_BASELINES else "")
                        for b in BASELINES] + ["verl-sync best tp", "jigsaw",
         "jigsaw / verl-sync (default / best tp)", "jigsaw / best async", "jigsaw busy"], main_rows))
    sections.append("Against the bound (docs/simulator.md derives each bound): `work_s` = ideal device-seconds / "
                    "GPUs, `critical_path_s` = the longest pipeline's unoverlappable chain; gap recovered = "
                    "(verl-sync makespan - jigsaw makespan) / (verl-sync makespan - makespan lower bound).\n\n" +
                    md_table(["workload", "work_s", "critical_path_s", "makespan lower bound s",
                              "bound / verl-sync (max speed-up)", "verl-sync makespan s", "jigsaw makespan s",
                              "gap recovered", "effective utilisation verl-sync / jigsaw", "jigsaw busy"],
                             bound_rows))
    if gap_rows:
        sections.append("Where the rest goes: the device-seconds between each run and the ideal "
                        "(`gap_breakdown` in the result JSON, `core/bounds.py`), as average devices over the "
                        "makespan and split four ways: devices with no task; rollout replicas above the ideal "
                        "decode and prefill (small batches, KV reads, re-prefill, replicas waiting on tools); "
                        "training passes above their compute and fixed cost on the fewest devices (the fixed "
                        "cost paid on wider gangs, gangs past their cheapest width, context switches); weight syncs.\n\n" + md_table(GAP_HEAD, gap_rows))
    names = ["jigsaw (defaults)"] + [_label(a) for a in SHOWN_ABLATIONS] + ["ORACLE lengths"]
    abl_rows = [[name] + [col[i] for col in abl_cols] for i, name in enumerate(names)]
    sections.append("Ablations: jigsaw samples/s with one mechanism switched off, or on where it is off by default "
                    "(\"with ...\"; change vs jigsaw's defaults); the last "
                    "row is the ORACLE ablation: true remaining lengths instead of the predictor.\n\n" +
                    md_table(["mechanism"] + [f"({key})" for key in WORKLOADS], abl_rows))
    sections.append("The length predictor (the default) against the oracle ablation, and its accuracy at the "
                    "policy's decision points (remaining tokens of in-flight requests, scored when they end).\n\n" +
                    md_table(["workload", "jigsaw (predictor) samples/s", "jigsaw (ORACLE) samples/s",
                              "predictor vs oracle", "remaining-tokens MAE", "relative error", "rank corr.",
                              "remaining-s MAE", "scored predictions", "oracle gap recovered"], pred_rows))
    sections.append("Per-pipeline latency trade-off: mean step time alone on its static share (verl-sync) "
                    "and under jigsaw.\n\n" + md_table(
                        ["workload", "pipeline", "verl-sync step s", "jigsaw step s", "ratio", "migrations",
                         "max staleness"], lat_rows))
    return "\n\n".join(sections), summary


if __name__ == "__main__":
    import sys

    add = sys.argv[sys.argv.index("--add-ablation") + 1] if "--add-ablation" in sys.argv else None
    text, summary = run(jigsaw_only="--jigsaw-only" in sys.argv, add_ablation=add)
    print(text)
    print(summary)
