"""Errors that reach users: one paragraph naming the field, the bad value and what is allowed."""

from __future__ import annotations

__all__ = ["SpecError"]


class SpecError(ValueError):
    """A bad value in user input (a workload file, a CLI option, a config key).

    ``field`` is a dotted path (``pipelines[0].response_len.dist``), ``value`` the value
    that was given, ``allowed`` a short text of what is allowed, ``where`` the file or
    option source it came from (optional).
    """

    def __init__(self, field: str, value: object, allowed: str, where: str | None = None):
        self.field = field
        self.value = value
        self.allowed = allowed
        self.where = where
        prefix = f"{where}: " if where else ""
        super().__init__(f"{prefix}{field}: got {value!r}; allowed: {allowed}")
