"""benchmarks/decision_latency.py's block: its reading of the targets follows the figures,
the predictor timer sees every predictor call of a decide round, and a bad results file
is refused with its path named (no traceback)."""

import json
import sys
from pathlib import Path

import pytest

from jigsaw_plugin.hookspecs import hookimpl
from jigsaw_plugin.manager import get_plugin_manager, register
from jigsaw_plugin.scheduler import get_policy
from jigsaw_plugin.sim import Simulation
from sim_helpers import small_workload

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import decision_latency as dl  # noqa: E402


def _result(gpus, pipelines, decision_p99, policy_p99, mode="incremental"):
    return {"gpus": gpus, "pipelines": pipelines, "prompts": 1, "mode": mode, "requests_per_step": 8,
            "rounds": 10, "stopped_by_budget": False, "state_p50_us": 1.0, "state_p99_us": decision_p99 - policy_p99,
            "policy_p50_us": 1.0, "policy_p99_us": policy_p99, "decision_p50_us": 2.0,
            "decision_p99_us": decision_p99, "decision_wall_p99_us": decision_p99, "cpu_s": 1.0,
            "gc_total_ms": 0.0, "gc_max_ms": 0.0, "predictor_p99_us": 10.0, "predictor_calls": 3,
            "predictor_share": 0.25, "slow_state_us": 5.0, "slow_predictor_share": 0.5, "slow_predictor_calls": 2.0}


def test_targets_reading_follows_the_figures():
    text = dl.targets([_result(64, 8, 900.0, 400.0), _result(1024, 32, 12_000.0, 11_000.0),
                       _result(1024, 32, 1.0, 1.0, mode="from-scratch")])
    met, missed = text.splitlines()
    assert "64 GPUs / 8 pipelines" in met and "**met**" in met
    assert "1024 GPUs / 32 pipelines" in missed and "**not met**" in missed
    assert "over the target by itself" in missed and "25%" in missed and "50%" in missed
    block = dl.section([_result(64, 8, 900.0, 400.0)], "cmd", "1 1 1", "2 2 2")
    assert "10 / 25% / 5 us, 50%, 2.0 calls" in block and "`cmd`" in block


def test_predictor_timer_counts_each_predictor_call_of_a_run():
    calls = []

    class Count:
        @hookimpl(hookwrapper=True)
        def jigsaw_predict_remaining(self, pipeline, requests, history):
            calls.append(len(requests))
            yield

    wl = small_workload(gpus=8, pipelines=2, prompts=4, samples=4, steps=1, agentic=(False, False), median=200)
    pm = get_plugin_manager(load_entrypoints=False)
    timer = dl._PredictorTimer()
    register(pm, timer, "timer")
    register(pm, Count(), "count")
    Simulation(wl, get_policy("jigsaw"), seed=0, pm=pm).run()
    assert timer.calls == len(calls) > 0 and timer.us > 0


def test_render_refuses_a_file_that_is_not_its_results(tmp_path, capsys):
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({"rows": []}))
    with pytest.raises(SystemExit) as e:
        dl.main(["--render", "--results", str(bad)])
    assert str(bad) in str(e.value) and "not a results file" in str(e.value)


def test_repeats_table_gives_medians_per_case():
    before = [{"load_before": "9.0 1 1", "results": [_result(64, 8, 3000.0 + k, 500.0)]} for k in (0, 100, 900)]
    after = [{"load_before": "8.0 1 1", "results": [_result(64, 8, 2000.0 + k, 500.0),
                                                    _result(64, 8, 1.0, 1.0, mode="from-scratch")]}
             for k in (0, 50, 700)]
    text = dl.repeats_table(before, after)
    row = next(line for line in text.splitlines() if line.startswith("| 64 |"))
    assert "3 / 3" in row and "3100 -> 2050" in row  # medians of the incremental runs only
    assert "1024" not in text and "9.0, 9.0, 9.0, 8.0" in text


