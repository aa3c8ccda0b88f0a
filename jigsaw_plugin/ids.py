"""Typed request ids: one trajectory of one sample, and one turn of it.

A trajectory id is what verl's balancer keeps sticky (all turns of a sample go to the
replica that served the previous turn); a turn id names one generation request. Both
print as the strings the hooks and the router have always carried
(``"<pipeline>/<step>/<sample>"`` and ``".../<turn>"``), so event logs stay readable, and
``parse`` is the one place such a string is split.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RequestId"]


@dataclass(frozen=True, slots=True, order=True)
class RequestId:
    pipeline: str
    step: int
    sample: int
    turn: int | None = None  # None: the whole trajectory

    def __str__(self) -> str:
        base = f"{self.pipeline}/{self.step}/{self.sample}"
        return base if self.turn is None else f"{base}/{self.turn}"

    @property
    def trajectory(self) -> "RequestId":
        """The id without its turn (what sticky routing keys on)."""
        return self if self.turn is None else RequestId(self.pipeline, self.step, self.sample)

    def at_turn(self, turn: int) -> "RequestId":
        return RequestId(self.pipeline, self.step, self.sample, turn)

    @classmethod
    def parse(cls, text: str, turn: bool = True) -> "RequestId":
        """``"<pipeline>/<step>/<sample>/<turn>"`` (``turn=False``: a trajectory id,
        ``"<pipeline>/<step>/<sample>"``); the pipeline name may hold ``/``."""
        parts = str(text).split("/")
        try:
            if turn and len(parts) >= 4:
                return cls("/".join(parts[:-3]), int(parts[-3]), int(parts[-2]), int(parts[-1]))
            if len(parts) >= 3:
                return cls("/".join(parts[:-2]), int(parts[-2]), int(parts[-1]))
        except ValueError:
            pass
        raise ValueError(f"request id {text!r} is not '<pipeline>/<step>/<sample>[/<turn>]'")
