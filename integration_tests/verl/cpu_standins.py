"""CPU stand-ins for the parts of a verl 0.9.1 step that cannot run on this machine.

Each is labelled with why it is a stand-in. Everything else in the tests is verl's own code:
the trainer's ``__init__``/``step``/``_step_once`` and stage methods, the ``ReplayBuffer``,
TransferQueue (real storage actors), ``RayResourcePool`` / ``RayWorkerGroup`` /
``create_colocated_worker_cls`` / ``spawn`` with verl's dispatch (``register``,
``make_nd_compute_dataproto_dispatch_fn``, ``tqbridge``) into real Ray worker processes.

Shapes follow verl's engine workers (``verl/workers/engine_workers.py``): ``compute_log_prob``
/ ``compute_ref_log_prob`` / ``infer_batch`` return one value per token of
``input_ids`` (nested, jagged), ``update_actor`` / ``train_mini_batch`` return metrics
(with ``mfu``). The numbers come from the tiny random Qwen2 (``build_tiny_qwen2``) where a
forward pass is cheap, so the stages do real (small) work.
"""

from __future__ import annotations

import types

import numpy as np
import torch
from tensordict import TensorDict
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from verl.utils import tensordict_utils as tu

__all__ = ["ActorStandIn", "CriticStandIn", "RewardStandIn", "CheckpointStandIn", "AgentLoopStandIn",
           "make_prompts"]


def _nested(rows):
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def _rows(nested):
    return list(nested.unbind())


class _TinyModel:
    """Per-token log-probs of the tiny Qwen2 (CPU, float32)."""

    def __init__(self, path):
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(1)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-4)

    def log_probs(self, ids: torch.Tensor, grad: bool = False) -> torch.Tensor:
        with torch.set_grad_enabled(grad):
            logits = self.model(ids.unsqueeze(0)).logits[0].float()
            lp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[1:, None])[:, 0]
            return torch.cat([lp, lp.new_zeros(1)])  # one per position, as verl's left-shift expects


class ActorStandIn(Worker):
    """CPU stand-in for ``ActorRolloutRefWorker``: verl's FSDP engine needs NCCL/CUDA
    (``verl/utils/distributed.py:89`` on CPU: "Distributed package doesn't have NCCL built in")."""

    def __init__(self, model_path: str):
        super().__init__()
        self.model_path = model_path
        for mesh in ("actor", "ref"):
            self._register_dispatch_collect_info(mesh, dp_rank=self.rank, is_collect=True)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        self.tiny = _TinyModel(self.model_path)
        return True

    def _per_token(self, data: TensorDict) -> TensorDict:
        rows = [self.tiny.log_probs(ids) for ids in _rows(data["input_ids"])]
        ent = [torch.zeros_like(r) for r in rows]
        return TensorDict({"log_probs": _nested(rows), "entropy": _nested(ent)}, batch_size=[len(rows)])

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def compute_log_prob(self, data: TensorDict) -> TensorDict:
        return self._per_token(data)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="ref"))
    def compute_ref_log_prob(self, data: TensorDict) -> TensorDict:
        out = self._per_token(data)
        return TensorDict({"log_probs": out["log_probs"]}, batch_size=out.batch_size)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def update_actor(self, data: TensorDict) -> TensorDict:
        # One policy-gradient step on this rank's shard (REINFORCE with verl's advantages).
        self.tiny.opt.zero_grad()
        loss = 0.0
        for ids, adv in zip(_rows(data["input_ids"]), _rows(data["advantages"]), strict=True):
            lp = self.tiny.log_probs(ids, grad=True)[-len(adv) - 1:-1]
            loss = loss - (lp * adv.float()).mean()
        loss.backward()
        self.tiny.opt.step()
        metrics = {"pg_loss": float(loss.detach()), "mfu": 0.0, "rank_samples": len(data)}
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": metrics})


