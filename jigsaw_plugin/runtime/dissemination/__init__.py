"""Weight dissemination from a trainer to N inference replicas, on Ray with real tensors.

Three strategies (docs/dissemination.md):

- ``naive``: the trainer sends the whole state to each replica in turn (time ~ size x count);
- ``chain``: ECHO-2's peer-assisted pipelined broadcast: the state is cut into chunks and
  chunk k goes trainer -> r1 -> r2 -> ... while chunk k+1 follows (time ~ size + count x chunk);
- ``pull``: RLAX's parameter server: the trainer publishes each version in Ray's object
  store through a small registry actor; replicas pull the latest when ready; older
  versions are released.

A ``LinkSpec`` models a wide-area link (sleep(latency + bytes / bandwidth) per transfer,
on top of the real transfer). Ray is imported only when a ``DisseminationGroup`` is made.
"""

from jigsaw_plugin.runtime.dissemination.codec import (
    StateLayout,
    TensorSlot,
    pack_state,
    pack_synthetic,
    state_checksum,
    synthetic_state,
    unpack_state,
)
from jigsaw_plugin.runtime.dissemination.spec import STRATEGIES, DisseminationSpec, LinkSpec, check_replicas

__all__ = [
    "STRATEGIES",
    "DisseminationGroup",
    "DisseminationResult",
    "DisseminationSpec",
    "LinkSpec",
    "ReplicaDelivery",
    "StateLayout",
    "SyntheticSource",
    "TensorSlot",
    "check_replicas",
    "pack_state",
    "pack_synthetic",
    "state_checksum",
    "synthetic_state",
    "unpack_state",
]


def __getattr__(name: str):
    # The Ray-backed names load ray on first use, never at import time.
    if name in ("DisseminationGroup", "DisseminationResult", "ReplicaDelivery"):
        from jigsaw_plugin.runtime.dissemination import group

        return getattr(group, name)
    if name == "SyntheticSource":
        from jigsaw_plugin.runtime.dissemination.actors import SyntheticSource

        return SyntheticSource
    raise AttributeError(name)
