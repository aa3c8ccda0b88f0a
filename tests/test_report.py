"""The A/B report: the saved run, report.md, figures and Perfetto traces hold the run's
numbers; the timeline is the same whether read from the simulator or from hook events."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from jigsaw_plugin.bench.figures import FIGURES, devices_busy_over_time
from jigsaw_plugin.bench.rundir import load_run
from jigsaw_plugin.bench.spans import MIGRATION_HOOKS, ROLLOUT, timeline_from_events, timeline_of

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "workloads" / "demo.yaml"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def jigsaw(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "jigsaw_plugin.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd or ROOT)


@pytest.fixture(scope="module")
def small_workload(tmp_path_factory) -> Path:
    """demo.yaml cut to 2 steps of 16 prompts: a tail, migrations, seconds to simulate."""
    data = yaml.safe_load(DEMO.read_text())
    for p in data["pipelines"]:
        p["steps"], p["prompts_per_step"] = 2, 16
    path = tmp_path_factory.mktemp("wl") / "small.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def bench_dir(small_workload, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "ab"
    p = jigsaw("bench", small_workload, "--baseline", "verl-sync", "--seed", 3, "--out", out)
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""  # not a terminal: no progress drawn, and nothing to warn about
    assert f"report: {out / 'report.md'}" in p.stdout
    return out


def _sim(workload_path, policy, events=None, **options):
    from jigsaw_plugin.events import EventRecorder
    from jigsaw_plugin.manager import Emitter, get_plugin_manager, register
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.sim import Simulation
    from jigsaw_plugin.workload import load_workload

    pm = get_plugin_manager(load_entrypoints=False)
    rec = EventRecorder(include_progress=False, hooks=events)
    register(pm, rec, "rec")
    sim = Simulation(load_workload(workload_path), get_policy(policy, **options), seed=0, hooks=Emitter(pm))
    return sim, sim.run(), rec.events


def test_bench_dir_holds_the_records_the_report_and_the_figures(bench_dir):
    for name in ("result.json", "spans.json", "report.md", "trace_baseline.json", "trace_candidate.json", *FIGURES):
        assert (bench_dir / name).is_file(), name
    for name in FIGURES:
        assert (bench_dir / name).read_bytes()[:8] == PNG_MAGIC
    result = json.loads((bench_dir / "result.json").read_text())
    assert result["baseline"]["policy"] == "verl-sync" and result["candidate"]["policy"] == "jigsaw"
    assert result["seed"] == 3 and result["backend"] == "sim"
    assert result["command"].startswith("jigsaw bench ") and "--seed 3" in result["command"]
    assert result["versions"]["jigsaw-plugin"] and result["versions"]["python"]
    assert result["throughput_ratio"] == pytest.approx(
        result["candidate"]["samples_per_s"] / result["baseline"]["samples_per_s"])


def test_report_md_prints_the_numbers_of_result_json(bench_dir):
    result = json.loads((bench_dir / "result.json").read_text())
    report = (bench_dir / "report.md").read_text()
    b, c = result["baseline"], result["candidate"]
    assert f"{result['throughput_ratio']:.2f}x" in report
    assert f"| samples/s | {b['samples_per_s']:.2f} | {c['samples_per_s']:.2f} |" in report
    assert f"| {b['gpu_busy_fraction']:.2f} | {c['gpu_busy_fraction']:.2f} |" in report
    for name, pb in b["pipelines"].items():
        pc = c["pipelines"][name]
        row = next(line for line in report.splitlines() if line.startswith(f"| {name} |"))
        assert f"| {pb['mean_step_s']:.1f} | {pc['mean_step_s']:.1f} |" in row
        assert f"| {pb['migrations']} / {pc['migrations']} |" in row
        assert f"| {pb['context_switches']} / {pc['context_switches']} |" in row
    assert result["command"] in report and "seed 3" in report
    assert f"jigsaw-plugin {result['versions']['jigsaw-plugin']}" in report
    for name in FIGURES:
        assert f"]({name})" in report
    # metrics the result does not carry are not invented
    assert ("effective utilisation" in report) == ("effective_utilisation" in c)
    assert ("bound:" in report) == ("bounds" in c)


def test_trace_is_chrome_trace_json_with_one_track_per_device(bench_dir):
    result = json.loads((bench_dir / "result.json").read_text())
    saved = load_run(bench_dir)
    for side, timeline in (("baseline", saved.baseline), ("candidate", saved.candidate)):
        trace = json.loads((bench_dir / f"trace_{side}.json").read_text())
        events = trace["traceEvents"]
        for e in events:
            assert {"ph", "pid", "tid", "name"} <= set(e)
            assert e["ph"] in ("M", "X", "i", "s", "f")
            if e["ph"] != "M":
                assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
            if e["ph"] == "X":
                assert e["dur"] >= 0
        tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
        names = sorted(tracks.values(), key=lambda n: int(n.split()[1]))
        assert names == [f"device {d}" for d in range(result[side]["gpus"])]
        assert {(e["pid"], e["tid"]) for e in events if e["ph"] == "X"} <= set(tracks)
        # every span is drawn once on each of its devices
        assert sum(1 for e in events if e["ph"] == "X") == sum(len(s.devices) for s in timeline.spans)
        starts = {e["id"] for e in events if e["ph"] == "s"}
        assert starts == {e["id"] for e in events if e["ph"] == "f"}
        assert len(starts) == sum(1 for m in timeline.migrations if m.src_devices and m.dst_devices)
    # jigsaw migrates on this workload: the trace shows it, as many requests as the result counts
    moved = sum(p["migrations"] for p in result["candidate"]["pipelines"].values())
    assert moved > 0 and sum(m.requests for m in saved.candidate.migrations) == moved


def test_report_rerenders_and_compares_saved_runs_without_rerunning(bench_dir, small_workload, tmp_path):
    before = (bench_dir / "report.md").read_text()
    for name in ("report.md", *FIGURES, "trace_candidate.json"):
        (bench_dir / name).unlink()
    other = tmp_path / "ab-ablated"
    p = jigsaw("bench", small_workload, "--baseline", "verl-sync", "--seed", 3, "--ablate", "migration",
               "--out", other)
    assert p.returncode == 0, p.stderr
    compare = tmp_path / "compare.md"
    p = jigsaw("report", bench_dir, other, "--out", compare)
    assert p.returncode == 0, p.stderr
    assert (bench_dir / "report.md").read_text() == before  # same records, same report
    for name in (*FIGURES, "trace_candidate.json"):
        assert (bench_dir / name).is_file()
    table = compare.read_text()
    for d in (bench_dir, other):
        r = json.loads((d / "result.json").read_text())
        assert f"{r['throughput_ratio']:.2f}x" in table and str(d) in table
    assert "jigsaw (no migration)" in table


def test_report_refuses_a_folder_that_is_not_a_saved_run(tmp_path):
    p = jigsaw("report", tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "result.json" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    (tmp_path / "result.json").write_text("{not json")
    (tmp_path / "spans.json").write_text("{}")
    p = jigsaw("report", tmp_path)
    assert p.returncode == 2 and "not JSON" in p.stderr and "Traceback" not in p.stderr


def test_spans_from_hook_events_match_the_simulators_record(small_workload):
    # the ray backend's timelines come from hook events: they must say what the simulator's record says.
    # Micro-batch loans off (the critical pipeline's too): a stage resized at a boundary is
    # one start/end pair of hook events, drawn on its starting devices (docs/report.md),
    # while the record splits it
    sim, result, events = _sim(small_workload, "jigsaw", loans=False, critical_loans=False)
    direct = timeline_of(sim, [e for e in events if e["hook"] in MIGRATION_HOOKS])
    rebuilt = timeline_from_events(events, sim.workload.cluster.gpus, sim.workload.cluster.gpus_per_node)

    def key(s):
        return (s.pipeline, s.kind, s.devices, round(s.start_s, 6), round(s.end_s, 6))

    assert sorted(map(key, rebuilt.spans)) == sorted(map(key, direct.spans))
    assert sum(m.requests for m in rebuilt.migrations) == sum(m.requests for m in direct.migrations)
    for name, pr in result["pipelines"].items():
        assert sum(1 for s in direct.spans if s.pipeline == name and s.kind == "update_actor") == pr["steps"]
        assert any(s.pipeline == name and s.kind == ROLLOUT for s in direct.spans)
    assert all(m.src_devices and m.dst_devices for m in direct.migrations)


def test_utilisation_curve_counts_each_device_once(small_workload):
    sim, result, _ = _sim(small_workload, "verl-sync", events=())
    tl = timeline_of(sim)
    times, fracs = devices_busy_over_time(tl)
    assert max(fracs) <= 1.0 and fracs[-1] == 0.0 and times == sorted(times)
    # the area under the curve is the device-seconds covered by spans (union per device)
    area = sum((t1 - t0) * f for t0, t1, f in zip(times, times[1:], fracs)) * tl.gpus
    covered = 0.0
    for d in range(tl.gpus):
        intervals = sorted((s.start_s, s.end_s) for s in tl.spans if d in s.devices)
        end = 0.0
        for a, b in intervals:
            covered += max(0.0, b - max(a, end))
            end = max(end, b)
    assert area == pytest.approx(covered)


def test_progress_line_reports_steps_and_simulated_seconds(small_workload):
    import io

    from jigsaw_plugin.bench.progress import SimProgress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    stream = Tty()
    with SimProgress("simulating verl-sync", 4, enabled=True, stream=stream) as bar:
        for step in range(2):
            for name in ("a", "b"):
                bar.jigsaw_step_end(pipeline=name, step=step, t=10.0 * (step + 1))
    assert "4/4" in stream.getvalue() and "20 s simulated" in stream.getvalue()
    quiet = Tty()
    with SimProgress("x", 4, enabled=False, stream=quiet) as bar:
        bar.jigsaw_step_end(pipeline="a", step=0, t=1.0)
    assert quiet.getvalue() == ""


def test_doctor_verdicts_and_exit_code():
    from jigsaw_plugin.bench.ab import ray_backend_available

    p = jigsaw("doctor")
    assert p.returncode == 0, p.stdout + p.stderr
    for heading in ("hosts:", "entry points:", "devices:", "verdict:"):
        assert heading in p.stdout
    assert "CPU cores" in p.stdout
    verdicts = {line[14:24].strip(): line[2:14].strip() for line in p.stdout.split("verdict:")[1].splitlines()
                if line[2:14].strip() in ("READY", "NOT READY")}
    assert set(verdicts) == {"sim", "ray", "verl", "openrlhf"} and verdicts["sim"] == "READY"
    p = jigsaw("doctor", "--host", "ray")
    if ray_backend_available():
        assert p.returncode == 0 and verdicts["ray"] == "READY"
    else:
        assert verdicts["ray"] == "NOT READY"
        assert p.returncode == 1 and "not ready for: ray" in p.stdout and "torch==2.13.0" in p.stdout


def _rerendered(bench_dir, run, edit) -> tuple[dict, str]:
    """A copy of the saved run at ``run`` whose result.json ``edit`` changed, re-rendered by
    ``jigsaw report``: (the edited result, its report.md)."""
    import shutil

    shutil.copytree(bench_dir, run)
    result = json.loads((run / "result.json").read_text())
    edit(result)
    (run / "result.json").write_text(json.dumps(result))
    p = jigsaw("report", run)
    assert p.returncode == 0, p.stderr
    return result, (run / "report.md").read_text()


def test_report_shows_utilisation_bounds_and_gap_when_the_result_has_them(bench_dir, tmp_path):
    # the policy issue adds these fields to the result; the report prints them as they are
    def add_bounds(result):
        for side, eff, lb in (("baseline", 0.41, 250.0), ("candidate", 0.57, 250.0)):
            result[side]["effective_utilisation"] = eff
            result[side]["bounds"] = {"work_s": 180.5, "critical_path_s": 240.25, "makespan_lower_bound_s": lb}
        result["gap_recovered"] = 0.625

    run = tmp_path / "with-bounds"
    _, report = _rerendered(bench_dir, run, add_bounds)
    assert "| effective utilisation | 0.41 | 0.57 | 1.39x |" in report
    assert "| bound: makespan_lower_bound_s | 250.00 | 250.00 |" in report
    assert "| bound: critical_path_s | 240.25 | 240.25 |" in report
    assert "gap_recovered: **0.625**" in report
    assert (run / "throughput.png").read_bytes()[:8] == PNG_MAGIC


def test_report_and_summary_show_where_the_gap_went_not_a_raw_dict(bench_dir):
    from jigsaw_plugin.bench.ab import format_ab

    result = json.loads((bench_dir / "result.json").read_text())
    report = (bench_dir / "report.md").read_text()
    b, c = result["baseline"]["gap_breakdown"], result["candidate"]["gap_breakdown"]
    assert "gap_breakdown" not in report and "{'" not in report  # the table, not the dict
    row = next(line for line in report.splitlines() if line.startswith("| devices with no task |"))
    assert f"| {b['idle_device_s']:,.0f} ({b['fractions']['idle']:.0%}) |" in row
    assert f"| {c['idle_device_s']:,.0f} ({c['fractions']['idle']:.0%}) |" in row
    # the simulator records the rollout's split on both sides: its rows are there
    key = "decode_memory_bound_device_s"
    row = next(line for line in report.splitlines() if line.startswith("| - held decoding, memory-bound"))
    assert f"| {b['rollout'][key]:,.0f} | {c['rollout'][key]:,.0f} |" in row
    text = format_ab(result)
    assert f"mem-bound decode dev-s{b['rollout'][key]:>14.0f}{c['rollout'][key]:>14.0f}" in text
    assert f"  idle                {b['idle_device_s']:>14.0f}{c['idle_device_s']:>14.0f}" in text


def test_report_and_summary_show_where_the_last_pipelines_time_went(bench_dir):
    from jigsaw_plugin.bench.ab import format_ab
    from jigsaw_plugin.core.result import last_chain

    result = json.loads((bench_dir / "result.json").read_text())
    name, chain = last_chain(result["candidate"])
    assert chain["finish_s"] == pytest.approx(result["candidate"]["makespan_s"])
    report = (bench_dir / "report.md").read_text()
    assert f": {name} s (floor) |" in report
    row = next(line for line in report.splitlines() if line.startswith("| training |"))
    assert f"| {chain['training_s']:,.0f} ({chain['training_floor_s']:,.0f}) |" in row
    text = format_ab(result)
    assert "last pipeline's chain s (floor):" in text
    assert f"{chain['generation_s']:.0f} ({chain['generation_floor_s']:.0f})" in text
    # a result saved before chain_split existed: no rows, no error
    old = {side: {k: v for k, v in result[side].items() if k != "chain_split"} for side in ("baseline", "candidate")}
    assert "last pipeline's chain" not in format_ab({**result, **old})


def test_report_and_summary_set_each_pipeline_against_its_own_ideal(bench_dir):
    from jigsaw_plugin.bench.ab import format_ab

    result = json.loads((bench_dir / "result.json").read_text())
    report = (bench_dir / "report.md").read_text()
    text = format_ab(result)
    for name, own in result["candidate"]["gap_breakdown"]["pipelines"].items():
        base = result["baseline"]["gap_breakdown"]["pipelines"][name]
        ratios = [f"{p[k + '_device_s'] / p['ideal_' + k + '_device_s']:.2f}x" for p in (base, own)
                  for k in ("rollout", "training")]
        assert f"| {name} | " + " | ".join(ratios) + " |" in report
        assert f"  {name[:20]:<20}{ratios[0] + ' / ' + ratios[1]:>14}{ratios[2] + ' / ' + ratios[3]:>14}" in text
    # a result saved before the split existed: no rows, no error
    old = {side: {**result[side], "gap_breakdown": {k: v for k, v in result[side]["gap_breakdown"].items()
                                                    if k != "pipelines"}} for side in ("baseline", "candidate")}
    assert "over each pipeline's ideal" not in format_ab({**result, **old})


def test_the_readme_lists_every_mechanism_ablate_accepts():
    # the README's `jigsaw bench ... [--ablate a|b|...]` line is where users find the switches
    import re

    from jigsaw_plugin.bench.ab import ABLATIONS, OFF_BY_DEFAULT
    from jigsaw_plugin.scheduler.jigsaw import JigsawConfig

    listed = re.search(r"\[--ablate ([a-z_|]+)\]", (ROOT / "README.md").read_text()).group(1).split("|")
    assert sorted(listed) == sorted(ABLATIONS + OFF_BY_DEFAULT)
    assert all(hasattr(JigsawConfig(), name) for name in listed)


def test_docs_simulator_has_a_row_for_every_switch_of_the_jigsaw_policy():
    # docs/simulator.md's table is where each mechanism is explained: a switch added to
    # JigsawConfig without a row there is undocumented
    import dataclasses

    from jigsaw_plugin.scheduler.jigsaw import JigsawConfig

    text = (ROOT / "docs" / "simulator.md").read_text()
    switches = [f.name for f in dataclasses.fields(JigsawConfig) if f.type in (bool, "bool")]
    assert len(switches) > 30
    assert [name for name in switches if f"\n| `{name}`" not in text] == []


def test_ablate_flips_each_mechanism_from_its_default():
    from jigsaw_plugin.bench.ab import ablation_options
    from jigsaw_plugin.errors import SpecError
    from jigsaw_plugin.scheduler.jigsaw import JigsawConfig

    opts = ablation_options("jigsaw", ["migration", "balance", "loans"])
    assert opts == {"migration": False, "balance": True, "loans": True}
    assert all(getattr(JigsawConfig(), k) != v for k, v in opts.items())
    for bad, name in ((["nope"], "jigsaw"), (["balance"], "verl-sync")):
        try:
            ablation_options(name, bad)
        except SpecError as e:
            assert e.field == "--ablate"
        else:
            raise AssertionError(f"{bad} with {name} must be refused")


def test_report_and_summary_show_preemptions_only_where_a_run_lost_a_device(bench_dir, tmp_path):
    # a simulated run on a pool with preemptible classes carries ``preemptions``; the report
    # and the printed A/B show what they cost each side, and nothing where none happened
    from jigsaw_plugin.bench.ab import format_ab

    assert "preemptions" not in format_ab(json.loads((bench_dir / "result.json").read_text()))
    assert "preemptions (devices lost)" not in (bench_dir / "report.md").read_text()

    def add_preemptions(result):
        for side, (n, moved, again) in (("baseline", (37, 120, 2)), ("candidate", (17, 45, 0))):
            result[side]["preemptions"] = {"recovery": "migrate", "preemptions": n, "resumed_requests": moved,
                                           "restarted_stages": again, "per_class": {"spot": n}}

    result, report = _rerendered(bench_dir, tmp_path / "preempted", add_preemptions)
    assert "| preemptions (devices lost) | 37 | 17 |" in report
    assert "| - requests resumed elsewhere with their tokens | 120 | 45 |" in report
    text = format_ab(result)
    assert f"{'preemptions':<22}{37:>14}{17:>14}" in text
    assert f"{'  requests resumed':<22}{120:>14}{45:>14}" in text
