"""What weights a vLLM engine holds, read back from its worker process (preemption checks).

``DigestWeightsExtension`` is the engine's weight-loading worker extension
(``WorkerWeightsExtension``, engines/vllm_engine.py) that, after every load, writes two
digests to ``<digest dir>/<worker pid>.json`` (one JSON line per load, the file started
afresh by each worker process):

- ``loaded``: ``state_checksum`` (dissemination/codec.py: sha256 over every tensor's name,
  dtype, shape and bytes) of exactly the tensors the worker received, comparable with the
  checksum of the trainer's published version;
- ``params``: sha256 over the model's own parameters after the load (vLLM's fused names and
  layouts), comparable between engines that loaded the same version.

A run selects it with the engine keyword ``worker_extension_cls=EXTENSION``. The driver
finds an engine's file by the pids its actor reports (``pids()``) and reads it with
``read_digests``. The worker runs in vLLM's process, so torch is imported there, inside the
methods; this module imports neither torch nor vLLM at import time.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from jigsaw_plugin.runtime.engines.vllm_engine import WorkerWeightsExtension

__all__ = ["EXTENSION", "DigestWeightsExtension", "digest_dir", "read_digests"]

EXTENSION = "jigsaw_plugin.runtime.preemption_weights.DigestWeightsExtension"
_ENV = "JIGSAW_WEIGHT_DIGEST_DIR"


def digest_dir() -> Path:
    """Where workers write their digests (``$JIGSAW_WEIGHT_DIGEST_DIR``, else a temp folder)."""
    return Path(os.environ.get(_ENV) or Path(tempfile.gettempdir()) / "jigsaw-weight-digests")


def read_digests(pids) -> list[dict]:
    """Every load recorded by the worker processes among ``pids``, in order."""
    out = []
    for pid in pids:
        path = digest_dir() / f"{int(pid)}.json"
        if path.exists():
            out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def _rebuild(payload) -> dict:
    import torch

    state = {}
    for name, dtype, shape, buf in payload:
        dt = getattr(torch, dtype)
        state[name] = torch.frombuffer(bytearray(buf), dtype=dt).reshape(shape) if buf else torch.empty(shape, dtype=dt)
    return state


def _params_digest(model) -> str:
    import torch

    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class DigestWeightsExtension(WorkerWeightsExtension):
    """``WorkerWeightsExtension`` that records what every load left in the worker."""

    _digest_started = False

    def jigsaw_load_weights(self, payload) -> int:
        from jigsaw_plugin.runtime.dissemination.codec import state_checksum

        n = super().jigsaw_load_weights(payload)
        row = {"loaded": state_checksum(_rebuild(payload)), "params": _params_digest(self.model_runner.get_model()),
               "tensors": n}
        folder = digest_dir()
        folder.mkdir(parents=True, exist_ok=True)
        mode = "a" if DigestWeightsExtension._digest_started else "w"  # a reused pid's old file goes
        DigestWeightsExtension._digest_started = True
        with open(folder / f"{os.getpid()}.json", mode) as f:
            f.write(json.dumps(row) + "\n")
        return n
