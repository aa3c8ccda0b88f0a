"""Random job mixes: jigsaw against every baseline on workloads no one tuned for.

The bundled workloads (a)-(f) are what the policy was developed on; a policy tuned to them
can still lose elsewhere. This draws job mixes at random from the bundled pipelines (their
fitted length, turn and tool distributions, models and algorithms) with a fixed seed: 2-5
pipelines, static shares of 4, 8 or 16 GPUs (8 or 16 for 14B and 32B models), some
synchronous pipelines made asynchronous (staleness 1 or 2) and some the other way, H100 or
H20, 4 steps each. Every policy runs every mix in its own process, seed 0, default predictor.

What the comparison means: jigsaw, verl-sync and rollmux keep each pipeline's staleness
(verl-sync and rollmux run an asynchronous pipeline synchronously, which is stricter);
one-step-off, streamrl and areal run every pipeline at least one step off-policy, which
changes a synchronous pipeline's algorithm. So "vs on-policy" is jigsaw against the best
of verl-sync and rollmux, the comparison a user of a synchronous recipe makes; "vs all"
includes the off-policy systems. A baseline that cannot run a mix (a share too small to
split into rollout and training devices) is shown with the reason.

``--synthetic`` draws the pipelines themselves instead (``synthetic_mixes``): models from
0.5B to 72B, GRPO, DAPO, PPO and REINFORCE, lognormal lengths with random medians and
spreads up to 32K tokens, multi-turn tools of 30 ms to a minute, sandboxed rewards,
asynchronous pipelines, shares of 2-32 GPUs on H100, H20 or A100 nodes of 4 or 8: shapes
the bundled files do not have, to find where a policy or a baseline breaks. ``--large``
puts three synthetic mixes' pipelines on one pool (``large_mixes``): 3-15 pipelines (7-15
on 96-256 GPUs in the 9 mixes of seed 9000).

    python benchmarks/random_mixes.py                 # 16 mixes, seed 2026; writes the block
    python benchmarks/random_mixes.py --synthetic     # 60 synthetic mixes, seed 0; its own block
    python benchmarks/random_mixes.py --large         # 9 large mixes (3 synthetic ones each), seed 9000
    python benchmarks/random_mixes.py --mixes 4 --no-doc
    python benchmarks/random_mixes.py --synthetic --classes --seed 100 --mixes 60
                                  # each pool as 1-3 device classes; prints, writes nothing
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import yaml
from common import EXAMPLES, ROOT, dump, md_table, write_doc_block

RESULTS = ROOT / "benchmarks" / "results" / "random_mixes.json"
BLOCK = "random-mixes"
SYNTHETIC_RESULTS = ROOT / "benchmarks" / "results" / "synthetic_mixes.json"
SYNTHETIC_BLOCK = "synthetic-mixes"
DEFAULT_SEED = {"large": 9000, "synthetic": 0, "random": 2026}  # the seed of each kind's block
LARGE_RESULTS = ROOT / "benchmarks" / "results" / "large_mixes.json"
LARGE_BLOCK = "large-mixes"
#: synthetic mixes a large mix puts on one pool
LARGE_PARTS = 3
# the registry's models a synthetic pipeline draws, with the fewest devices a rollout
# replica of each takes (larger models need tensor parallelism)
SYNTHETIC_MODELS = {"qwen2.5-0.5b": 1, "qwen2.5-1.5b": 1, "qwen2.5-3b": 1, "qwen2.5-7b": 1, "qwen3-8b": 1,
                    "qwen2.5-14b": 2, "qwen3-14b": 2, "qwen2.5-32b": 4, "qwen3-32b": 4, "qwen2.5-72b": 8}
SOURCES = ("a_sync4_32gpu", "c_async2_16gpu", "d_hetero_32gpu", "e_dapo_longtail_32gpu", "f_agentic_32gpu")
ON_POLICY = ("verl-sync", "rollmux")
OFF_POLICY = ("one-step-off", "streamrl", "areal")
POLICIES = ("jigsaw", *ON_POLICY, *OFF_POLICY)
STEPS = 4


def _templates() -> list:
    out = []
    for name in SOURCES:
        out += yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())["pipelines"]
    return out


def _large(model: str) -> bool:
    return any(tag in model for tag in ("14b", "32b"))


def _fit_training(spec: dict) -> dict:
    """Double a pipeline's share until it holds its training state (``CostModel.min_gang``:
    the simulator refuses a share that does not); the pool grows by what was added."""
    from jigsaw_plugin.costmodel import CostModel, hardware_profile, model_profile

    cost = CostModel.for_nodes(hardware_profile(spec["cluster"]["gpu"]), spec["cluster"]["gpus_per_node"])
    for p in spec["pipelines"]:
        need = cost.min_gang(model_profile(p["model"]), update=True)
        while p["gpus"] < need:
            spec["cluster"]["gpus"] += p["gpus"]
            p["gpus"] *= 2
    return spec


def mixes(seed: int, n: int) -> list[tuple[str, dict]]:
    """``n`` job mixes drawn with ``seed``: (name, workload spec)."""
    rng = np.random.default_rng(seed)
    templates = _templates()
    out = []
    for i in range(n):
        pipes = []
        for j in range(int(rng.integers(2, 6))):
            p = copy.deepcopy(templates[int(rng.integers(len(templates)))])
            p["name"] = f"{p['name']}-{j}"
            p["gpus"] = int(rng.choice([8, 16] if _large(p["model"]) else [4, 8, 16]))
            p["steps"] = STEPS
            flip = rng.random()
            if flip < 0.25:
                p["mode"], p["staleness"] = "async", int(rng.integers(1, 3))
            elif flip < 0.4:
                p["mode"] = "sync"
                p.pop("staleness", None)
            pipes.append(p)
        gpus = sum(p["gpus"] for p in pipes)
        pipes[0]["gpus"] += -gpus % 8  # whole nodes
        gpu = str(rng.choice(["h100", "h100", "h20"]))
        spec = {"version": 1, "cluster": {"gpus": gpus + (-gpus % 8), "gpu": gpu, "gpus_per_node": 8},
                "pipelines": pipes}
        out.append((f"m{i}", _fit_training(spec)))
    return out


def synthetic_mixes(seed: int, n: int) -> list[tuple[str, dict]]:
    """``n`` job mixes of pipelines drawn from scratch (mix ``i`` from seed ``seed + i``):
    1-5 pipelines, each a model of ``SYNTHETIC_MODELS`` on a share of at least two
    replicas' devices, GRPO / DAPO / PPO / REINFORCE (PPO with one sample per prompt and
    8x the prompts), responses lognormal with a median of 5-40% of a 1K-32K budget and a
    spread (sigma) of 0.3-1.3, 30% multi-turn (up to 9 turns, tools of 30 ms to 63 s), 20%
    with a sandboxed reward (0.5-60 s), 35% asynchronous (staleness 1 or 2), 2-4 steps; a
    pool of H100, H20 or A100 in nodes of 4 or 8."""
    out = []
    for i in range(n):
        rng = np.random.default_rng(seed + i)
        gpn = int(rng.choice([8, 8, 4]))
        pipes = []
        for j in range(int(rng.integers(1, 6))):
            model = str(rng.choice(list(SYNTHETIC_MODELS)))
            gpus = int(rng.choice([x for x in (2, 4, 8, 16, 32) if x >= 2 * SYNTHETIC_MODELS[model]]))
            alg = str(rng.choice(["grpo", "dapo", "ppo", "reinforce"]))
            budget = int(rng.choice([1024, 4096, 8192, 16384, 32768]))
            median = float(rng.uniform(0.05, 0.4) * budget)
            p = {"name": f"{model}-{alg}-{j}", "model": model, "algorithm": alg,
                 "prompts_per_step": int(rng.choice([16, 32, 64, 128, 256])),
                 "samples_per_prompt": int(rng.choice([1, 4, 8, 16])) if alg != "ppo" else 1,
                 "max_response_len": budget,
                 "prompt_len": {"dist": "lognormal", "median": float(rng.uniform(50, 2000)), "sigma": 0.5,
                                "min": 8, "max": 8000},
                 "response_len": {"dist": "lognormal", "median": median, "sigma": float(rng.uniform(0.3, 1.3)), "min": 1},
                 "reward": {"kind": "rule", "latency_s": {"dist": "const", "value": 0.01}},
                 "steps": int(rng.integers(2, 5)), "gpus": gpus,
                 "group_correlation": float(rng.uniform(0, 0.9))}
            if alg == "ppo":
                p["prompts_per_step"] *= 8
            if rng.random() < 0.3:
                p["turns"] = {"dist": "uniform", "low": 1, "high": int(rng.integers(2, 10))}
                p["tool_latency_s"] = {"dist": "lognormal", "median": float(10 ** rng.uniform(-1.5, 1.8)),
                                       "sigma": 0.8, "min": 0}
                p["observation_len"] = {"dist": "lognormal", "median": float(rng.uniform(20, 800)), "sigma": 0.6,
                                        "min": 1}
            if rng.random() < 0.2:
                p["reward"] = {"kind": "sandbox", "latency_s": {"dist": "lognormal", "median": float(rng.uniform(0.5, 60)),
                                                                "sigma": 0.5, "min": 0}}
            if rng.random() < 0.35:
                p["mode"], p["staleness"] = "async", int(rng.integers(1, 3))
            else:
                p["mode"] = "sync"
            pipes.append(p)
        total = sum(p["gpus"] for p in pipes)
        pipes[0]["gpus"] += -total % gpn  # whole nodes
        spec = {"version": 1, "cluster": {"gpus": total + (-total % gpn), "gpu": str(rng.choice(["h100", "h20", "a100"])),
                                          "gpus_per_node": gpn}, "pipelines": pipes}
        out.append((f"s{seed + i}", _fit_training(spec)))
    return out


def large_mixes(seed: int, n: int) -> list[tuple[str, dict]]:
    """``n`` large job mixes: mix ``i`` (named ``L`` and its first seed) runs the pipelines
    of ``LARGE_PARTS`` synthetic mixes (``synthetic_mixes`` from seed
    ``seed + LARGE_PARTS x i`` on) on one pool of the first one's device type and node
    size, each on its own share as drawn (so 3-15 pipelines; the 9 mixes of seed 9000 hold
    7-15 on 96-256 devices): the scale of a shared RL cluster, where the scheduler's rounds
    price the most replicas and pipelines."""
    out = []
    for i in range(n):
        first = seed + LARGE_PARTS * i
        parts = [spec for _, spec in synthetic_mixes(first, LARGE_PARTS)]
        pipes = [{**p, "name": f"m{k}-{p['name']}"} for k, part in enumerate(parts) for p in part["pipelines"]]
        gpn = parts[0]["cluster"]["gpus_per_node"]
        total = sum(p["gpus"] for p in pipes)
        pipes[0]["gpus"] += -total % gpn  # whole nodes
        spec = {"version": 1, "cluster": {**parts[0]["cluster"], "gpus": total + (-total % gpn)}, "pipelines": pipes}
        out.append((f"L{first}", _fit_training(spec)))  # a part fitted on another device type may need more
    return out


def _run(job: tuple) -> dict:
    """One (mix, policy) in this process: a summary, or why the policy could not run it."""
    name, spec, policy = job
    from jigsaw_plugin.errors import SpecError
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.sim import Simulation
    from jigsaw_plugin.workload import parse_workload

    start = time.monotonic()
    try:
        r = Simulation(parse_workload(spec, base_dir=EXAMPLES), get_policy(policy), 0).run()
    except SpecError as e:
        return {"mix": name, "policy": policy, "error": str(e)}
    sched = r["scheduler"]
    return {"mix": name, "policy": policy, "makespan_s": r["makespan_s"], "bounds": r["bounds"],
            "effective_utilisation": r["effective_utilisation"],
            "max_staleness": max(p["max_staleness"] for p in r["pipelines"].values()),
            "decisions": sched["decisions"], "decision_p50_us": sched["decision_p50_us"],
            "decision_p99_us": sched["decision_p99_us"], "wall_s": round(time.monotonic() - start, 1)}


def _drawn(seed: int, n: int, synthetic: bool, large: bool, classes: bool = False) -> list:
    """The block's mixes: (name, spec) of the large, synthetic or random kind; ``classes``:
    synthetic mix ``i``'s pool laid out as 1-3 device classes (``odd_workloads.with_classes``
    seeded by the mix's own seed), those whose spec then parses."""
    if not classes:
        return large_mixes(seed, n) if large else synthetic_mixes(seed, n) if synthetic else mixes(seed, n)
    from odd_workloads import with_classes

    from jigsaw_plugin.errors import SpecError
    from jigsaw_plugin.workload import parse_workload

    out = []
    for i, (name, spec) in enumerate(synthetic_mixes(seed, n)):
        laid = with_classes(spec, seed + i)
        try:
            parse_workload(laid, base_dir=EXAMPLES)
        except SpecError:
            continue  # a class too small for a pipeline's replica or trainer, refused by field
        out.append((name, laid))
    return out


