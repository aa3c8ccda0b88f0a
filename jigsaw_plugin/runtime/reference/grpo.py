"""GRPO: group-normalised advantages and the clipped token-level policy-gradient loss.

Advantages (outcome supervision, as verl's ``compute_grpo_outcome_advantage``): the
samples of one prompt form a group, and a sample's advantage is its reward normalised
within its group,

    A_i = (r_i - mean_g) / (std_g + eps)

with ``std_g`` the unbiased (Bessel) standard deviation of the group's rewards, as
``torch.std`` in verl. Every response token of the sample gets ``A_i``. A group of one
sample has no relative signal: its advantage is 0 (verl would use the raw reward; we
prefer no update to an unnormalised one).

Loss (PPO-style clipped surrogate, token level, verl's ``compute_policy_loss`` with
``loss_agg_mode="token-mean"``): with ratio ``rho = exp(logp - logp_old)`` per token,

    L_tok = max(-A * rho, -A * clip(rho, 1 - eps_clip, 1 + eps_clip))

averaged over the response tokens of the batch (mask 1). Optionally a KL penalty to the
frozen reference policy is added per token, ``kl_coef * k3`` with the low-variance
estimator ``k3 = exp(ref - logp) - (ref - logp) - 1`` (verl's ``low_var_kl``, clamped to
[-10, 10]), as GRPO's ``use_kl_loss`` does.

``grpo_advantages`` is numpy only (the "adv" stage runs on the driver); ``policy_loss``
imports torch when called.
"""

from __future__ import annotations

import numpy as np

__all__ = ["grpo_advantages", "policy_loss", "CLIP_EPS"]

CLIP_EPS = 0.2


def grpo_advantages(rewards, group_ids, eps: float = 1e-6) -> np.ndarray:
    """Per-sample advantages: rewards normalised within each group (float64[N])."""
    r = np.asarray(rewards, dtype=np.float64)
    g = np.asarray(group_ids)
    if r.shape != g.shape or r.ndim != 1:
        raise ValueError(f"rewards {r.shape} and group_ids {g.shape} must be two vectors of one length")
    adv = np.zeros_like(r)
    for gid in np.unique(g):
        idx = np.flatnonzero(g == gid)
        if len(idx) < 2:
            continue  # no relative signal in a group of one
        x = r[idx]
        adv[idx] = (x - x.mean()) / (x.std(ddof=1) + eps)
    return adv


def policy_loss(log_probs, old_log_probs, advantages, mask, clip_eps: float = CLIP_EPS,
                ref_log_probs=None, kl_coef: float = 0.0, normalizer=None):
    """The clipped surrogate loss and its statistics.

    ``log_probs``, ``old_log_probs``, ``mask`` (and ``ref_log_probs``): float tensors [B, T]
    over the response positions; ``advantages``: [B] (one per sample, broadcast to its
    tokens) or [B, T]. ``normalizer``: the number of response tokens the mean is taken over
    (default: ``mask.sum()``; pass the whole batch's count when accumulating over
    micro-batches so that the sum of micro-batch losses is the batch's token mean).

    Returns ``(loss, stats)``: ``loss`` a scalar tensor with grad; ``stats`` floats:
    ``pg_loss``, ``clip_frac`` (share of tokens whose clipped term was taken), ``approx_kl``
    (mean of old - new log-prob) and ``kl`` (to the reference; 0 without one), all as
    sums over this (micro-)batch divided by ``normalizer``.
    """
    import torch

    mask = mask.to(log_probs.dtype)
    adv = torch.as_tensor(advantages, dtype=log_probs.dtype, device=log_probs.device)
    if adv.dim() == 1:
        adv = adv[:, None].expand_as(log_probs)
    n = mask.sum() if normalizer is None else torch.as_tensor(float(normalizer), dtype=log_probs.dtype)
    n = torch.clamp(n, min=1.0)

    log_ratio = log_probs - old_log_probs
    ratio = torch.exp(log_ratio)
    pg1 = -adv * ratio
    pg2 = -adv * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    pg = torch.maximum(pg1, pg2)
    pg_loss = (pg * mask).sum() / n
    loss = pg_loss
    kl_val = torch.zeros((), dtype=log_probs.dtype)
    if ref_log_probs is not None and kl_coef:
        d = ref_log_probs - log_probs
        k3 = torch.clamp(torch.exp(d) - d - 1.0, -10.0, 10.0)
        kl_val = (k3 * mask).sum() / n
        loss = loss + kl_coef * kl_val
    with torch.no_grad():
        stats = {
            "pg_loss": float(pg_loss),
            "clip_frac": float(((pg2 > pg1).to(mask.dtype) * mask).sum() / n),
            "approx_kl": float((-log_ratio * mask).sum() / n),
            "kl": float(kl_val),
        }
    return loss, stats
