"""The verl versions this adapter's patches and trainer were written against (no verl import)."""

from __future__ import annotations

__all__ = ["SUPPORTED", "UnsupportedVerlVersion", "check_version", "is_supported"]

#: ``major.minor`` series whose file:line interception points were read (docs/verl.md).
SUPPORTED = ("0.9",)


class UnsupportedVerlVersion(RuntimeError):
    """The installed verl is not one the adapter was written against."""


def is_supported(version: str | None) -> bool:
    if not version:
        return False
    parts = str(version).split(".")
    return ".".join(parts[:2]) in SUPPORTED


def check_version(version: str | None, what: str = "trainer.v1.trainer_mode=jigsaw") -> None:
    """Raise :class:`UnsupportedVerlVersion` with a clear message unless ``version`` is 0.9.x."""
    if not is_supported(version):
        raise UnsupportedVerlVersion(
            f"{what}: jigsaw-plugin supports verl {', '.join(s + '.x' for s in SUPPORTED)}; "
            f"installed verl is {version!r}. Install verl==0.9.1 (docs/verl.md) or drop the option."
        )