def _pool(spec: dict) -> str:
    """A mix's pool in a table cell: "32 H100", or its classes ("14 H100 + 30 RTX4090")."""
    classes = spec["cluster"].get("classes")
    if not classes:
        return f"{spec['cluster']['gpus']} {spec['cluster']['gpu'].upper()}"
    name = lambda g: (g if isinstance(g, str) else g["name"]).upper()  # noqa: E731
    return " + ".join(f"{c['count']} {name(c['gpu'])}" for c in classes)


def _gpus(spec: dict) -> int:
    classes = spec["cluster"].get("classes")
    return sum(c["count"] for c in classes) if classes else spec["cluster"]["gpus"]


def measure(seed: int, n: int, synthetic: bool = False, large: bool = False, classes: bool = False) -> dict:
    drawn = _drawn(seed, n, synthetic, large, classes)
    jobs = [(name, spec, pol) for name, spec in drawn for pol in POLICIES]
    with ProcessPoolExecutor(max_workers=2, max_tasks_per_child=1) as ex:
        runs = list(ex.map(_run, jobs))
    drawn_from_scratch = synthetic or large
    return {"seed": seed, "steps": None if drawn_from_scratch else STEPS, "synthetic": drawn_from_scratch,
            "large": large, "classes": classes, "mixes": {name: spec for name, spec in drawn}, "runs": runs}


