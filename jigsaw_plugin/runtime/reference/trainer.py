"""``ReferenceTrainer``: the tiny Qwen2 policy trained with GRPO on CPU, and its Ray actor.

A *batch* is a list of samples ``(prompt_token_ids, response_token_ids, prompt_index)``
with an optional fourth element, the response mask (one 0/1 per response token: 1 for a
token the policy generated, 0 for a tool observation spliced in by a multi-turn rollout;
all 1 when absent). ``prompt_index`` names the sample's GRPO group.

The trainer holds

- the policy: ``transformers.Qwen2ForCausalLM`` loaded from the tiny model folder
  (runtime/tiny_model.py), float32 on CPU, ``torch.manual_seed(seed)`` first;
- a frozen reference copy of the initial weights (GRPO's KL anchor; ``with_ref=False``
  for DAPO, which has no reference pass);
- AdamW, gradient clipping at norm 1.0. Defaults: lr 1e-2 and 4 mini-batches (4 optimizer
  steps per ``update_actor``, as verl's ``ppo_mini_batch_size`` = batch / 4), so that the
  clipped ratio actually engages. Measured (docs/reference_pipeline.md): with lr 1e-3 x 1
  mini-batch, 3e-3 x 4 or 1e-2 x 1, five steps of 32 samples did not move the reward of
  this tiny random model beyond noise; lr 1e-2 x 4 mini-batches did, for every seed tried. (The price: the policy drifts fast, about 1 nat/token of KL to the
  reference after five steps.)

Stages (verl's names): ``old_log_prob`` (no grad, the weights that generated the batch),
``ref_log_prob`` (no grad, the frozen reference), ``update_actor`` (the clipped GRPO loss
of grpo.py over ``mini_batches`` optimizer steps, each accumulated over micro-batches),
and ``state_dict_bf16`` (what a weight sync pushes into the rollout engines).

Every stage is a sequence of micro-batches (microbatch.py: ``forward_plan`` /
``update_plan``, ``micro_batch_size`` samples each, default 4). The whole-stage methods
run them one after another; the stage runner can instead drive them one by one on the
devices a scheduler grants (``micro_log_probs``, ``micro_grad``, ``optimizer_step``,
``finish_update``), several at once from several threads. A micro-batch's gradient is
computed with ``torch.autograd.grad`` (nothing written to ``.grad``, so concurrent
micro-batches do not race), kept by index, and ``optimizer_step`` sums them in index
order: the update is the same, bit for bit, whatever ran where and in which order.

torch and transformers are imported inside functions, Ray inside ``make_trainer_actor``:
importing this module needs none of them.
"""

from __future__ import annotations

import copy
import time

import numpy as np

from jigsaw_plugin.runtime.reference.grpo import CLIP_EPS, policy_loss
from jigsaw_plugin.runtime.reference.microbatch import (
    DEFAULT_MICRO_BATCH_SIZE,
    MicroBatchPlan,
    check_micro_batch_size,
    forward_plan,
    response_mask,
    trained_tokens,
    update_plan,
)

__all__ = ["ReferenceTrainer", "collate", "make_trainer_actor", "pad_and_stack", "DEFAULT_LR",
           "DEFAULT_MINI_BATCHES", "UPDATE_STATS"]

DEFAULT_LR = 1e-2
DEFAULT_MINI_BATCHES = 4
UPDATE_STATS = ("loss", "pg_loss", "clip_frac", "approx_kl", "kl")  # per micro-batch, summed into the update's


def pad_and_stack(parts):
    """[b_i, R_i] per-token log-probs of consecutive micro-batches -> [sum b_i, max R_i],
    right-padded with 0 (padding carries no log-prob)."""
    import torch

    R = max(x.shape[1] for x in parts)
    return torch.cat([torch.nn.functional.pad(x, (0, R - x.shape[1])) for x in parts], 0)