def test_repeats_table_gives_the_last_tenths_median():
    def run(p99, last):
        r = _result(1024, 32, p99, 500.0)
        r["spread"] = [{"decision_p99_us": 1.0}, {"decision_p99_us": last}]
        return {"load_before": "3.0 1 1", "results": [r]}

    text = dl.repeats_table([run(11_000.0, 12_000.0), run(11_200.0, 13_500.0)],
                            [run(9_000.0, 11_800.0), run(7_800.0, 9_300.0)])
    row = next(line for line in text.splitlines() if line.startswith("| 1024 |"))
    assert "11100 -> 8400" in row and "12750 -> 10550" in row and "last tenth" in text


def test_spread_splits_the_rounds_in_order_and_the_block_shows_them():
    sim_t = [float(i) for i in range(20)]
    state = [100.0] * 18 + [5000.0, 7000.0]  # the slow rounds come last (a run's tail)
    parts = dl.spread(sim_t, state, [10.0] * 20)
    assert [p["rounds"] for p in parts] == [2] * 10
    assert parts[0]["t0_s"] == 0.0 and parts[-1]["t1_s"] == 19.0
    assert parts[0]["decision_p99_us"] == 110.0 and parts[-1]["decision_p99_us"] > 6000.0
    r = _result(64, 8, 900.0, 400.0)
    r["spread"] = parts
    text = dl.spread_table([r])
    assert "| 64 | 8 | incremental | 10 / 10 | 2 | 18.0 - 19.0 |" in text
    assert dl.spread([], [], []) == [] and dl.spread_table([_result(64, 8, 900.0, 400.0)]) == ""


def test_a_round_limit_of_zero_runs_to_the_budget_and_bad_limits_are_refused():
    budget = dl._Budget(0, 1e9)
    for _ in range(5000):
        assert budget.jigsaw_schedule(state=None) is None  # no round limit
    two = dl._Budget(2, 1e9)
    two.jigsaw_schedule(state=None)
    two.jigsaw_schedule(state=None)
    with pytest.raises(dl._Stop):
        two.jigsaw_schedule(state=None)  # the third round is past the limit
    with pytest.raises(dl._Stop):
        dl._Budget(0, -1.0).jigsaw_schedule(state=None)  # no round limit, CPU budget spent
    with pytest.raises(SystemExit) as e:
        dl.main(["--rounds", "-1", "--cases", "64x8"])
    assert "--rounds -1" in str(e.value) and "0: the whole run" in str(e.value)
    with pytest.raises(SystemExit) as e:
        dl.main(["--render", "--also", "no-label"])
    assert "LABEL=PATH" in str(e.value)


def test_breakdown_times_each_function_of_the_slow_rounds():
    text = dl.breakdown_text({"gpus": 64, "pipelines": 8, "rounds": 200, "mean_us": {"f": 10.0, "g": 1.0},
                              "slowest": [{"decision_us": 900.0, "sim_t_s": 3.0, "us": {"f": 500.0, "g": 50.0},
                                           "calls": {"f": 2, "g": 1}},
                                          {"decision_us": 700.0, "sim_t_s": 4.0, "us": {"f": 300.0},
                                           "calls": {"f": 1}}]})
    lines = text.splitlines()
    assert "the slowest 2 (1%): decision 800 us" in lines[0] and "3.0-4.0 s" in lines[0]
    assert "| f | 400 | 1.5 | 10 |" in text and "| g | 25 | 0.5 | 1 |" in text


def test_policy_options_of_the_benchmark_are_checked_before_any_run():
    assert dl._policy_options(["reprice_on_change=true", "tail_requests=16"]) == {
        "reprice_on_change": True, "tail_requests": 16}
    with pytest.raises(SystemExit, match="reprice_on_change: got 'maybe'; allowed: true or false"):
        dl._policy_options(["reprice_on_change=maybe"])
    with pytest.raises(SystemExit, match="--policy-opt: got .reprice_on_change.; allowed: KEY=VALUE"):
        dl._policy_options(["reprice_on_change"])