class CriticStandIn(Worker):
    """CPU stand-in for the critic ``TrainingWorker`` (same NCCL/CUDA engine as the actor)."""

    def __init__(self):
        super().__init__()
        self._register_dispatch_collect_info("train", dp_rank=self.rank, is_collect=True)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def reset(self):
        return True

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_loss_fn(self, loss_fn):
        return True

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"), blocking=False)
    def infer_batch(self, data: TensorDict) -> TensorDict:
        rows = [torch.full((len(ids),), 0.5) for ids in _rows(data["input_ids"])]
        return TensorDict({"values": _nested(rows)}, batch_size=[len(rows)])

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"), blocking=False)
    def train_mini_batch(self, data: TensorDict) -> TensorDict:
        metrics = {"vf_loss": 0.0, "mfu": 0.0}
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": metrics})


class RewardStandIn:
    """CPU stand-in for verl's ``RewardLoopManager`` with a colocated reward model (a reward
    *model* server is a vLLM/SGLang replica: not startable on CPU). Rule: the fraction of even
    token ids in the response, on its last token."""

    reward_loop_worker_handles = None  # -> verl runs its colocated `reward` stage

    def __init__(self):
        self.calls = []

    def compute_rm_score(self, data):
        from verl.protocol import DataProto

        responses = data.batch["responses"]
        mask = data.batch["attention_mask"][:, -responses.size(1):]
        scores = torch.zeros_like(responses, dtype=torch.float32)
        for i in range(len(responses)):
            n = int(mask[i].sum())
            if n:
                scores[i, n - 1] = float((responses[i, :n] % 2 == 0).float().mean())
        self.calls.append(len(responses))
        return DataProto.from_dict(tensors={"rm_scores": scores})


class CheckpointStandIn:
    """CPU stand-in for ``CheckpointEngineManager``: its replicas are vLLM servers started by
    ``RolloutReplica`` on GPU workers (``workers/rollout/replica.py``)."""

    def __init__(self):
        self.calls = []

    def update_weights(self, global_steps):
        self.calls.append(("update_weights", global_steps))

    def sleep_replicas(self):
        self.calls.append(("sleep_replicas",))

    def abort_replicas(self):
        self.calls.append(("abort_replicas",))

    def resume_generation_replicas(self):
        self.calls.append(("resume_generation_replicas",))


class AgentLoopStandIn:
    """CPU stand-in for ``AgentLoopManagerTQ`` (its workers call vLLM servers that verl starts
    only on GPU replicas). It writes what ``AgentLoopWorkerTQ._run_prompt`` /
    ``_agent_loop_postprocess`` write (``trainer/ppo/v1/agent_loop_tq.py:107-226``): status
    tags, and per trajectory the fields of verl's own ``AgentLoopOutput.as_dict()`` plus
    ``input_ids`` / ``position_ids`` / ``loss_mask`` and the length tags. Response lengths are
    drawn per trajectory (seeded), so sizes differ per sample."""

    def __init__(self, n: int, response_lens=(3, 9), seed: int = 0):
        self.n = n
        self.rng = np.random.default_rng(seed)
        self.response_lens = response_lens
        self.generated: list[tuple[str, int, int]] = []  # (key, prompt_len, response_len)

    def generate_sequences(self, batch):
        import transfer_queue as tq
        from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        global_steps = batch["global_steps"] if "global_steps" in batch.keys() else 1
        global_steps = int(getattr(global_steps, "data", global_steps))
        raws = list(batch["raw_prompt"])
        for uid, prompt, raw in zip(list(batch["uid"]), list(batch["prompt_ids"]), raws, strict=True):
            prompt = [int(x) for x in prompt]
            tq.kv_put(key=uid, partition_id="train", tag={"status": "running"})
            keys, fields, tags = [], [], []
            for session in range(self.n):
                n_resp = int(self.rng.integers(*self.response_lens))
                response = [int(x) for x in self.rng.integers(2, 2000, n_resp)]
                out = AgentLoopOutput(prompt_ids=prompt, response_ids=response, response_mask=[1] * n_resp,
                                      response_logprobs=[float(x) for x in -self.rng.random(n_resp)],
                                      metrics=AgentLoopMetrics(), extra_fields={}, num_turns=2)
                field = out.as_dict()
                input_ids = torch.tensor(prompt + response, dtype=torch.int64)
                field.update(uid=uid, session_id=session, raw_prompt=raw, global_steps=global_steps,
                             input_ids=input_ids, position_ids=torch.arange(len(input_ids)),
                             loss_mask=field["response_mask"])
                field["extra_fields"] = {}
                keys.append(f"{uid}_{session}_0")
                fields.append(field)
                tags.append({"status": "success", "prompt_len": len(prompt), "response_len": n_resp,
                             "seq_len": len(prompt) + n_resp, "global_steps": global_steps,
                             "min_global_steps": global_steps, "max_global_steps": global_steps})
                self.generated.append((keys[-1], len(prompt), n_resp))
            tq.kv_batch_put(keys=keys, fields=list_of_dict_to_tensordict(fields), tags=tags, partition_id="train")
            tq.kv_put(key=uid, partition_id="train", tag={"status": "finished"})


