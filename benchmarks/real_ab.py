"""The real A/B on this machine: reference GRPO pipelines on real vLLM engines and torch
trainers (``jigsaw bench --backend ray``), verl-sync's static partition against jigsaw.

    .venv-cpu/bin/python benchmarks/real_ab.py     # ~10 min on the 2-core machine
    python benchmarks/real_ab.py --render          # re-render from the JSON (simulator re-run)

Needs ``.venv-cpu`` (``make venv-cpu``). Writes benchmarks/results/real_ab.json and the
"Real engines" section of docs/benchmarks.md (report.py renders the same section from
the JSON when it rewrites the file). Run it on a quiet machine: each row is the median
of side-by-side repeats, but heavy background load still moves the ratios.
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "real_ab.json"
BENCH = ROOT / "benchmarks" / "results" / "real_ab_bench.json"
START, END = "<!-- real-ab:start -->", "<!-- real-ab:end -->"

CASES = [
    # (label, workload file, steps of each pipeline or None for the file's)
    ("2 pipelines x 4 steps (same work)", "examples/workloads/real_ab_2cpu.yaml", None),
    ("grpo-b stops after 2 steps", "examples/workloads/real_ab_2cpu.yaml", {"grpo-b": 2}),
]


def _spec(path: str, steps: dict | None) -> dict:
    """The case's workload: the file's, with some pipelines' step counts replaced."""
    import yaml

    data = yaml.safe_load((ROOT / path).read_text())
    for p in data["pipelines"]:
        p["steps"] = (steps or {}).get(p["name"], p["steps"])
    return data


def _workload_file(path: str, steps: dict | None, tmp: Path) -> Path:
    import yaml

    if not steps:
        return ROOT / path
    out = tmp / f"{Path(path).stem}-{'-'.join(f'{k}{v}' for k, v in steps.items())}.yaml"
    out.write_text(yaml.safe_dump(_spec(path, steps), sort_keys=False))
    return out


def run(repeats: int = 3) -> dict:
    import tempfile

    from jigsaw_plugin.runtime.ray_bench import run_ab_ray
    from jigsaw_plugin.sim import simulate

    rows = []
    BENCH.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for label, path, steps in CASES:
            ab = run_ab_ray(_workload_file(path, steps, Path(tmp)), "verl-sync", "jigsaw", repeats=repeats,
                            predict=simulate)
            if not rows:  # the first case's whole bench JSON: calibrate_cpu.py fits the cpu factors to it
                BENCH.write_text(json.dumps(ab, indent=1))
            rows.append({"case": label, "workload": path, "steps": steps, **{
                k: ab[k] for k in ("throughput_ratio", "ratios_per_repeat", "samples_per_s", "gpu_busy_fraction",
                                   "peak_memory_gib", "peak_rss_sum_gib", "simulated")},
                "migrations": {s: sum(p["migrations"] for p in ab[s]["pipelines"].values())
                               for s in ("baseline", "candidate")},
                "stage_s": {s: {n: p["stage_s"] for n, p in ab[s]["pipelines"].items()}
                            for s in ("baseline", "candidate")},
                "engine_weight_versions": ab["candidate"]["measured"]["engine_weight_versions"],
                "reward_mean_by_step": ab["candidate"]["measured"]["reward_mean_by_step"]})
    return {"machine": f"{platform.machine()}, Python {platform.python_version()}", "repeats": repeats,
            "rows": rows}


def resimulate(data: dict) -> None:
    """The simulator's prediction for each row with the cost model as committed now (the
    cpu factors are fitted to this very run by calibrate_cpu.py after it)."""
    from jigsaw_plugin.sim import simulate
    from jigsaw_plugin.workload import parse_workload

    for r in data["rows"]:
        wl = parse_workload(_spec(r["workload"], r["steps"]))
        b, c = simulate(wl, "verl-sync"), simulate(wl, "jigsaw")
        r["simulated"] = {"baseline": b["samples_per_s"], "candidate": c["samples_per_s"],
                          "throughput_ratio": c["samples_per_s"] / b["samples_per_s"],
                          "gpu_busy_fraction": [b["gpu_busy_fraction"], c["gpu_busy_fraction"]]}


