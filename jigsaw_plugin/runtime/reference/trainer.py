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

torch and transformers are imported inside functions, Ray inside ``make_trainer_actor``:
importing this module needs none of them.
"""

from __future__ import annotations

import copy
import time

import numpy as np

from jigsaw_plugin.runtime.reference.grpo import CLIP_EPS, policy_loss

__all__ = ["ReferenceTrainer", "collate", "make_trainer_actor", "DEFAULT_LR", "DEFAULT_MINI_BATCHES"]

DEFAULT_LR = 1e-2
DEFAULT_MINI_BATCHES = 4


def _sample_mask(item) -> list[int]:
    n = len(item[1])
    if len(item) > 3 and item[3] is not None:
        mask = [1 if m else 0 for m in item[3]]
        if len(mask) != n:
            raise ValueError(f"response mask has {len(mask)} entries for {n} response tokens")
        return mask
    return [1] * n


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
        masks.append(_sample_mask(item))
    B, L, R = len(batch), max(map(len, seqs)), max(1, max(rlens))
    input_ids = torch.full((B, L), int(pad_token_id), dtype=torch.long)
    attention_mask = torch.zeros((B, L), dtype=torch.long)
    response_mask = torch.zeros((B, R), dtype=torch.float32)
    gather_index = torch.zeros((B, R), dtype=torch.long)
    for b, (seq, p, r, m) in enumerate(zip(seqs, plens, rlens, masks)):
        input_ids[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention_mask[b, : len(seq)] = 1
        if r:
            response_mask[b, :r] = torch.tensor(m, dtype=torch.float32)
            # token at position p + k is predicted by the logits at position p + k - 1
            gather_index[b, :r] = torch.arange(p - 1, p - 1 + r)
    prompt_index = torch.tensor([int(item[2]) for item in batch], dtype=torch.long)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "response_mask": response_mask,
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
                 micro_batch_size: int | None = None, max_grad_norm: float = 1.0, weight_decay: float = 0.0,
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
        self.micro_batch_size = micro_batch_size
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

    def use_devices(self, devices) -> list[int]:
        """Run the next stages on these devices: on CPU, pin every thread to their cores
        and use one torch thread per device (cpu_affinity.py). Returns the cores."""
        import torch

        from jigsaw_plugin.runtime.cpu_affinity import pin_this_process

        torch.set_num_threads(max(1, len(devices)))
        return pin_this_process(devices)

    # ---- forward stages -------------------------------------------------------------------
    def _log_probs(self, model, batch):
        import torch

        out = []
        with torch.no_grad():
            for chunk in self._chunks(list(range(len(batch)))):
                out.append(_token_log_probs(model, collate([batch[i] for i in chunk], self.pad_token_id)))
        R = max(x.shape[1] for x in out)
        return torch.cat([torch.nn.functional.pad(x, (0, R - x.shape[1])) for x in out], 0)

    def old_log_prob(self, batch):
        """Per-token log-probs [B, R] of the responses under the current policy (no grad);
        padding and masked tokens are 0."""
        return self._log_probs(self.model, batch)

    def ref_log_prob(self, batch):
        """Per-token log-probs [B, R] under the frozen reference (the initial weights)."""
        if self.ref is None:
            raise RuntimeError("this trainer was made with with_ref=False (no reference model)")
        return self._log_probs(self.ref, batch)

    # ---- update ---------------------------------------------------------------------------
    def _chunks(self, idx: list[int]) -> list[list[int]]:
        m = self.micro_batch_size or len(idx)
        return [idx[i: i + m] for i in range(0, len(idx), m)]

    def update_actor(self, batch, old_log_probs, advantages, ref_log_probs=None) -> dict:
        """One GRPO update on ``batch``: ``mini_batches`` optimizer steps (the batch shuffled
        with a seeded permutation and split), each accumulated over micro-batches, loss of
        grpo.policy_loss (token mean over each mini-batch's response tokens).

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
        adv = torch.as_tensor(np.asarray(advantages, dtype=np.float32))
        if old.shape[0] != B or adv.shape[0] != B:
            raise ValueError(f"batch of {B} samples, old_log_probs {tuple(old.shape)}, advantages {tuple(adv.shape)}")
        order = np.arange(B)
        if self.mini_batches > 1:  # a seeded shuffle before the split, as verl's shuffle=True
            order = np.random.default_rng([self.seed, self.version]).permutation(B)
        minis = [list(map(int, c)) for c in np.array_split(order, min(self.mini_batches, B)) if len(c)]
        self.model.train()
        sums = {"loss": 0.0, "pg_loss": 0.0, "clip_frac": 0.0, "approx_kl": 0.0, "kl": 0.0}
        norms, tokens = [], 0
        for mini in minis:
            n_tok = sum(sum(_sample_mask(batch[i])) for i in mini)
            tokens += n_tok
            self.optimizer.zero_grad(set_to_none=True)
            for chunk in self._chunks(mini):
                t = collate([batch[i] for i in chunk], self.pad_token_id)
                R = t["response_mask"].shape[1]
                lp = _token_log_probs(self.model, t)
                loss, st = policy_loss(lp, old[chunk, :R], adv[chunk], t["response_mask"], self.clip_eps,
                                       None if ref is None else ref[chunk, :R], self.kl_coef,
                                       normalizer=max(1, n_tok))
                loss.backward()
                sums["loss"] += float(loss.detach()) / len(minis)
                for k in ("pg_loss", "clip_frac", "approx_kl", "kl"):
                    sums[k] += st[k] / len(minis)
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                                  self.max_grad_norm if self.max_grad_norm else float("inf"))
            norms.append(float(norm))
            self.optimizer.step()
        self.version += 1
        metrics = dict(sums, grad_norm=float(np.mean(norms)), grad_norm_max=float(np.max(norms)),
                       mini_batches=len(minis), tokens=tokens, time_s=time.perf_counter() - t0,
                       version=self.version)
        self.history.append(metrics)
        return metrics

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