def collate(batch, pad_token_id: int = 0) -> dict:
    """Right-padded tensors of a batch.

    Returns ``input_ids`` / ``attention_mask`` [B, L] (prompt + response, right-padded),
    ``response_mask`` [B, R] (float; 1 on the response tokens the policy generated, R the
    longest response), ``gather_index`` [B, R] (position in the L-1 next-token
    log-probabilities of each response token) and ``prompt_index`` [B].
    """
    import torch

    if not batch:
        raise ValueError("empty batch")
    seqs, plens, rlens, masks = [], [], [], []
    for item in batch:
        prompt, response = list(item[0]), list(item[1])
        if not prompt:
            raise ValueError("a sample needs at least one prompt token")
        seqs.append(prompt + response)
        plens.append(len(prompt))
        rlens.append(len(response))
        masks.append(response_mask(item))
    B, L, R = len(batch), max(map(len, seqs)), max(1, max(rlens))
    input_ids = torch.full((B, L), int(pad_token_id), dtype=torch.long)
    attention_mask = torch.zeros((B, L), dtype=torch.long)
    trained = torch.zeros((B, R), dtype=torch.float32)
    gather_index = torch.zeros((B, R), dtype=torch.long)
    for b, (seq, p, r, m) in enumerate(zip(seqs, plens, rlens, masks)):
        input_ids[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention_mask[b, : len(seq)] = 1
        if r:
            trained[b, :r] = torch.tensor(m, dtype=torch.float32)
            # token at position p + k is predicted by the logits at position p + k - 1
            gather_index[b, :r] = torch.arange(p - 1, p - 1 + r)
    prompt_index = torch.tensor([int(item[2]) for item in batch], dtype=torch.long)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "response_mask": trained,
            "gather_index": gather_index, "prompt_index": prompt_index}


def _token_log_probs(model, t: dict):
    """[B, R] log-probability of each response token under ``model`` (grad if enabled)."""
    import torch
    import torch.nn.functional as F

    logits = model(input_ids=t["input_ids"], attention_mask=t["attention_mask"], use_cache=False).logits
    logits = logits[:, :-1].float()
    targets = t["input_ids"][:, 1:]
    B, Lm1, V = logits.shape
    lp = -F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), reduction="none").view(B, Lm1)
    return torch.gather(lp, 1, t["gather_index"]) * (t["response_mask"] > 0)


