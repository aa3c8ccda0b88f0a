"""The example workloads shipped with the package (``jigsaw demo`` runs them).

In a wheel they are package data under ``jigsaw_plugin/example_workloads/`` (pyproject.toml
maps ``examples/workloads/`` there); in a source checkout they are read from
``examples/workloads/`` itself.
"""

from __future__ import annotations

from pathlib import Path

from jigsaw_plugin.errors import SpecError

__all__ = ["bundled_workload_dirs", "bundled_workload", "bundled_workload_names"]

_PACKAGE_DIR = Path(__file__).resolve().parents[1]


def bundled_workload_dirs() -> list[Path]:
    """Where bundled workloads may be: the installed package data, then the checkout."""
    return [d for d in (_PACKAGE_DIR / "example_workloads", _PACKAGE_DIR.parent / "examples" / "workloads")
            if d.is_dir()]


def bundled_workload_names() -> list[str]:
    return sorted({p.name for d in bundled_workload_dirs() for p in d.glob("*.yaml")})


def bundled_workload(name: str) -> Path:
    """The path of a bundled workload file (``demo.yaml``)."""
    for d in bundled_workload_dirs():
        if (d / name).is_file():
            return d / name
    raise SpecError("bundled workload", name, ", ".join(bundled_workload_names()) or
                    "(none found: reinstall jigsaw-plugin)")
