"""KV-overflow preemptions as a run reports them: the simulated engine counts each sequence
it preempts because its cache overflowed and the tokens it must prefill again (vLLM's
recompute), the result sums them per pipeline, and `jigsaw bench`'s report shows them
("-" where an executor does not observe them)."""

from jigsaw_plugin.bench.report import _summary_rows
from jigsaw_plugin.costmodel import CostModel, hardware_profile, model_profile
from jigsaw_plugin.scheduler import get_policy
from jigsaw_plugin.sim import Simulation
from jigsaw_plugin.sim.replica import Replica, Request
from sim_helpers import small_workload

COST = CostModel(hardware_profile("h100"))
MODEL = model_profile("qwen2.5-7b")


def test_the_engine_counts_what_its_cache_overflow_preempts():
    # 4 sequences of 100-token prompts in a 420-token cache: 20 steps on they hold 480
    # tokens, and the newest (120 tokens: its prompt and 20 generated) is preempted, to be
    # prefilled again; 20 steps later the other 3 hold 420: within the cache
    rep = Replica(0, "p0", (0,), MODEL, COST)
    rep.cap = 420
    for i in range(4):
        rep.enqueue(Request("p0", 0, i, 0, 100, 500, 0), 0.0)
    rep.admit(0.0)
    assert rep.n == 4 and (rep.kv_preemptions, rep.kv_recompute_tokens) == (0, 0)
    rep.p = 20.0
    assert rep.preempt_overflow() == 1
    assert (rep.kv_preemptions, rep.kv_recompute_tokens) == (1, 120)
    rep.p = 40.0
    assert rep.preempt_overflow() == 0 and rep.kv_preemptions == 1


# long responses on CPU "devices" (4 GB each): verl-sync's engines overflow their caches
# (3 sequences preempted and recomputed, seed 0)
TIGHT = small_workload(gpus=4, pipelines=1, prompts=16, samples=8, steps=1, agentic=(False,),
                       models=("qwen2.5-0.5b",), max_len=8192, median=6000, gpu="cpu")


def _run(wl, policy="verl-sync"):
    return Simulation(wl, get_policy(policy), 0).run()


def test_a_run_reports_its_pipelines_overflows_and_none_where_the_caches_hold():
    r = _run(TIGHT)
    got = [(p["kv_preemptions"], p["kv_recompute_tokens"]) for p in r["pipelines"].values()]
    assert any(n > 0 for n, _ in got)
    # each preempted sequence prefills at least its prompt (16 tokens at the least) again
    assert all(tokens >= 16 * n for n, tokens in got)
    roomy = small_workload(gpus=8, pipelines=2, prompts=4, samples=2, steps=1)
    assert all(p["kv_preemptions"] == 0 and p["kv_recompute_tokens"] == 0 for p in _run(roomy)["pipelines"].values())


def test_the_report_shows_them_and_a_dash_where_not_observed():
    r = _run(TIGHT)
    unobserved = {**r, "pipelines": {k: {**p, "kv_preemptions": None, "kv_recompute_tokens": None}
                                     for k, p in r["pipelines"].items()}}
    rows = {label: (b, c) for label, b, c in _summary_rows(unobserved, r)}
    total = sum(p["kv_preemptions"] for p in r["pipelines"].values())
    assert rows["KV-overflow preemptions (sequences recomputed)"] == (None, total)
    assert rows["tokens prefilled again after them"][1] == sum(p["kv_recompute_tokens"] for p in r["pipelines"].values())


def test_the_cli_table_counts_them_and_shows_a_dash_where_not_observed():
    from jigsaw_plugin.cli import _table

    r = _run(TIGHT)
    total = sum(p["kv_preemptions"] for p in r["pipelines"].values())
    head, _, row = _table([r]).splitlines()
    assert head.split()[-1] == "kv_pre" and row.split()[-1] == str(total) and total > 0
    unobserved = {**r, "pipelines": {k: {**p, "kv_preemptions": None} for k, p in r["pipelines"].items()}}
    assert _table([unobserved]).splitlines()[2].split()[-1] == "-"
