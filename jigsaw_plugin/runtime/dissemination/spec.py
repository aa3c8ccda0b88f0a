"""What a dissemination run is asked to do: the strategy, its chunking and the modelled link.

Plain frozen dataclasses, no Ray and no torch: the cost model (``costmodel/dissemination``)
prices the same specs the Ray strategies run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from jigsaw_plugin.errors import SpecError

__all__ = ["STRATEGIES", "DisseminationSpec", "LinkSpec", "check_replicas"]

# naive: the trainer sends the whole state to each replica in turn.
# chain: ECHO-2's peer-assisted pipelined broadcast, chunks relayed replica to replica.
# pull: RLAX's parameter server, versions in Ray's object store, replicas pull the latest.
STRATEGIES = ("naive", "chain", "pull")


def _positive_finite(field: str, value: object, allowed: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise SpecError(field, value, allowed)
    return float(value)


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """A modelled wide-area link between the trainer site and remote workers (ECHO-2's
    configurable link), applied on top of the real local transfer. Each sender has its
    own uplink of this spec: a transfer holds it for ``bytes / bandwidth_bytes_s``
    (transfers leaving one sender serialise) and arrives ``latency_s`` later (propagation
    does not hold the uplink, so a stream of chunks pays the latency once)."""

    bandwidth_bytes_s: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        _positive_finite("link.bandwidth_bytes_s", self.bandwidth_bytes_s, "a finite number > 0 (bytes per second)")
        lat = self.latency_s
        if isinstance(lat, bool) or not isinstance(lat, (int, float)) or not math.isfinite(lat) or lat < 0:
            raise SpecError("link.latency_s", lat, "a finite number >= 0 (seconds)")

    @classmethod
    def from_gbit_s(cls, gbit_s: float, latency_ms: float = 0.0) -> "LinkSpec":
        """A link given the way networks are quoted: Gbit/s and a one-way latency in ms."""
        _positive_finite("link.gbit_s", gbit_s, "a finite number > 0 (Gbit/s)")
        return cls(bandwidth_bytes_s=gbit_s * 1e9 / 8, latency_s=latency_ms / 1e3)

    def busy_seconds(self, nbytes: float) -> float:
        """How long one transfer of ``nbytes`` holds the sender's uplink."""
        return nbytes / self.bandwidth_bytes_s

    def seconds(self, nbytes: float) -> float:
        """How long one transfer of ``nbytes`` alone takes to arrive."""
        return self.latency_s + nbytes / self.bandwidth_bytes_s


@dataclass(frozen=True, slots=True)
class DisseminationSpec:
    """One strategy with its parameters. ``chunk_bytes`` cuts the state for ``chain``
    (the others send it whole); ``link`` is the modelled WAN link, ``None`` for the
    machine's own transfers only."""

    strategy: str
    chunk_bytes: int = 8 * 1024 * 1024
    link: LinkSpec | None = None

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise SpecError("strategy", self.strategy, "one of " + ", ".join(STRATEGIES))
        c = self.chunk_bytes
        if isinstance(c, bool) or not isinstance(c, int) or c <= 0:
            raise SpecError("chunk_bytes", c, "an integer > 0 (bytes per chunk)")
        if self.link is not None and not isinstance(self.link, LinkSpec):
            raise SpecError("link", self.link, "a LinkSpec or None")

    def chunks(self, total_bytes: int) -> int:
        """How many chunks ``chain`` cuts a state of ``total_bytes`` into (at least one)."""
        return max(1, math.ceil(total_bytes / self.chunk_bytes))


def check_replicas(replicas: object) -> int:
    """The replica count, validated: an integer >= 1."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise SpecError("replicas", replicas, "an integer >= 1")
    return replicas
