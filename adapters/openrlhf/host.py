"""What an OpenRLHF run declares to a coordinator that runs a policy (``HostPipeline``).

Pure: no OpenRLHF, Ray or torch import (unit-tested in the core test environment). The
trainer hands over its parsed arguments and the numbers it knows (engines, training
devices, steps); this module says what OpenRLHF can carry out of a policy's decisions
(``runtime.capabilities``):

- **stage grants: ``phase``.** One grant for the rollout (gen, and the reward computed
  inside it), one for all of a step's training stages: OpenRLHF's ``train_step`` runs
  make_experience, the fits and the weight sync back to back (the trainer cannot stop
  between them to wait for a grant without a rewrite of its loop);
- **rollout replicas: the pre-provisioned engine pool, not elastic.** ``--vllm.num_engines``
  engines exist for the whole run (the engine list and the weight-sync group are fixed at
  start); a step's rollout switches on as many as it is granted devices, and cannot take
  one more once it runs;
- **replica release and migration of chosen requests: yes, under ``--jigsaw.policy jigsaw``
  with two or more engines.** The run's engines are its servers (ids ``"0"``, ``"1"``, ...:
  an engine's index in OpenRLHF's list, the ``replica`` of its request events); the adapter
  forwards its request events (submitted, progress, aborted, migrated, finished), from which
  the coordinator keeps one row per request, and the rollout controller takes the commands
  the policy chose (``HostMigration``) and carries them out with its abort + resume path
  (``policy_moves.py``); an engine the policy empties is switched off and its device given
  back before the rollout ends. Its own tail rule is not applied under a policy;
- **training width: fixed** at the actor's devices (``--actor.num_nodes`` x
  ``--actor.num_gpus_per_node``): DeepSpeed's gang is placed when the actor group is built.

A run the policy cannot plan (asynchronous mode, engines wider than one device, an eval
dataset, an unknown model) is refused here with a ``SpecError`` naming the argument, before
anything starts.
"""

from __future__ import annotations

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.runtime.capabilities import HostCapabilities
from jigsaw_plugin.runtime.host_executor import HostPipeline

__all__ = ["ALGORITHM_OF_ESTIMATOR", "model_profile_of", "moves_requests", "engine_servers", "openrlhf_host_pipeline"]

#: OpenRLHF's ``--algo.advantage.estimator`` -> the algorithm whose stages the policy plans.
ALGORITHM_OF_ESTIMATOR = {
    "gae": "ppo", "group_norm": "grpo", "dr_grpo": "grpo",
    "reinforce": "reinforce", "rloo": "reinforce", "reinforce_baseline": "reinforce", "flash_reinforce": "reinforce",
}

_FIFO_HINT = "or run the coordinator with policy='fifo-lease' (plain leases, no plan)"


def model_profile_of(model_path) -> str:
    """The cost-model profile whose name the model path's last part starts with
    (``Qwen2.5-0.5B-Instruct`` -> ``qwen2.5-0.5b``); the policy prices stages with it."""
    from jigsaw_plugin.workload.spec import KNOWN_MODELS

    base = str(model_path or "").rstrip("/").rsplit("/", 1)[-1].lower()
    matches = [m for m in KNOWN_MODELS if base.startswith(m)]
    if not matches:
        raise SpecError("--actor.model_name_or_path", str(model_path),
                        f"a model whose folder name starts with a known profile ({', '.join(KNOWN_MODELS)}): "
                        f"the coordinator's policy prices its stages with it; {_FIFO_HINT}")
    return max(matches, key=len)


def moves_requests(adapter_policy: str, n_engines: int) -> bool:
    """Whether the rollout controller moves requests between engines: its policy ``jigsaw``
    (``least-in-flight`` only routes) and a second engine to move them to. Under a
    coordinator policy these are the moves the policy chooses (``migration``)."""
    return adapter_policy == "jigsaw" and int(n_engines) >= 2


def engine_servers(n_engines: int) -> tuple:
    """The server ids of the run's engines: each engine's index in OpenRLHF's list."""
    return tuple(str(i) for i in range(int(n_engines)))


def openrlhf_host_pipeline(name: str, args, *, n_engines: int, n_train: int, active_engines: int | None,
                           steps: int, request_migration: bool) -> HostPipeline:
    """The ``HostPipeline`` of one OpenRLHF run (``args``: OpenRLHF's parsed namespace).

    :param n_engines: engines of the pre-provisioned pool (``--vllm.num_engines``).
    :param n_train: devices of the actor's training gang.
    :param active_engines: ``--jigsaw.active_engines`` (None: every engine): the run's static
        share of the pool is ``max(active engines, n_train)``.
    :param steps: training steps the run will take (batches per episode x episodes).
    :param request_migration: the rollout controller moves requests and releases emptied
        engines (``moves_requests``): under a policy, the moves the policy chooses.
    """
    if args.train.async_enable:
        raise SpecError("--train.async_enable", True,
                        f"off under a coordinator policy (the policy plans synchronous steps; the async generator "
                        f"overlaps the next rollout with training on its own), {_FIFO_HINT}")
    tp = int(getattr(args.vllm, "tensor_parallel_size", 1) or 1)
    if tp != 1:
        raise SpecError("--vllm.tensor_parallel_size", tp,
                        f"1 under a coordinator policy (one engine per granted device), {_FIFO_HINT}")
    if getattr(args.eval, "dataset", None):
        raise SpecError("--eval.dataset", args.eval.dataset,
                        f"none under a coordinator policy (evaluation rollouts are no stage the policy plans), "
                        f"{_FIFO_HINT}")
    estimator = args.algo.advantage.estimator
    if estimator not in ALGORITHM_OF_ESTIMATOR:
        raise SpecError("--algo.advantage.estimator", estimator, " | ".join(ALGORITHM_OF_ESTIMATOR))
    if n_engines < 1:
        raise SpecError("--vllm.num_engines", n_engines, "an integer >= 1 (the rollout needs engines)")
    if steps < 1:
        raise SpecError(f"{name}: steps", steps, "an integer >= 1 (the prompt dataset yields no batch)")
    active = min(n_engines, int(active_engines or n_engines))
    max_new = int(args.rollout.max_new_tokens)
    # the prompt budget: what data.max_len leaves beside the response (OpenRLHF truncates to it)
    prompt_len = max(1, int(args.data.max_len) - max_new)
    moves = bool(request_migration) and n_engines >= 2
    caps = HostCapabilities("openrlhf", stage_grants="phase", rollout_replicas=n_engines, replicas_elastic=False,
                            migration=moves, replica_release=moves, training_resizable=False,
                            training_width=int(n_train))
    return HostPipeline(name, model_profile_of(args.actor.model_name_or_path), ALGORITHM_OF_ESTIMATOR[estimator],
                        int(args.rollout.batch_size), int(args.rollout.n_samples_per_prompt), max_new, prompt_len,
                        int(steps), max(active, int(n_train)), caps,
                        servers=engine_servers(n_engines) if moves else (),
                        # --ds.adam_offload: DeepSpeed keeps Adam's state on the host, steps it there
                        train_offload="optimizer" if getattr(getattr(args, "ds", None), "adam_offload", False)
                        else "none")
