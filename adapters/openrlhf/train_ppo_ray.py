"""``python -m jigsaw_plugin.adapters.openrlhf.train_ppo_ray <openrlhf args> --jigsaw.enable ...``

Takes its own ``--jigsaw.*`` flags out of the command line, checks OpenRLHF (0.11.2),
initialises Ray (as OpenRLHF's ``train()`` would, plus the vLLM-on-CPU settings when they
are set in this environment), installs the overrides (``install.py``), and runs OpenRLHF's
unmodified CLI module ``openrlhf.cli.train_ppo_ray`` as ``__main__`` with ``runpy``: every
OpenRLHF argument keeps its meaning and its validation. Without ``--jigsaw.enable`` it
runs OpenRLHF untouched. Misuse exits with code 2 and one line naming the problem.
"""

from __future__ import annotations

import os
import sys

from jigsaw_plugin.adapters.openrlhf.config import JigsawConfig, JigsawUsageError, parse_jigsaw_flags

__all__ = ["main", "prepare", "spec_error_in"]

CLI_MODULE = "openrlhf.cli.train_ppo_ray"
PROG = "python -m jigsaw_plugin.adapters.openrlhf.train_ppo_ray"
# Forwarded to Ray workers: OpenRLHF's own defaults (train_ppo_ray.py:24-31) and vLLM's CPU knobs.
_ENV_DEFAULTS = {"TOKENIZERS_PARALLELISM": "true", "NCCL_DEBUG": "WARN", "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1"}
_ENV_PASS = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_ALLOW_INSECURE_SERIALIZATION")


def init_ray() -> None:
    """``ray.init`` as OpenRLHF's ``train()`` does when Ray is not running (joins the cluster
    named by ``RAY_ADDRESS`` if set), so that the overrides can reach the coordinator."""
    import ray

    if ray.is_initialized():
        return
    env = {k: os.environ.get(k, v) for k, v in _ENV_DEFAULTS.items()}
    env.update({k: os.environ[k] for k in _ENV_PASS if k in os.environ})
    ray.init(runtime_env={"env_vars": env})


def prepare(argv: list[str]) -> tuple[JigsawConfig, list[str]]:
    """Parse, check OpenRLHF, start Ray and install the overrides; returns what to run."""
    config, rest = parse_jigsaw_flags(argv)
    from jigsaw_plugin.adapters.openrlhf.version import check_openrlhf

    check_openrlhf()
    if config.enable:
        init_ray()
        from jigsaw_plugin.adapters.openrlhf.install import install

        install(config)
    return config, rest


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        config, rest = prepare(argv)
    except JigsawUsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    import runpy

    old_argv = sys.argv
    sys.argv = [CLI_MODULE.replace(".", "/") + ".py", *rest]
    try:
        runpy.run_module(CLI_MODULE, run_name="__main__", alter_sys=False)
    except Exception as e:
        reason = spec_error_in(e)
        if reason is None:
            raise
        # e.g. a run a coordinator policy cannot plan, refused in the trainer actor (host.py)
        print(f"{PROG}: error: {reason}", file=sys.stderr)
        return 2
    finally:
        sys.argv = old_argv
    return 0


def spec_error_in(error: BaseException) -> str | None:
    """The message of a ``SpecError`` behind ``error`` (raised here, or in a Ray actor and
    carried back as its cause or, for an actor's constructor, only as text), else None."""
    from jigsaw_plugin.errors import SpecError

    seen, text = set(), str(error)
    while isinstance(error, BaseException) and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, SpecError):
            return str(error)
        error = getattr(error, "cause", None) or error.__cause__
    for line in reversed(text.splitlines()):  # Ray's ActorDiedError keeps its constructor's error as text
        if "SpecError: " in line:
            return line.split("SpecError: ", 1)[1].strip()
    return None


if __name__ == "__main__":
    sys.exit(main())
