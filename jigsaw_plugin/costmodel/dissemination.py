"""The simulator's price of weight dissemination: closed forms for naive, chain and pull.

Symbols: S bytes of weights, N replicas, c chunk bytes (C = ceil(S / c) chunks), a modelled
wide-area link of bandwidth B and latency L (a transfer of x bytes holds the sender's
uplink for x / B and arrives L later; both 0 without a link), and the machine's own
per-message transfer ``hop(x) = o + x / beta`` (an object-store put and the receiver's copy
on CPU; an NCCL send on GPUs). ``P`` is how many hops can run at once (cores on the CPU
machine; unbounded on GPUs, where every node has its own link).

A sender's real put of one message overlaps its uplink's time for the next, so a stream of
messages of x bytes costs max(x / B, hop(x)) each, plus min(x / B, hop(x)) once.

- naive: the trainer sends S to each replica in turn:
  N * max(S / B, hop(S)) + min(S / B, hop(S)) + L
- chain: chunks relayed trainer -> r1 -> ... -> rN, every node sending over its own uplink;
  C + N - 1 pipeline stages of one chunk, the latency and the fill once per hop:
  (C + N - 1) * max(c / B, hop(c)) + N * (L + min(c / B, hop(c))),
  but never less than the work N * C * hop(c) / P
- pull: the trainer puts S into the store once (hop(S)); N replicas pull it through the
  store's one egress link (serialised) and copy it in parallel (up to P):
  hop(S) + max(N * S / B + hop(S), S / B + N * hop(S) / P) + L

``trainer_seconds`` is how long the trainer itself is held: all of it for naive (it
waits for every replica), C * max(c / B, hop(c)) + min(c / B, hop(c)) + L for chain (until
the first replica holds its last chunk), hop(S) for pull.

``CPU_HOP`` is fitted to this machine's measurements (benchmarks/dissemination.py fits o
and beta to the one-replica runs without a link: naive sends one message of S, chain C
messages of c); the GPU hops come from published bandwidths (``gpu_hop``), not from
measurements here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.runtime.dissemination.spec import STRATEGIES, DisseminationSpec, LinkSpec, check_replicas

__all__ = ["CPU_HOP", "DisseminationPrice", "HopCost", "dissemination_price", "fit_hop", "gpu_hop"]


@dataclass(frozen=True, slots=True)
class HopCost:
    """One real transfer between two nodes: ``overhead_s + bytes / bytes_per_s``;
    ``parallel_hops`` is how many can run at once (``None``: unbounded)."""

    overhead_s: float
    bytes_per_s: float
    parallel_hops: int | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if not (isinstance(self.overhead_s, (int, float)) and math.isfinite(self.overhead_s) and self.overhead_s >= 0):
            raise SpecError("hop.overhead_s", self.overhead_s, "a finite number >= 0 (seconds)")
        if not (isinstance(self.bytes_per_s, (int, float)) and math.isfinite(self.bytes_per_s) and self.bytes_per_s > 0):
            raise SpecError("hop.bytes_per_s", self.bytes_per_s, "a finite number > 0 (bytes per second)")
        p = self.parallel_hops
        if p is not None and (isinstance(p, bool) or not isinstance(p, int) or p < 1):
            raise SpecError("hop.parallel_hops", p, "an integer >= 1, or None for unbounded")

    def seconds(self, nbytes: float) -> float:
        return self.overhead_s + nbytes / self.bytes_per_s


# Fitted on this 2-core machine by benchmarks/dissemination.py (2026-11-23, load average
# 30-70 from other users; docs/benchmarks.md "Weight dissemination on Ray"): o and beta by
# least squares over naive x1 and chain x1 without a link, 8-512 MB, torch float32 states,
# Ray 2.60 object store. P = 2 cores.
CPU_HOP = HopCost(overhead_s=0.0040, bytes_per_s=1.666e9, parallel_hops=2,
                  source="fitted: naive x1 and chain x1 on the 2-core CI machine (Ray object store)")


def gpu_hop(hardware: str = "h100", scope: str = "internode", overhead_s: float = 30e-6) -> HopCost:
    """A GPU-to-GPU hop priced from the hardware profile's published link bandwidth
    (``costmodel/profiles``: NVLink per direction intra-node, one 400 Gb/s NIC per device
    across nodes). ``overhead_s`` is a per-message NCCL launch/handshake cost (an
    estimate, not a measurement). Every node has its own link, so hops are unbounded."""
    from jigsaw_plugin.costmodel.profiles import hardware_profile

    if scope not in ("intranode", "internode"):
        raise SpecError("scope", scope, "intranode or internode")
    hw = hardware_profile(hardware)
    gbps = hw.link_gbps if scope == "intranode" else hw.internode_gbps
    return HopCost(overhead_s=overhead_s, bytes_per_s=gbps * 1e9, parallel_hops=None,
                   source=f"published: {hw.name} {scope} {gbps:g} GB/s per direction")


def fit_hop(points: list[tuple[int, float, float]], parallel_hops: int | None, source: str) -> HopCost:
    """Least squares of ``seconds = messages * overhead + bytes / bandwidth`` over
    (messages, bytes, seconds) points (no intercept: zero messages of zero bytes take no
    time). Needs points that tell the two apart (different sizes, or different message
    counts for one size); a negative overhead is clamped to 0."""
    a11 = sum(m * m for m, _, _ in points)
    a12 = sum(m * b for m, b, _ in points)
    a22 = sum(b * b for _, b, _ in points)
    det = a11 * a22 - a12 * a12
    if len(points) < 2 or det <= 1e-12 * a11 * a22:
        raise SpecError("points", len(points), "at least two points with different bytes per message")
    y1 = sum(m * s for m, _, s in points)
    y2 = sum(b * s for _, b, s in points)
    overhead = (a22 * y1 - a12 * y2) / det
    per_byte = (a11 * y2 - a12 * y1) / det
    if per_byte <= 0:
        raise SpecError("points", points, "seconds that grow with bytes")
    return HopCost(overhead_s=max(0.0, overhead), bytes_per_s=1.0 / per_byte, parallel_hops=parallel_hops,
                   source=source)


@dataclass(frozen=True, slots=True)
class DisseminationPrice:
    """The predicted time until every replica holds the weights, and the trainer's share."""

    strategy: str
    seconds: float
    trainer_seconds: float