def measure_jigsaw_only(results, seed: int, n: int, synthetic: bool = False, large: bool = False) -> dict:
    """Re-run only jigsaw's runs (its policy changed) and keep the saved baselines' runs of
    the same mixes, which a change to the jigsaw policy does not touch; a saved file of
    other mixes is refused."""
    saved = json.loads(results.read_text())
    drawn = _drawn(seed, n, synthetic, large)
    same = json.loads(json.dumps({name: spec for name, spec in drawn}))
    if saved.get("seed") != seed or saved.get("mixes") != same:
        raise SystemExit(f"{results}: its mixes are not those of seed {seed}, {n} mixes; run without --jigsaw-only")
    with ProcessPoolExecutor(max_workers=2, max_tasks_per_child=1) as ex:
        fresh = {r["mix"]: r for r in ex.map(_run, [(name, spec, "jigsaw") for name, spec in drawn])}
    runs = [fresh[r["mix"]] if r["policy"] == "jigsaw" else r for r in saved["runs"]]
    return {**saved, "runs": runs, "jigsaw_only": True}


def _describe(spec: dict) -> str:
    parts = []
    for p in spec["pipelines"]:
        mode = "sync" if p.get("mode", "sync") == "sync" else f"async{p.get('staleness', 1)}"
        # the bundled pipeline it copies (a synthetic one: its model and algorithm)
        parts.append(f"{p['name'].rsplit('-', 1)[0]} {mode} {p['gpus']}")
    return "; ".join(parts)