def make_prompts(n_batches: int, batch_size: int, seed: int = 0) -> list[dict]:
    """Dataloader batches in the shape of verl's ``collate_fn`` output (what ``_fetch_one_gen_batch`` reads)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_batches):
        prompts = np.empty(batch_size, dtype=object)
        raw = np.empty(batch_size, dtype=object)
        for i in range(batch_size):
            prompts[i] = [int(x) for x in rng.integers(2, 2000, int(rng.integers(4, 8)))]
            raw[i] = [{"role": "user", "content": f"prompt {i}"}]
        out.append({"raw_prompt": raw, "prompt_ids": prompts})
    return out


def prepare_trainer(trainer, model_path: str, n_workers: int = 2, steps: int = 2, n: int = 2, batch: int = 2):
    """Give a constructed v1 trainer what ``PPOTrainer._setup`` would (``trainer_base.py:226-394``),
    on CPU: a colocated ``RayWorkerGroup`` of actor + critic stand-ins on a ``RayResourcePool``
    without GPUs, and the stand-ins above. Returns the agent loop stand-in to pass to ``fit``."""
    import ray
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from verl.single_controller.ray import create_colocated_worker_cls
    from verl.single_controller.ray.base import ResourcePoolManager

    pool = RayResourcePool(process_on_nodes=[n_workers], use_gpu=False, max_colocate_count=1)
    class_dict = {"actor_rollout": RayClassWithInitArgs(cls=ray.remote(ActorStandIn), model_path=model_path),
                  "critic": RayClassWithInitArgs(cls=ray.remote(CriticStandIn))}
    wg = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=create_colocated_worker_cls(class_dict=class_dict),
                        device_name="cpu")
    groups = wg.spawn(prefix_set=class_dict.keys())
    trainer.actor_rollout_wg = trainer.ref_policy_wg = groups["actor_rollout"]
    trainer.critic_wg = groups["critic"]
    trainer.ref_in_actor = False
    trainer.actor_rollout_wg.init_model()
    trainer.critic_wg.reset()
    trainer.resource_pool_manager = ResourcePoolManager(resource_pool_spec={"global_pool": [n_workers]}, mapping={})
    trainer.tokenizer = types.SimpleNamespace(pad_token_id=0, eos_token_id=1)
    trainer.reward_loop_manager = RewardStandIn()
    trainer.checkpoint_manager = CheckpointStandIn()
    trainer.train_dataloader, trainer.train_dataloader_it = make_prompts(steps * 2, batch), None
    trainer.global_steps, trainer.total_training_steps, trainer.steps_per_epoch = 0, steps, steps
    trainer._init_dump_executor()
    return AgentLoopStandIn(n=n)
