"""A model state (name -> tensor) as one contiguous byte buffer and back, bit for bit.

Strategies move bytes: the trainer packs its state once into a uint8 buffer; replicas fill
their own buffer (whole, or chunk by chunk) and view it as tensors again, sharing the
replica's buffer, so a replica holds one copy of the weights. Works for torch tensors (any
dtype, bfloat16 included: the bytes are reinterpreted, never converted) and numpy arrays;
torch is imported only when the state holds torch tensors.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from jigsaw_plugin.errors import SpecError

__all__ = ["StateLayout", "TensorSlot", "pack_state", "pack_synthetic", "state_checksum", "synthetic_state",
           "unpack_state"]


@dataclass(frozen=True, slots=True)
class TensorSlot:
    """Where one tensor lives in the packed buffer."""

    name: str
    dtype: str  # "float32" for numpy, "torch.bfloat16" for torch
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class StateLayout:
    """The packed buffer's table of contents, in the state's own key order."""

    slots: tuple[TensorSlot, ...]
    total_bytes: int


def _is_torch(value: object) -> bool:
    return type(value).__module__.startswith("torch")


def _as_bytes(name: str, value) -> tuple[str, tuple[int, ...], np.ndarray]:
    if _is_torch(value):
        t = value.detach().contiguous().reshape(-1)
        import torch  # only a state of torch tensors gets here

        return str(value.dtype), tuple(value.shape), t.view(torch.uint8).numpy()
    if isinstance(value, np.ndarray):
        a = np.ascontiguousarray(value)  # (makes a 0-d array 1-d: the shape comes from value)
        return a.dtype.str, tuple(value.shape), a.reshape(-1).view(np.uint8)
    raise SpecError(f"state[{name!r}]", type(value).__name__, "a torch tensor or a numpy array")


def pack_state(state: dict) -> tuple[StateLayout, np.ndarray]:
    """The state's layout and one new uint8 buffer holding every tensor's bytes."""
    if not isinstance(state, dict) or not state:
        raise SpecError("state", type(state).__name__, "a non-empty dict of name -> tensor")
    parts, slots, offset = [], [], 0
    for name, value in state.items():
        dtype, shape, raw = _as_bytes(name, value)
        slots.append(TensorSlot(str(name), dtype, shape, offset, int(raw.nbytes)))
        parts.append(raw)
        offset += int(raw.nbytes)
    buffer = np.empty(offset, dtype=np.uint8)
    for slot, raw in zip(slots, parts):
        buffer[slot.offset : slot.offset + slot.nbytes] = raw
    return StateLayout(tuple(slots), offset), buffer


def unpack_state(layout: StateLayout, buffer: np.ndarray) -> dict:
    """Tensors viewing ``buffer`` (no copy: the caller owns the buffer)."""
    if buffer.nbytes != layout.total_bytes:
        raise SpecError("buffer", buffer.nbytes, f"exactly {layout.total_bytes} bytes (the layout's total)")
    state = {}
    for s in layout.slots:
        raw = buffer[s.offset : s.offset + s.nbytes]
        if s.dtype.startswith("torch."):
            import torch  # the trainer sent torch tensors

            state[s.name] = torch.from_numpy(raw).view(getattr(torch, s.dtype[len("torch.") :])).reshape(s.shape)
        else:
            state[s.name] = raw.view(np.dtype(s.dtype)).reshape(s.shape)
    return state


def state_checksum(state: dict) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in key order."""
    h = hashlib.sha256()
    for name, value in state.items():
        dtype, shape, raw = _as_bytes(name, value)
        h.update(f"{name}|{dtype}|{shape}|".encode())
        h.update(memoryview(raw))
    return h.hexdigest()


def _synthetic_sizes(total_bytes: int, tensor_bytes: int, backend: str) -> list[int]:
    """Floats per tensor of a synthetic state (validating its arguments)."""
    if isinstance(total_bytes, bool) or not isinstance(total_bytes, int) or total_bytes < 4:
        raise SpecError("total_bytes", total_bytes, "an integer >= 4 (bytes)")
    if isinstance(tensor_bytes, bool) or not isinstance(tensor_bytes, int) or tensor_bytes < 4:
        raise SpecError("tensor_bytes", tensor_bytes, "an integer >= 4 (bytes)")
    if backend not in ("numpy", "torch"):
        raise SpecError("backend", backend, "numpy or torch")
    left, per, sizes = total_bytes // 4, max(1, tensor_bytes // 4), []
    while left > 0:
        sizes.append(min(per, left))
        left -= sizes[-1]
    return sizes


def synthetic_state(total_bytes: int, seed: int = 0, tensor_bytes: int = 64 * 1024 * 1024,
                    backend: str = "numpy") -> dict:
    """Random float32 tensors (uniform [0, 1): no NaN, so equality is exact) adding up to
    ``total_bytes`` (rounded down to whole floats), cut into tensors of ``tensor_bytes``
    like a model's layers. ``backend`` "torch" returns torch tensors."""
    rng = np.random.default_rng(seed)
    state = {f"layers.{i}.weight": rng.random(n, dtype=np.float32)
             for i, n in enumerate(_synthetic_sizes(total_bytes, tensor_bytes, backend))}
    if backend == "torch":
        import torch

        state = {k: torch.from_numpy(v) for k, v in state.items()}
    return state


def pack_synthetic(total_bytes: int, seed: int = 0, tensor_bytes: int = 64 * 1024 * 1024,
                   backend: str = "numpy") -> tuple[StateLayout, np.ndarray]:
    """``pack_state(synthetic_state(...))`` bit for bit, drawn straight into the packed
    buffer: the trainer holds one copy of a GB-sized state while building it, not two."""
    rng = np.random.default_rng(seed)
    sizes = _synthetic_sizes(total_bytes, tensor_bytes, backend)
    dtype = "torch.float32" if backend == "torch" else np.dtype(np.float32).str
    slots, offset = [], 0
    for i, n in enumerate(sizes):
        slots.append(TensorSlot(f"layers.{i}.weight", dtype, (n,), offset, 4 * n))
        offset += 4 * n
    buffer = np.empty(offset, dtype=np.uint8)
    for s in slots:  # the same draws, in the same order, as synthetic_state
        rng.random(s.nbytes // 4, dtype=np.float32, out=buffer[s.offset : s.offset + s.nbytes].view(np.float32))
    return StateLayout(tuple(slots), offset), buffer