_INTRO = """Mixes drawn at random (seed {seed}) from the bundled pipelines: 2-5 pipelines, static
shares of 4, 8 or 16 GPUs, some pipelines switched between synchronous and asynchronous,
H100 or H20, {steps} steps each; none was used to tune the policy."""
_SYNTHETIC_INTRO = """Mixes of pipelines drawn from scratch (mix `sN` from seed N; `synthetic_mixes`): 1-5
pipelines of Qwen2.5 / Qwen3 models from 0.5B to 72B, GRPO, DAPO, PPO or REINFORCE,
lognormal response lengths (median 5-40% of a 1K-32K budget, sigma 0.3-1.3), 30%
multi-turn with tools of 30 ms to a minute, 20% with a sandboxed reward, 35% asynchronous,
static shares of 2-32 GPUs, 2-4 steps, on H100, H20 or A100 nodes of 4 or 8 GPUs. No
bundled file has these shapes; none was used to tune the policy."""
_LARGE_INTRO = """Large mixes (mix `LN`: the pipelines of synthetic mixes `sN`, `sN+1` and `sN+2`, drawn as
in the synthetic block, on one pool of `sN`'s device type and node size;
`large_mixes`): here {pipes} pipelines on {gpus} GPUs, each on its share as drawn. The scale of a
shared RL cluster: the most replicas and pipelines a round prices, the most devices a
finished pipeline leaves to the others. None was used to tune the policy."""