def render(data: dict) -> str:
    """The markdown section (also used by report.py)."""
    lines = [
        "## Real engines on this machine (`--backend ray`: Ray + vLLM + torch, no emulation)",
        "",
        "Reference GRPO pipelines (`runtime/reference/`) on the tiny Qwen2, 2 devices = the 2",
        "cores, one vLLM engine per (pipeline, device) started once and pinned to its core;",
        "trainer stages pinned to the cores the policy grants. Response lengths: the PolyTrace",
        "verl trace / 8 (`examples/workloads/real_ab_2cpu.yaml`). Each row: verl-sync (static",
        f"partition) and jigsaw run {data['repeats']} times side by side (order alternating, after",
        "an untimed warm-up); samples/s are medians. Memory: the PSS sum of every process of",
        "the run (driver, Ray, engines, trainers). `python benchmarks/real_ab.py` in `.venv-cpu`.",
        "\"simulator predicts\": the same workload simulated with the `cpu` factors fitted to",
        "this run's verl-sync stage times (`benchmarks/calibrate_cpu.py`, docs/calibration.md).",
        "",
        "| case | verl-sync samples/s | jigsaw samples/s | ratio (median) | per repeat | busy verl-sync / jigsaw | simulator predicts | peak memory GiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        sps = r["samples_per_s"]
        med = {k: sorted(v)[len(v) // 2] for k, v in sps.items()}
        busy = {k: sorted(v)[len(v) // 2] for k, v in r["gpu_busy_fraction"].items()}
        lines.append(
            f"| {r['case']} | {med['verl-sync']:.2f} | {med['jigsaw']:.2f} | {r['throughput_ratio']:.2f}x | "
            + ", ".join(f"{x:.2f}" for x in r["ratios_per_repeat"])
            + f" | {busy['verl-sync']:.2f} / {busy['jigsaw']:.2f} | {r['simulated']['throughput_ratio']:.2f}x "
            f"({r['simulated']['baseline']:.1f} samples/s) | {r['peak_memory_gib']:.1f} |")
    lines += [
        "",
        "**Against the target (jigsaw >= 1.3x verl-sync, peak memory < 12 GiB).** Memory is met;",
        "the throughput target is not, and on this pool it cannot be. With two pipelines on two",
        "devices the static partition already gives each pipeline a core that it keeps busy",
        "(busy 0.9-1.0 under verl-sync), so no policy has idle devices to fill: the bound is",
        "about 1/busy. Where one pipeline stops early (second row) the static partition",
        "idles a core (busy 0.75) and jigsaw fills it (0.90) by giving the other pipeline's",
        "training stages both cores, but a second core speeds this 0.8M-parameter model up",
        "little: its rollout is bound by the longest response decoded one token per step (a",
        "decode step costs nearly the same at batch 1 and 32 on a core), and its forward and",
        "update passes are dispatch-bound small GEMMs. The simulator, fitted to the verl-sync",
        "stage times, gets the first row right and overestimates the second (it scales a",
        "training stage linearly with its devices). jigsaw's gains in the simulated tables",
        "above come from pools with more devices than pipelines, where a pipeline's tail can",
        "be consolidated and its freed devices lent: a 2-core machine has no such room.",
    ]
    return "\n".join(lines)


def write_section(text: str) -> None:
    doc = ROOT / "docs" / "benchmarks.md"
    body = doc.read_text()
    block = f"{START}\n{text}\n{END}"
    if START in body:
        body = body[: body.index(START)] + block + body[body.index(END) + len(END):]
    else:
        body = body.rstrip() + "\n\n" + block + "\n"
    doc.write_text(body)


def main() -> None:
    if "--render" in sys.argv:  # re-render from the JSON, re-simulating with today's cost model
        data = json.loads(RESULTS.read_text())
    else:
        repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
        data = run(repeats)
    resimulate(data)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(data, indent=1))
    text = render(data)
    write_section(text)
    print(text)


if __name__ == "__main__":
    main()