class ReferenceTrainer:
    """The training side of the reference GRPO pipeline (see the module docstring)."""

    def __init__(self, model_path, lr: float = DEFAULT_LR, seed: int = 0, clip_eps: float = CLIP_EPS,
                 kl_coef: float = 0.001, with_ref: bool = True, mini_batches: int = DEFAULT_MINI_BATCHES,
                 micro_batch_size: int | None = DEFAULT_MICRO_BATCH_SIZE, max_grad_norm: float = 1.0, weight_decay: float = 0.0,
                 num_threads: int | None = 1, pad_token_id: int = 0):
        import torch
        from transformers import Qwen2ForCausalLM

        if num_threads:
            torch.set_num_threads(int(num_threads))
        torch.manual_seed(int(seed))
        self.model_path = str(model_path)
        self.seed = int(seed)
        self.clip_eps, self.kl_coef = float(clip_eps), float(kl_coef)
        self.mini_batches = max(1, int(mini_batches))
        self.micro_batch_size = check_micro_batch_size(micro_batch_size)  # None: no split
        self.max_grad_norm = max_grad_norm
        self.pad_token_id = int(pad_token_id)
        self.model = Qwen2ForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
        self.model.train()
        self.ref = None
        if with_ref:
            self.ref = copy.deepcopy(self.model).eval()
            for prm in self.ref.parameters():
                prm.requires_grad_(False)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=float(lr), weight_decay=weight_decay)
        self.version = 0  # optimizer updates applied (one update_actor call = one version)
        self.history: list[dict] = []
        self._grads: dict[int, tuple] = {}  # micro-batch index -> its gradient, until optimizer_step

    def use_devices(self, devices) -> list[int]:
        """Run the next stages on these devices: on CPU, pin every thread to their cores
        and use one torch thread per device (cpu_affinity.py). Returns the cores."""
        import torch

        from jigsaw_plugin.runtime.cpu_affinity import pin_this_process

        torch.set_num_threads(max(1, len(devices)))
        return pin_this_process(devices)

    # ---- plans ------------------------------------------------------------------------------
    def forward_plan(self, n_samples: int) -> MicroBatchPlan:
        """The micro-batches of a forward stage (``old_log_prob``, ``ref``) of ``n_samples``."""
        return forward_plan(n_samples, self.micro_batch_size)

    def update_plan(self, n_samples: int) -> MicroBatchPlan:
        """The micro-batches of the next ``update_actor`` (shuffled with (seed, version))."""
        return update_plan(n_samples, self.micro_batch_size, self.mini_batches, self.seed, self.version)

    # ---- forward stages -------------------------------------------------------------------
    def micro_log_probs(self, samples, reference: bool = False, one_thread: bool = True):
        """[b, R] per-token log-probs of one micro-batch (no grad) under the policy, or the
        frozen reference. ``one_thread``: compute with one torch thread (the micro-batch
        path: a result that cannot depend on the width the stage was granted)."""
        import torch

        model = self.model
        if reference:
            if self.ref is None:
                raise RuntimeError("this trainer was made with with_ref=False (no reference model)")
            model = self.ref
        if one_thread and torch.get_num_threads() != 1:
            torch.set_num_threads(1)
        with torch.no_grad():
            return _token_log_probs(model, collate(list(samples), self.pad_token_id))

    def _log_probs(self, batch, reference: bool):
        plan = self.forward_plan(len(batch))
        return pad_and_stack([self.micro_log_probs([batch[i] for i in m.samples], reference, one_thread=False)
                              for m in plan.micro_batches])

    def old_log_prob(self, batch):
        """Per-token log-probs [B, R] of the responses under the current policy (no grad);
        padding and masked tokens are 0."""
        return self._log_probs(batch, reference=False)

    def ref_log_prob(self, batch):
        """Per-token log-probs [B, R] under the frozen reference (the initial weights)."""
        if self.ref is None:
            raise RuntimeError("this trainer was made with with_ref=False (no reference model)")
        return self._log_probs(batch, reference=True)

    # ---- update, one micro-batch at a time ----------------------------------------------
    def micro_grad(self, index: int, samples, old_log_probs, advantages, ref_log_probs=None,
                   normalizer: int = 1, one_thread: bool = True) -> dict:
        """The gradient of one micro-batch's share of its mini-batch loss, kept under
        ``index`` until ``optimizer_step``; returns its statistics (floats, already divided
        by ``normalizer``, the mini-batch's trained tokens) and its compute time ``time_s``.

        ``old_log_probs`` / ``ref_log_probs``: [b, >=R] rows of these samples; ``advantages``
        [b]. Thread-safe: ``torch.autograd.grad`` writes no ``.grad``; several micro-batches
        may run at once from several threads."""
        import torch

        t0 = time.perf_counter()
        if one_thread and torch.get_num_threads() != 1:
            torch.set_num_threads(1)
        t = collate(list(samples), self.pad_token_id)
        R = t["response_mask"].shape[1]
        old = torch.as_tensor(old_log_probs, dtype=torch.float32)[:, :R]
        ref = None if ref_log_probs is None else torch.as_tensor(ref_log_probs, dtype=torch.float32)[:, :R]
        adv = torch.as_tensor(np.asarray(advantages, dtype=np.float32))
        if old.shape[0] != len(samples) or adv.shape[0] != len(samples):
            raise ValueError(f"micro-batch {index}: {len(samples)} samples, old_log_probs {tuple(old.shape)}, "
                             f"advantages {tuple(adv.shape)}")
        lp = _token_log_probs(self.model, t)
        loss, st = policy_loss(lp, old, adv, t["response_mask"], self.clip_eps, ref, self.kl_coef,
                               normalizer=max(1, int(normalizer)))
        params = [p for p in self.model.parameters() if p.requires_grad]
        self._grads[int(index)] = torch.autograd.grad(loss, params, allow_unused=True)
        return dict(st, loss=float(loss.detach()), time_s=time.perf_counter() - t0)

    def take_gradient(self, index: int) -> tuple:
        """Remove and return the kept gradient of micro-batch ``index`` (one tensor or None
        per trainable parameter, ``model.parameters()`` order): for checks and measurements;
        ``optimizer_step`` consumes them otherwise."""
        return self._grads.pop(int(index))

    def put_gradient(self, index: int, grads) -> None:
        """Keep a micro-batch gradient computed elsewhere (another process holding the same
        weights: ``take_gradient`` there) under ``index``, for ``optimizer_step``."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        if len(grads) != len(params):
            raise ValueError(f"put_gradient({index}): {len(grads)} tensors for {len(params)} trainable parameters")
        self._grads[int(index)] = tuple(grads)

    def optimizer_step(self, indices) -> float:
        """Sum the kept gradients of micro-batches ``indices`` in index order (not in the
        order they finished), clip, one optimizer step; returns the norm before clipping."""
        import torch

        missing = sorted(set(int(i) for i in indices) - set(self._grads))
        if missing:
            raise RuntimeError(f"optimizer_step: no gradient kept for micro-batch(es) {missing}")
        params = [p for p in self.model.parameters() if p.requires_grad]
        total: list = [None] * len(params)
        for i in sorted(int(i) for i in indices):
            for k, g in enumerate(self._grads.pop(i)):
                if g is not None:
                    total[k] = g.clone() if total[k] is None else total[k].add_(g)
        self.optimizer.zero_grad(set_to_none=True)
        for p, g in zip(params, total):
            p.grad = g
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                              self.max_grad_norm if self.max_grad_norm else float("inf"))
        self.optimizer.step()
        return float(norm)

    def finish_update(self, micro_stats, norms, mini_batches: int, tokens: int, time_s: float) -> dict:
        """Close one ``update_actor``: the version goes up by one; returns (and keeps in
        ``history``) its metrics from the micro-batch statistics in index order and the
        mini-batches' gradient norms."""
        if not norms:
            raise ValueError("finish_update: no optimizer step was taken")
        sums = {k: 0.0 for k in UPDATE_STATS}
        for st in micro_stats:  # means over the mini-batches, summed in index order
            for k in UPDATE_STATS:
                sums[k] += st[k] / mini_batches
        self._grads.clear()
        self.version += 1
        metrics = dict(sums, grad_norm=float(np.mean(norms)), grad_norm_max=float(np.max(norms)),
                       mini_batches=int(mini_batches), tokens=int(tokens), time_s=float(time_s),
                       version=self.version)
        self.history.append(metrics)
        return metrics

    def update_actor(self, batch, old_log_probs, advantages, ref_log_probs=None) -> dict:
        """One GRPO update on ``batch``: ``mini_batches`` optimizer steps (the batch shuffled
        with a seeded permutation and split: ``update_plan``), each accumulated over
        micro-batches, loss of grpo.policy_loss (token mean over each mini-batch's response
        tokens). The micro-batches run here one after another; the stage runner can run the
        same plan resized (``micro_grad``/``optimizer_step``) with the same result.

        ``old_log_probs`` / ``ref_log_probs``: [B, R] from ``old_log_prob`` / ``ref_log_prob``
        of the same batch; ``advantages``: [B]. Returns metrics (floats): ``loss``,
        ``pg_loss``, ``clip_frac``, ``approx_kl``, ``kl``, ``grad_norm`` (before clipping;
        means over the mini-batches), ``grad_norm_max``, ``tokens``, ``time_s``, ``version``
        (after the update).
        """
        import torch

        t0 = time.perf_counter()
        B = len(batch)
        old = torch.as_tensor(old_log_probs, dtype=torch.float32)
        ref = None if ref_log_probs is None else torch.as_tensor(ref_log_probs, dtype=torch.float32)
        adv = np.asarray(advantages, dtype=np.float32)
        if old.shape[0] != B or adv.shape[0] != B:
            raise ValueError(f"batch of {B} samples, old_log_probs {tuple(old.shape)}, advantages {tuple(adv.shape)}")
        self.model.train()
        plan = self.update_plan(B)
        stats, norms, tokens = [], [], 0
        for group in plan.groups():
            n_tok = trained_tokens(batch, [i for m in group for i in m.samples])
            tokens += n_tok
            for m in group:
                idx = list(m.samples)
                stats.append(self.micro_grad(m.index, [batch[i] for i in idx], old[idx], adv[idx],
                                             None if ref is None else ref[idx], n_tok, one_thread=False))
            norms.append(self.optimizer_step([m.index for m in group]))
        return self.finish_update(stats, norms, plan.mini_batches, tokens, time.perf_counter() - t0)

    # ---- weights ----------------------------------------------------------------------------
    def state_dict_bf16(self) -> dict:
        """The policy's weights under their checkpoint names, as bfloat16 CPU tensors (the
        rollout engines serve bfloat16): what a weight sync pushes."""
        import torch

        return {k: v.detach().to(torch.bfloat16).contiguous() for k, v in self.model.state_dict().items()}

    def get_version(self) -> int:
        """``version`` (an attribute is not readable through a Ray actor handle)."""
        return self.version

    # ---- sampling (standalone loops and tests; real runs generate with the engines) --------
    def sample_responses(self, prompts, samples_per_prompt: int, max_new_tokens: int, seed: int = 0,
                         temperature: float = 1.0) -> list:
        """Sample ``samples_per_prompt`` responses of exactly ``max_new_tokens`` tokens per
        prompt from the current policy (``model.generate``, pure sampling: no top-k/top-p,
        EOS ignored), seeded with ``torch.manual_seed(seed)``. Returns a batch
        ``[(prompt, response, prompt_index), ...]``, samples of a prompt adjacent."""
        import torch

        batch = []
        self.model.eval()
        try:
            torch.manual_seed(int(seed))
            for j, prompt in enumerate(prompts):
                x = torch.tensor([list(prompt)] * samples_per_prompt, dtype=torch.long)
                with torch.no_grad():
                    out = self.model.generate(x, attention_mask=torch.ones_like(x), do_sample=True,
                                              temperature=temperature, top_k=0, top_p=1.0,
                                              max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                                              eos_token_id=None, pad_token_id=self.pad_token_id)
                for row in out[:, x.shape[1]:].tolist():
                    batch.append((list(prompt), row, j))
        finally:
            self.model.train()
        return batch