def section(data: dict, load_before: str, load_after: str) -> str:
    by = {}
    for r in data["runs"]:
        by.setdefault(r["mix"], {})[r["policy"]] = r
    rows, on_ratios, all_ratios, losses = [], [], [], []
    for name, spec in data["mixes"].items():
        runs = by[name]
        j = runs["jigsaw"]
        if "makespan_s" not in j or "makespan_s" not in runs["verl-sync"]:
            continue  # refused by jigsaw or verl-sync (named under the table)
        cells = []
        for pol in POLICIES[1:]:
            r = runs[pol]
            cells.append(f"{r['makespan_s']:.0f}" if "makespan_s" in r else "n/a")
        ok = {p: runs[p]["makespan_s"] for p in POLICIES[1:] if "makespan_s" in runs[p]}
        on = {p: m for p, m in ok.items() if p in ON_POLICY}
        best_on = min(on.values())
        best_all = min(ok, key=ok.get)
        on_ratios.append(best_on / j["makespan_s"])
        all_ratios.append(ok[best_all] / j["makespan_s"])
        ahead = [f"{p} {m:.0f} s" for p, m in ok.items() if m < j["makespan_s"]]
        if ahead:
            losses.append(f"{name} (jigsaw {j['makespan_s']:.0f} s): " + ", ".join(ahead))
        lb = j["bounds"]["makespan_lower_bound_s"]
        base = runs["verl-sync"]["makespan_s"]
        gap = (base - j["makespan_s"]) / (base - lb) if base > lb else None
        rows.append([name, _pool(spec), _describe(spec),
                     f"{lb:.0f}", *cells, f"{j['makespan_s']:.0f}", f"{best_on / j['makespan_s']:.2f}x",
                     f"{ok[best_all] / j['makespan_s']:.2f}x ({best_all})", "-" if gap is None else f"{gap:.0%}",
                     f"{j['effective_utilisation']:.2f}"])
    synthetic = data.get("synthetic", False)
    head = ["mix", "pool", f"pipelines ({'model-algorithm' if synthetic else 'bundled pipeline'}, mode, GPUs)",
            "lower bound s",
            *[f"{p} s" for p in POLICIES[1:]], "jigsaw s", "jigsaw vs best on-policy", "jigsaw vs best of all",
            "gap recovered (vs verl-sync)", "jigsaw effective utilisation"]
    summary = (f"jigsaw against the best on-policy baseline: median {statistics.median(on_ratios):.2f}x, "
               f"lowest {min(on_ratios):.2f}x, highest {max(on_ratios):.2f}x over {len(on_ratios)} mixes; "
               f"against the best of all five: median {statistics.median(all_ratios):.2f}x, lowest "
               f"{min(all_ratios):.2f}x.")
    lost = ("Where a baseline finished first: " + "; ".join(losses) + ".") if losses else \
        "No baseline finished any mix before jigsaw."
    on_lost = [r for r in data["runs"] if r["policy"] in ON_POLICY and "makespan_s" in r
               and r["makespan_s"] < by[r["mix"]]["jigsaw"].get("makespan_s", float("inf"))]
    lost += (" No on-policy baseline finished a mix first." if not on_lost else
             f" On-policy baselines finished first on {len(on_lost)} (mix, policy) pairs.")
    refused = {}
    for r in data["runs"]:
        if "error" in r:
            refused.setdefault(r["policy"], []).append(r["mix"])
    if refused:
        lost += (" n/a: the policy refused the mix before running it (a share too small for its rollout and "
                 "a trainer that holds the training state, `CostModel.min_gang`): " +
                 "; ".join(f"{p} {len(m)}" for p, m in refused.items()) + ".")
    pairs = [(by[m]["rollmux"]["makespan_s"], by[m]["verl-sync"]["makespan_s"]) for m in data["mixes"]
             if "makespan_s" in by[m]["rollmux"] and "makespan_s" in by[m]["verl-sync"]]
    if pairs:
        lost += (f" RollMux against verl-sync: ahead on {sum(r < v for r, v in pairs)} of {len(pairs)} mixes, "
                 f"median makespan ratio {statistics.median(r / v for r, v in pairs):.2f}.")
    large = data.get("large", False)
    title = "Large job mixes" if large else "Synthetic job mixes" if synthetic else "Random job mixes"
    sizes = [(len(spec["pipelines"]), _gpus(spec)) for spec in data["mixes"].values()]
    intro = (_LARGE_INTRO if large else _SYNTHETIC_INTRO if synthetic else _INTRO).format(
        seed=data["seed"], steps=data["steps"], pipes=_span(n for n, _ in sizes), gpus=_span(g for _, g in sizes))
    kind = "large" if large else "synthetic" if synthetic else "random"
    flag = "" if kind == "random" else f" --{kind}"
    command = "python benchmarks/random_mixes.py" + (f"{flag} --mixes {len(data['mixes'])}" if synthetic else "")
    if data["seed"] != DEFAULT_SEED[kind]:  # the command reproduces the mixes drawn, not the default ones
        command += f" --seed {data['seed']}"
    if data.get("jigsaw_only"):
        command += " --jigsaw-only"
    if data.get("classes"):
        command = command.replace(" --synthetic", " --synthetic --classes")
        intro += (" Each pool laid out as 1-3 device classes (`odd_workloads.with_classes`, seeded by the"
                  " mix's seed); the mixes whose spec then parses.")
    scale = _scale_table(data, by) if large else ""
    return f"""## {title} (`benchmarks/random_mixes.py`)

{intro} Seed 0, default
predictor, each run its own process. jigsaw, verl-sync and rollmux keep each pipeline's
staleness (verl-sync and rollmux run an asynchronous pipeline synchronously);
one-step-off, streamrl and areal run every pipeline at least one step off-policy, so the
lower bound (of jigsaw's run: each pipeline at its own staleness) does not bind them: a
synchronous agent whose turns wait minutes on sandboxes is chain-bound on-policy, while
one step off-policy overlaps its steps. "n/a": the baseline refuses the mix (a share too
small to split into rollout and training devices). The disaggregated baselines split each
share by their own rule, balanced on an offline profile (`estimates.balanced_split`; not
swept per mix as the bundled table's tuned splits are). Load average (1 / 5 / 15 min) before {load_before}, after {load_after}.

{md_table(head, rows)}

{summary} {lost}
{scale}
`{command}` ({_took(data)} on 2 cores{_baselines_kept(data)})
"""


