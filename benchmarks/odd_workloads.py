"""Every policy on small, odd workloads: does each run finish, refuse with a ``SpecError``
naming the field, and end no sooner than its makespan lower bound, each pipeline holding no
less than its own part of the ideal device-seconds?

The bundled workloads and the random and synthetic mixes are large and regular. Here each
seed draws 1-4 pipelines from the bundled files (a search agent, a SWE agent with sandboxed
rewards, long-tail DAPO, ...) and makes them odd: 1-32 devices a share, nodes of 1-8
devices, 1-8 prompts of 1-4 samples, response budgets of 16-4,096 tokens, 1-2 steps, some
asynchronous at staleness 1-3, some with a fixed rollout width; the pool is their shares
and sometimes a few devices more. Stop 61 found with it a bound that summed a sandboxed
reward and the forward passes that run beside it (docs/simulator.md, "Bounds").

    python benchmarks/odd_workloads.py                   # seeds 0-69, about 10 minutes
    python benchmarks/odd_workloads.py --seeds 110 136   # those seeds only
    python benchmarks/odd_workloads.py --classes         # each pool as 1-3 device classes
    python benchmarks/odd_workloads.py --preempt         # ... each class preemptible at even odds

``--classes`` lays each seed's pool out as 1-3 device classes (H100, A100, H20, a 48 GB
L40S-like and a 24 GB RTX 4090-like profile), each in nodes of its own size, and runs
jigsaw with cost-aware activation off too (``jigsaw-activation-off``). Stop 63 found with
it gangs sized for the first class on devices too small to hold them and shares, splits
and trainer sites that could not hold a pipeline's training state on their class; stop 66
(seed 149) rollout replicas at the first class's width on a class too small to hold them
(docs/simulator.md, "Device classes"). ``--preempt`` makes each class preemptible at even
odds, at rates that preempt within the odd runs' seconds to minutes; stop 66 found with it
verl-sync and RollMux stalling once a preemption took every replica of a step's rollout
(docs/plan.md, "Preemption"). A run past ``CPU_S`` is reported as "slow", not a crash:
seeds 70-139 had one, seed 94 under jigsaw (a 7B at ``rollout_tp: 4`` on 3 H100 and an
RTX 4090 preempted 20,000 times a device-hour, back after 1 s: its only replica group
holds the 4090; the run ends, at 118,114 simulated s, after 100,000 preemptions and
299,533 decide rounds, in 142 CPU s).

Prints a line per crash (a traceback), per run that ends below its bound and per run
stopped past ``CPU_S`` CPU seconds ("slow": one that may not end), then the count of each
outcome; exits 1 if there was a crash or a run below its bound.
"""

from __future__ import annotations

import argparse
import copy
import random
import resource
import signal
import sys
import traceback
from collections import Counter
from concurrent.futures import ProcessPoolExecutor

import yaml
from common import EXAMPLES

__all__ = ["spec_of", "with_classes", "with_preemption", "run_one", "limit_cpu", "OverCpu", "CPU_S", "POLICIES"]

POLICIES = ("jigsaw", "verl-sync", "one-step-off", "streamrl", "areal", "rollmux")
# with --classes: jigsaw with cost-aware activation off too (gangs sized from the first class)
CLASS_POLICIES = POLICIES + ("jigsaw-activation-off",)
GPUS = ("h100", "a100", "h20",
        {"name": "l40s", "flops_tflops": 362.0, "hbm_tbps": 0.864, "memory_gb": 48.0, "link_gbps": 32.0},
        {"name": "rtx4090", "flops_tflops": 165.0, "hbm_tbps": 1.008, "memory_gb": 24.0, "link_gbps": 32.0})
# the asynchronous baselines run a synchronous spec a step off-policy: its bound does not bind them
ON_POLICY = ("jigsaw", "verl-sync", "rollmux")
MODELS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "qwen2.5-72b", "qwen3-8b")
SOURCES = ("demo.yaml", "f_agentic_32gpu.yaml", "e_dapo_longtail_32gpu.yaml")
CPU_S = 120  # a run past this many CPU seconds is stopped and reported as "slow"


class OverCpu(BaseException):  # not an Exception: no handler in the run swallows it
    """The run's worker passed ``CPU_S`` CPU seconds (SIGXCPU at the soft limit)."""


def _over_cpu(signum, frame):
    raise OverCpu


def _pipelines() -> list:
    return [p for f in SOURCES for p in yaml.safe_load((EXAMPLES / f).read_text())["pipelines"]]


def spec_of(seed: int) -> dict:
    """The odd workload of ``seed`` (a plain spec dict; it may not parse)."""
    rng = random.Random(seed)
    pool = _pipelines()
    gpn = rng.choice([1, 2, 4, 8])
    pipes = []
    for i in range(rng.choice([1, 1, 2, 3, 4])):
        p = copy.deepcopy(pool[rng.randrange(len(pool))])
        p["name"] = f"p{i}"
        p["model"] = rng.choice(MODELS)
        p["algorithm"] = rng.choice(["grpo", "dapo", "ppo", "reinforce"])
        p["prompts_per_step"] = rng.choice([1, 2, 3, 8])
        p["samples_per_prompt"] = rng.choice([1, 2, 4])
        p["max_response_len"] = rng.choice([16, 64, 512, 4096])
        p["steps"] = rng.choice([1, 2])
        p["gpus"] = rng.choice([1, 2, 4, 8, 16, 16, 32])
        if rng.random() < 0.4:
            p["mode"] = "async"
            p["staleness"] = rng.choice([1, 2, 3])
        if rng.random() < 0.3:
            p["rollout_tp"] = rng.choice([1, 2, 4, 8])
        pipes.append(p)
    gpus = sum(p["gpus"] for p in pipes) + rng.choice([0, 0, 1, 4])
    return {"version": 1, "cluster": {"gpus": gpus, "gpu": rng.choice(["h100", "h20", "a100"]), "gpus_per_node": gpn},
            "pipelines": pipes}


