"""TEST-ENVIRONMENT SHIM (see flash_attn/__init__.py): all_gather as in flash-attn 2.8.3
(torch.distributed only; used by OpenRLHF's ring attention, which is off on CPU)."""

import torch
import torch.distributed as dist


def all_gather(input_, process_group=None, async_op=False):
    """Concatenate `input_` from every rank along dim 0 (synchronous here)."""
    world_size = dist.get_world_size(process_group)
    output = torch.empty(world_size * input_.shape[0], *input_.shape[1:], dtype=input_.dtype, device=input_.device)
    dist.all_gather_into_tensor(output, input_.contiguous(), group=process_group)
    return output
