"""Who is still alive: heartbeats of the drivers sharing a coordinator (pure: no Ray, no clock).

A driver that crashes never calls ``unregister_pipeline``, so without this the pool would
keep its leases for ever. Each driver's coordinator client sends a heartbeat per
registered pipeline every ``heartbeat_s``; the coordinator's reaper asks
:meth:`HeartbeatBook.expired` at its own pace and releases what a silent pipeline held.
Times are passed in (monotonic seconds), so the book is tested without sleeping.
"""

from __future__ import annotations

from dataclasses import dataclass

from jigsaw_plugin.errors import SpecError

__all__ = ["HeartbeatBook", "LivenessSettings", "LOSS_MODES"]

#: What a driver does when its coordinator is lost: ``stop`` (every later call raises
#: ``CoordinatorDied``) or ``fallback`` (warn once, then run on the host's own devices).
LOSS_MODES = ("stop", "fallback")


@dataclass(frozen=True)
class LivenessSettings:
    """Heartbeat timing of one coordinator client (driver side).

    :param heartbeat_s: Seconds between two heartbeats of a registered pipeline.
    :param loss_timeout_s: A heartbeat unanswered this long means the coordinator is lost
        (hung or partitioned; a dead actor is reported by Ray at once).
    :param on_coordinator_loss: One of :data:`LOSS_MODES`.
    """

    heartbeat_s: float = 1.0
    loss_timeout_s: float = 10.0
    on_coordinator_loss: str = "stop"

    def __post_init__(self):
        for name in ("heartbeat_s", "loss_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e6:
                raise SpecError(name, value, "a number of seconds > 0")
        if self.on_coordinator_loss not in LOSS_MODES:
            raise SpecError("on_coordinator_loss", self.on_coordinator_loss, " | ".join(LOSS_MODES))


class HeartbeatBook:
    """Last heartbeat of each watched pipeline; those silent for ``timeout_s`` have expired.

    :param timeout_s: Silence after which a pipeline's driver counts as dead.
    """

    def __init__(self, timeout_s: float):
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise SpecError("heartbeat_timeout_s", timeout_s, "a number of seconds > 0")
        self.timeout_s = float(timeout_s)
        self._last: dict[str, float] = {}

    def watch(self, pipeline: str, now: float) -> None:
        """Start watching ``pipeline`` (its registration counts as the first heartbeat)."""
        self._last[pipeline] = now

    def beat(self, pipeline: str, now: float) -> bool:
        """Record a heartbeat; ``False`` if the pipeline is not watched (expired or never
        registered), which tells its driver that its leases are gone."""
        if pipeline not in self._last:
            return False
        self._last[pipeline] = max(self._last[pipeline], now)
        return True

    def forget(self, pipeline: str) -> None:
        self._last.pop(pipeline, None)

    def watched(self) -> tuple[str, ...]:
        return tuple(self._last)

    def expired(self, now: float) -> list[str]:
        """The pipelines silent for more than ``timeout_s``; they are forgotten here."""
        gone = [p for p, t in self._last.items() if now - t > self.timeout_s]
        for p in gone:
            del self._last[p]
        return gone