def test_the_targets_table_calls_a_latency_target_met_only_where_every_saved_run_meets_it():
    """benchmarks/report.py's targets rows: the first 400 rounds and the block's longer run
    (whole run at 64 / 8, 16,000 rounds at 1024 / 32) must both be under the target; a
    case with no longer run saved is not called met."""
    import report

    first = {(64, 8): 900.0, (1024, 32): 4600.0}
    long = {(64, 8): ("whole run", 3200.0), (1024, 32): ("16,000 rounds", 6500.0)}
    rows = report._latency_rows(first, long).splitlines()
    assert rows[0].endswith("| first 400 rounds: 900 us; whole run: 3200 us | in the first 400 rounds only |")
    assert rows[1].endswith("| first 400 rounds: 4600 us; 16,000 rounds: 6500 us | yes |")
    rows = report._latency_rows({(64, 8): 5600.0, (1024, 32): 4600.0}, {}).splitlines()
    assert rows[0].endswith("| no |")
    assert rows[1].endswith("| in the first 400 rounds (no longer run saved) |")
    # repeats of the longer run: the table's run under the target is not enough while one
    # repeat is over it
    rows = report._latency_rows(first, long, {(1024, 32): [11000.0, 6500.0, 7000.0]}).splitlines()
    assert rows[1].endswith("| first 400 rounds: 4600 us; 16,000 rounds: 6500 us (3 runs: 6500, 7000, "
                            "11000 us) | in the first 400 rounds; over the longer run in 2 of 3 runs |")
    rows = report._latency_rows(first, long, {(1024, 32): [6400.0, 6500.0, 7000.0]}).splitlines()
    assert rows[1].endswith("| yes |")


def test_a_breakdown_of_a_large_mix_times_its_rounds_in_a_process_of_its_own():
    # --large-mix: the timers wrap the functions of the process that runs it (not this one)
    from concurrent.futures import ProcessPoolExecutor

    from random_mixes import large_mixes

    name, spec = large_mixes(9009, 1)[0]
    with ProcessPoolExecutor(max_workers=1, max_tasks_per_child=1) as ex:
        b = ex.submit(dl.measure_breakdown, (96, len(spec["pipelines"]), 0, 30, 20.0, spec)).result()
    assert name == "L9009" and b["rounds"] == 30 and b["pipelines"] == 7
    assert b["mean_us"]["Jigsaw.decide"] > 0 and b["slowest"][0]["calls"]["Jigsaw.decide"] == 1


def test_notes_file_parts_land_around_the_tables(tmp_path, monkeypatch):
    notes = tmp_path / "notes.md"
    notes.write_text("<!-- header -->\nABOVE\n<!-- tables -->\nUNDER\n<!-- extra tables -->\nLEFT\n")
    monkeypatch.setattr(dl, "NOTES", notes)
    block = dl.section([_result(64, 8, 900.0, 400.0)], "cmd", "1 1 1", "2 2 2", notes="\nEXTRA\n")
    assert "header" not in block
    assert block.index("ABOVE") < block.index("`cmd`") < block.index("| 64 |") < block.index("UNDER") \
        < block.index("EXTRA") < block.index("LEFT")


def test_notes_file_without_its_markers_is_refused_by_path(tmp_path):
    notes = tmp_path / "notes.md"
    notes.write_text("no markers here\n")
    with pytest.raises(SystemExit) as e:
        dl.history_notes(notes)
    assert str(notes) in str(e.value) and "<!-- tables -->" in str(e.value)


def test_a_measurement_saves_the_blocks_results_only_when_asked(tmp_path, monkeypatch, capsys):
    # the targets table of docs/benchmarks.md is rendered from the block's saved results: a
    # quick probe of other cases must not replace them (it once did, and the doc no longer
    # matched its render); --write and --results save, as before
    saved = tmp_path / "decision_latency.json"
    monkeypatch.setattr(dl, "RESULTS", saved)
    monkeypatch.setattr(dl, "ROOT", tmp_path)
    monkeypatch.setattr(dl, "_run_jobs", lambda jobs: [_result(64, 8, 900.0, 400.0)])
    monkeypatch.setattr(dl, "write_doc_block", lambda name, text: None)
    dl.main(["--cases", "64x8", "--rounds", "10", "--modes", "incremental"])
    assert not saved.exists() and "not saved" in capsys.readouterr().out
    other = tmp_path / "probe.json"
    dl.main(["--cases", "64x8", "--rounds", "10", "--modes", "incremental", "--results", str(other)])
    assert json.loads(other.read_text())["results"][0]["decision_p99_us"] == 900.0 and not saved.exists()
    dl.main(["--cases", "64x8", "--rounds", "10", "--modes", "incremental", "--write"])
    assert json.loads(saved.read_text())["results"][0]["gpus"] == 64