def with_classes(spec: dict, seed: int) -> dict:
    """``spec``'s pool as 1-3 device classes of its devices in all (a stream of draws of
    its own: ``spec_of(seed)`` is the same workload with or without them)."""
    rng = random.Random(seed * 7919 + 1)
    left = spec["cluster"]["gpus"]
    classes = []
    for k in range(rng.choice([1, 2, 2, 3])):
        count = left if k == 2 or left <= 1 or rng.random() < 0.3 else rng.randint(1, left - 1)
        classes.append({"name": f"c{k}", "gpu": copy.deepcopy(rng.choice(GPUS)), "count": count,
                        "gpus_per_node": rng.choice([1, 2, 4, 8])})
        left -= count
        if not left:
            break
    if left:
        classes[-1]["count"] += left
    return dict(spec, cluster={"classes": classes})


def with_preemption(spec: dict, seed: int) -> dict:
    """``spec`` (laid out as classes) with each class preemptible at even odds: 200-20,000
    preemptions a device-hour (the odd runs last seconds to minutes), replaced after 1-30 s
    (a stream of draws of its own, so the pool is ``with_classes``'s)."""
    rng = random.Random(seed * 104729 + 3)
    classes = []
    for c in spec["cluster"]["classes"]:
        c = dict(c)
        if rng.random() < 0.5:
            c["preemptible"] = {"rate_per_hour": rng.choice([200.0, 2000.0, 20000.0]),
                                "replace_s": rng.choice([1.0, 5.0, 30.0])}
        classes.append(c)
    return dict(spec, cluster={"classes": classes})


def run_one(job: tuple) -> tuple:
    """(seed, policy, outcome, detail): outcome "ok", "spec" (the file is refused), "refused"
    (the policy refuses it), "below-bound" or "crash". ``job``: (seed, policy), (seed,
    policy, classes) or (seed, policy, classes, preempt)."""
    seed, policy, classes, preempt = (*job, False, False)[:4]
    from jigsaw_plugin.errors import SpecError
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.sim import Simulation
    from jigsaw_plugin.workload import parse_workload

    spec = spec_of(seed)
    try:
        laid = with_classes(spec, seed) if classes or preempt else spec
        wl = parse_workload(with_preemption(laid, seed) if preempt else laid, base_dir=EXAMPLES)
    except SpecError as e:
        return seed, policy, "spec", str(e)
    try:
        pol = get_policy("jigsaw", cost_aware=False) if policy == "jigsaw-activation-off" else get_policy(policy)
        r = Simulation(wl, pol, 0).run()
    except SpecError as e:
        return seed, policy, "refused", str(e)
    except OverCpu:
        return seed, policy, "slow", f"past {CPU_S} CPU seconds"
    except Exception:  # what this script hunts: reported, not raised
        return seed, policy, "crash", traceback.format_exc()
    bound = r["bounds"]["makespan_lower_bound_s"]
    if policy in ON_POLICY and r["makespan_s"] < bound * (1 - 1e-9):
        return seed, policy, "below-bound", f"{r['makespan_s']:.2f} s against a bound of {bound:.2f} s"
    # each pipeline's own part of the ideal is a floor on what it held (``Bounds.pipelines``)
    owns = (r["gap_breakdown"].get("pipelines") or {}) if policy in ON_POLICY else {}
    for name, own in owns.items():
        for kind in ("rollout", "training"):
            held, floor = own[f"{kind}_device_s"], own[f"ideal_{kind}_device_s"]
            if held < floor * (1 - 1e-9) - 1e-9:
                return seed, policy, "below-bound", f"{name}'s {kind} held {held:.2f} device-s, its floor {floor:.2f}"
    return seed, policy, "ok", f"{r['makespan_s']:.1f} s, {r['preemptions']['preemptions']} preemptions"


def limit_cpu() -> None:
    """Each worker process (one run each) is told past ``CPU_S`` CPU seconds: the run is
    reported as "slow" (one that may not end), the hard limit a little later kills it."""
    signal.signal(signal.SIGXCPU, _over_cpu)
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_S, CPU_S + 30))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(70)),
                    help="workload seeds (default 0-69)")
    ap.add_argument("--classes", action="store_true", help="each pool as 1-3 device classes (with_classes)")
    ap.add_argument("--preempt", action="store_true",
                    help="--classes with each class preemptible at even odds (with_preemption)")
    args = ap.parse_args(argv)
    laid = args.classes or args.preempt
    jobs = [(s, p, laid, args.preempt) for s in args.seeds for p in (CLASS_POLICIES if laid else POLICIES)]
    counts = Counter()
    with ProcessPoolExecutor(max_workers=2, max_tasks_per_child=1, initializer=limit_cpu) as ex:
        for seed, policy, outcome, detail in ex.map(run_one, jobs):
            counts[outcome] += 1
            if outcome in ("crash", "below-bound", "slow"):
                print(f"seed {seed}, {policy}: {outcome}: {detail}", flush=True)
    print(", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 1 if counts["crash"] or counts["below-bound"] else 0


if __name__ == "__main__":
    sys.exit(main())