def make_trainer_actor(model_path, device_resource: str = "jigsaw_device", num_devices: int = 1,
                       num_cpus: float = 0, **trainer_kwargs):
    """A ``ReferenceTrainer`` in a Ray actor that holds ``num_devices`` units of the custom
    resource ``device_resource`` (Ray must be initialised, e.g.
    ``ray.init(num_cpus=2, resources={"jigsaw_device": 2})``).

    On CPU machines one device is one core (docs/ENV.md): the device resource is the
    accounting unit, so the actor asks for ``num_cpus=0`` by default and runs torch with
    ``num_devices`` threads. Asking for a CPU as well would count the core twice: on these
    2-core machines (``num_cpus=2``) a trainer and a rollout engine that each took a CPU
    *and* a device could starve the driver and any helper task of CPU slots, and a
    second pipeline's trainer could not be placed although a device is free. What keeps
    the cores honest is the device resource plus the thread count, not Ray's CPU slots.

    Methods are called as usual through the handle: ``actor.update_actor.remote(...)``;
    ``actor.get_version.remote()`` for the version.
    """
    import ray

    trainer_kwargs.setdefault("num_threads", int(num_devices))
    cls = ray.remote(ReferenceTrainer)
    return cls.options(num_cpus=num_cpus, resources={device_resource: num_devices}).remote(
        str(model_path), **trainer_kwargs)