def _scale_table(data: dict, by: dict) -> str:
    """What the scale costs the scheduler and the simulator: jigsaw's decide rounds (state
    build and policy, wall microseconds per round, ``scheduler`` in the result JSON) and
    each run's wall seconds, per mix (results saved before stop 59 carry neither)."""
    rows = []
    for name, spec in data["mixes"].items():
        j, v = by[name]["jigsaw"], by[name]["verl-sync"]
        if "decisions" not in j:
            return ""
        rows.append([name, f"{spec['cluster']['gpus']}", f"{len(spec['pipelines'])}", f"{j['decisions']:,}",
                     f"{j['decision_p50_us']:,.0f} / {j['decision_p99_us']:,.0f}",
                     f"{j['wall_s']:,.0f} / {v.get('wall_s', 0):,.0f}"])
    head = ["mix", "GPUs", "pipelines", "jigsaw decide rounds", "decision p50 / p99 us (wall)",
            "simulation wall s: jigsaw / verl-sync"]
    return ("\nWhat the scale costs (jigsaw's decide rounds, state build and policy, in wall microseconds on a "
            "core shared with the other run; each simulation's wall seconds):\n\n" + md_table(head, rows) + "\n")


def _span(values) -> str:
    """``lo-hi`` of ``values`` (one value: itself)."""
    values = sorted(values)
    return f"{values[0]}" if values[0] == values[-1] else f"{values[0]}-{values[-1]}"


