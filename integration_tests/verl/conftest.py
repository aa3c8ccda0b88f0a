"""Fixtures of the verl 0.9.1 integration tests (``make integration-verl``, in ``.venv-verl``).

Where verl is not installed every test here skips with the reason. One Ray cluster and one
TransferQueue serve the whole folder (Ray takes 5-40 s to start on a loaded 2-core machine):
16 logical CPUs so that TransferQueue's controller and storage unit and verl's workers can
all be placed (VERL.md, "what blocks verl on CPU", 1), one storage unit, a 200 MB object
store. Tests that need engines or other drivers start them themselves.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
verl = pytest.importorskip("verl", reason="verl is not installed here (make venv-verl)")

# Ray workers import the CPU stand-ins by module name: let them find this folder.
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)

BASE_OVERRIDES = [
    "trainer.device=cpu",
    "trainer.n_gpus_per_node=2",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
    "trainer.logger=[console]",
    "data.train_batch_size=2",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "critic.ppo_mini_batch_size=2",
    "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
]


def compose_verl(*overrides: str, model_path: str = "/nonexistent"):
    """verl's own ``ppo_trainer`` config (its YAML files, through Hydra's compose API)."""
    from hydra import compose, initialize_config_dir

    cfgdir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=cfgdir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=[
            *BASE_OVERRIDES, f"actor_rollout_ref.model.path={model_path}", f"critic.model.path={model_path}",
            *overrides])


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    from jigsaw_plugin.runtime.tiny_model import build_tiny_qwen2

    return str(build_tiny_qwen2(tmp_path_factory.mktemp("tiny") / "qwen2"))


def start_ray(**extra):
    import ray

    kw = dict(num_cpus=16, include_dashboard=False, log_to_driver=False,
              object_store_memory=200 * 1024 * 1024, **extra)
    for attempt in range(3):  # "node timed out during startup" happens on a loaded machine
        try:
            return ray.init(**kw)
        except Exception:
            ray.shutdown()
            if attempt == 2:
                raise
            time.sleep(5)


@pytest.fixture(scope="session")
def ray_tq():
    """A local Ray cluster and verl's TransferQueue on it (controller + one storage unit)."""
    import ray
    import transfer_queue as tq

    if ray.is_initialized():
        ray.shutdown()
    ctx = start_ray()
    cfg = compose_verl()
    cfg.transfer_queue.enable = True
    tq.init(cfg.transfer_queue)
    yield ctx
    try:
        tq.close()
    finally:
        ray.shutdown()


def pytest_configure(config):
    # verl probes optional training engines at import and warns for each one missing here.
    config.addinivalue_line("filterwarnings", "ignore:.* engine is not available:UserWarning")
    config.addinivalue_line("filterwarnings", "ignore:Ray state API is no longer experimental:DeprecationWarning")
