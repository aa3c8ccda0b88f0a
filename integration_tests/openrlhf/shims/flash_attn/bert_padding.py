"""TEST-ENVIRONMENT SHIM (see flash_attn/__init__.py): pure-torch padding helpers with the
signatures of flash-attn 2.8.3's bert_padding, which are pure torch upstream too."""

import torch
from einops import rearrange  # re-exported: OpenRLHF imports it from here

__all__ = ["index_first_axis", "pad_input", "rearrange", "unpad_input"]


def index_first_axis(tensor, indices):
    """Rows `indices` of `tensor` along its first axis (autograd through torch indexing)."""
    return tensor[indices]


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """(batch, seqlen, ...) -> (total_nnz, ...), indices, cu_seqlens, max_seqlen, seqused."""
    all_masks = (attention_mask + unused_mask) if unused_mask is not None else attention_mask
    seqlens_in_batch = all_masks.sum(dim=-1, dtype=torch.int32)
    used_seqlens_in_batch = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(all_masks.flatten(), as_tuple=False).flatten()
    max_seqlen_in_batch = int(seqlens_in_batch.max().item())
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(seqlens_in_batch, dim=0, dtype=torch.int32), (1, 0))
    flat = rearrange(hidden_states, "b s ... -> (b s) ...")
    return index_first_axis(flat, indices), indices, cu_seqlens, max_seqlen_in_batch, used_seqlens_in_batch


def pad_input(hidden_states, indices, batch, seqlen):
    """(total_nnz, ...) -> (batch, seqlen, ...), zeros where nothing was scattered."""
    dim = hidden_states.shape[1:]
    output = torch.zeros((batch * seqlen), *dim, device=hidden_states.device, dtype=hidden_states.dtype)
    output[indices] = hidden_states
    return rearrange(output, "(b s) ... -> b s ...", b=batch)
