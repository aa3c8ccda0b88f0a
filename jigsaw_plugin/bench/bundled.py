"""The example workloads shipped with the package (``jigsaw demo`` runs them).

In a wheel they are package data under ``jigsaw_plugin/example_workloads/`` (pyproject.toml
maps ``examples/workloads/`` there and ships every ``*.yaml``); in a source checkout they are
read from ``examples/workloads/`` itself.

``BUNDLED_WORKLOADS`` names the benchmark workloads (a)-(f) that the benchmark report runs
every policy on; ``resolve_workload`` turns a key (``e``), a file stem
(``e_dapo_longtail_32gpu``), a file name or a path into the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from jigsaw_plugin.errors import SpecError

__all__ = ["BundledWorkload", "BUNDLED_WORKLOADS", "bundled_workload_dirs", "bundled_workload",
           "bundled_workload_names", "benchmark_workload", "resolve_workload"]

_PACKAGE_DIR = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class BundledWorkload:
    """One benchmark workload: its report key, its file and what regime it stands for."""

    key: str
    file: str
    title: str
    regime: str

    @property
    def path(self) -> Path:
        return bundled_workload(self.file)


BUNDLED_WORKLOADS: tuple[BundledWorkload, ...] = (
    BundledWorkload("a", "a_sync4_32gpu.yaml", "4 sync pipelines, 32 H100",
                    "synchronous multi-pipeline: DAPO math + Search-R1 agents"),
    BundledWorkload("b", "b_sync8_64gpu.yaml", "8 sync pipelines, 64 H100",
                    "synchronous multi-pipeline at twice the scale of (a)"),
    BundledWorkload("c", "c_async2_16gpu.yaml", "2 async pipelines (staleness 1), 16 H100",
                    "asynchronous RL within a staleness bound"),
    BundledWorkload("d", "d_hetero_32gpu.yaml", "1.5B + 7B + 32B, 32 H100",
                    "heterogeneous model sizes"),
    BundledWorkload("e", "e_dapo_longtail_32gpu.yaml", "long-tail DAPO to 32K (7B, 32B, 14B code), 32 H100",
                    "long-tail rollouts: responses to 20-32K tokens, code groups at the cap"),
    BundledWorkload("f", "f_agentic_32gpu.yaml", "2 search agents + SWE agent, 32 H100",
                    "agentic: many-turn tool use, tools of milliseconds to minutes, sandboxed reward"),
)


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


def benchmark_workload(key: str) -> BundledWorkload:
    """The benchmark workload of a report key (``a``-``f``)."""
    for w in BUNDLED_WORKLOADS:
        if w.key == key:
            return w
    raise SpecError("benchmark workload", key, ", ".join(w.key for w in BUNDLED_WORKLOADS))


def resolve_workload(name: str | Path) -> Path:
    """A workload file from an existing path, a benchmark key (``e``), a bundled file name
    (``e_dapo_longtail_32gpu.yaml``) or its stem. An existing path always wins."""
    path = Path(name)
    if path.is_file():
        return path
    text = str(name)
    keys = {w.key: w.file for w in BUNDLED_WORKLOADS}
    if text in keys:
        return bundled_workload(keys[text])
    for candidate in (text, f"{text}.yaml"):
        if candidate in bundled_workload_names():
            return bundled_workload(candidate)
    raise SpecError("workload", text, "an existing YAML file, a benchmark key ("
                    + ", ".join(keys) + ") or a bundled workload: " + ", ".join(bundled_workload_names()))