def _busy(link: LinkSpec | None, nbytes: float) -> float:
    return 0.0 if link is None else link.busy_seconds(nbytes)


def dissemination_price(spec: DisseminationSpec, total_bytes: int, replicas: int,
                        hop: HopCost = CPU_HOP) -> DisseminationPrice:
    """The closed form of ``spec.strategy`` for ``total_bytes`` to ``replicas`` replicas."""
    if spec.strategy not in STRATEGIES:  # a spec is validated on construction; belt and braces
        raise SpecError("strategy", spec.strategy, "one of " + ", ".join(STRATEGIES))
    if isinstance(total_bytes, bool) or not isinstance(total_bytes, int) or total_bytes < 1:
        raise SpecError("total_bytes", total_bytes, "an integer >= 1 (bytes)")
    n = check_replicas(replicas)
    s, link = total_bytes, spec.link
    latency = 0.0 if link is None else link.latency_s
    p = math.inf if hop.parallel_hops is None else hop.parallel_hops
    if spec.strategy == "naive":
        # the sender's put of one copy overlaps its uplink's time for the next
        b, h = _busy(link, s), hop.seconds(s)
        t = n * max(b, h) + min(b, h) + latency
        return DisseminationPrice("naive", t, t)
    if spec.strategy == "chain":
        chunks = spec.chunks(s)
        c = s / chunks  # equal chunks: the last, shorter one is spread over all
        b, h = _busy(link, c), hop.seconds(c)
        pipeline = (chunks + n - 1) * max(b, h) + n * (latency + min(b, h))
        work = n * chunks * h / p
        return DisseminationPrice("chain", max(pipeline, work), chunks * max(b, h) + min(b, h) + latency)
    push = hop.seconds(s)
    pulls = max(n * _busy(link, s) + hop.seconds(s), _busy(link, s) + n * hop.seconds(s) / p) + latency
    return DisseminationPrice("pull", push + pulls, push)