def _took(data: dict) -> str:
    """The run's wall time as measured (older result files: estimated from the run count)."""
    if "wall_s" in data:
        return f"{data['wall_s'] / 60:.0f} minutes"
    return f"about {len(data['runs']) * 2 // 60 + 1} minutes"


def _baselines_kept(data: dict) -> str:
    """Where only jigsaw's runs were re-run (``--jigsaw-only``): the baselines' are the saved
    ones, of the build that last ran them."""
    return "; jigsaw's runs only, the baselines' saved from the run before" if data.get("jigsaw_only") else ""


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} / {five:.1f} / {fifteen:.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--synthetic", action="store_true",
                    help="pipelines drawn from scratch (synthetic_mixes), not copied from the bundled files")
    ap.add_argument("--large", action="store_true",
                    help=f"{LARGE_PARTS} synthetic mixes' pipelines on one pool each (large_mixes)")
    ap.add_argument("--mixes", type=int, default=None, help="how many (default: 16; synthetic: 60; large: 9)")
    ap.add_argument("--seed", type=int, default=None, help="default: 2026; synthetic: 0; large: 9000")
    ap.add_argument("--no-doc", action="store_true", help="print the block; do not touch docs/benchmarks.md")
    ap.add_argument("--render", action="store_true", help="re-render the saved results")
    ap.add_argument("--classes", action="store_true",
                    help="with --synthetic: each pool laid out as 1-3 device classes; prints, writes nothing")
    ap.add_argument("--jigsaw-only", action="store_true",
                    help="re-run only jigsaw's runs (its policy changed); the baselines' from the saved results")
    args = ap.parse_args(argv)
    if args.large and args.synthetic:
        ap.error("--large and --synthetic: choose one")
    if args.classes and not args.synthetic:
        ap.error("--classes lays out synthetic mixes: add --synthetic")
    if args.classes and (args.jigsaw_only or args.render):
        ap.error("--classes measures every policy afresh and saves nothing: drop --jigsaw-only / --render")
    kind = "large" if args.large else "synthetic" if args.synthetic else "random"
    results, block = {"large": (LARGE_RESULTS, LARGE_BLOCK), "synthetic": (SYNTHETIC_RESULTS, SYNTHETIC_BLOCK),
                      "random": (RESULTS, BLOCK)}[kind]
    n = args.mixes if args.mixes is not None else {"large": 9, "synthetic": 60, "random": 16}[kind]
    seed = args.seed if args.seed is not None else DEFAULT_SEED[kind]
    if args.jigsaw_only:
        measure_fn = lambda: measure_jigsaw_only(results, seed, n, args.synthetic, args.large)  # noqa: E731
    else:
        measure_fn = lambda: measure(seed, n, args.synthetic, args.large, args.classes)  # noqa: E731
    return measure_render_write(results, block, measure_fn, section, args.render, args.no_doc or args.classes)


def measure_render_write(results, block: str, measure_fn, section_fn, render: bool, no_doc: bool) -> int:
    """Measure (or, ``render``, read the saved ``results``), render with ``section_fn(data,
    load before, load after)``, print, and save and write docs/benchmarks.md's ``block``
    unless ``no_doc``; the load averages and wall time go with the data."""
    if render:
        data = json.loads(results.read_text())
        before, _, after = data.get("load", "- -> -").partition(" -> ")
    else:
        before, start = _load(), time.monotonic()
        data = measure_fn()
        after = _load()
        data["load"] = f"{before} -> {after}"
        data["wall_s"] = round(time.monotonic() - start, 1)
        if not no_doc:
            dump(data, results)
    text = section_fn(data, before, after)
    print(text)
    if not no_doc:
        write_doc_block(block, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
