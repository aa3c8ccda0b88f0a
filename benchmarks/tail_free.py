"""Each bundled workload beside its tail-free variant: how much of the gap jigsaw recovers
when no response, turn or tool call is longer than its pipeline's mean.

    python3 benchmarks/tail_free.py            # measure (a)-(d), save, write the block
    python3 benchmarks/tail_free.py --render   # re-render the saved results
    python3 benchmarks/tail_free.py --quick    # (a) only; print, write nothing

jigsaw's mechanisms aim at rollout tails (consolidation, re-sharding, early passes while a
tail decodes). The variant takes them away: every per-request figure of every pipeline
(prompt, response, observation lengths, turns, tool and reward latencies) becomes a
constant at its distribution's mean (turns rounded to a whole number, at least one), so
each step's responses end together. If the share of the gap jigsaw recovers rose without
tails, the tails would be what holds it back; where it does not, the rest of the gap lies
elsewhere (stage boundaries, training passes' fixed costs, devices a finished rollout lets
go). verl-sync and jigsaw (its defaults, seed 0, the default predictor) on both; each
figure against its own run's bound. Writes the block ``tail-free`` of docs/benchmarks.md
and benchmarks/results/tail_free.json.
"""

from __future__ import annotations

import collections
import copy
import sys

import yaml
from common import EXAMPLES, ROOT, md_table, measure_and_write, run_many

sys.path.insert(0, str(ROOT))
from jigsaw_plugin.bench.bundled import benchmark_workload  # noqa: E402
from jigsaw_plugin.workload.distributions import build_distribution  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "tail_free.json"
BLOCK = "tail-free"
KEYS = ("a", "b", "c", "d")
POLICIES = ("verl-sync", "jigsaw")
# the four parts of jigsaw's gap (``gap_breakdown`` fractions), as the reading names them
PARTS = {"idle": "idle devices", "rollout_above_ideal": "rollout above its ideal",
         "training_above_ideal": "training above its ideal", "weight_sync": "weight syncs"}
# per-request figures of a pipeline spec, and whether each is a whole number
PER_REQUEST = {"prompt_len": True, "response_len": True, "observation_len": True, "turns": True,
               "tool_latency_s": False}


def _const(d, field: str, whole: bool) -> dict:
    mean = build_distribution(d, field, base_dir=EXAMPLES).mean()
    return {"dist": "const", "value": max(1, round(mean)) if whole else float(mean)}


def tail_free_spec(spec: dict) -> dict:
    """``spec`` with each pipeline's per-request figures constant at their means."""
    out = copy.deepcopy(spec)
    for i, p in enumerate(out["pipelines"]):
        for key, whole in PER_REQUEST.items():
            if key in p:
                p[key] = _const(p[key], f"pipelines[{i}].{key}", whole)
        reward = p.get("reward")
        if isinstance(reward, dict) and "latency_s" in reward:
            reward["latency_s"] = _const(reward["latency_s"], f"pipelines[{i}].reward.latency_s", False)
    return out


def _slim(r: dict) -> dict:
    g = r["gap_breakdown"]
    idle = r.get("idle_gaps", {}).get("by_transition", {})
    top = max(idle.items(), key=lambda kv: kv[1]) if idle else ("-", 0.0)
    return {"makespan_s": r["makespan_s"], "bound_s": r["bounds"]["makespan_lower_bound_s"],
            "gap_device_s": g["gap_device_s"], "fractions": g["fractions"], "top_idle": list(top)}


def measure(keys) -> dict:
    jobs, where = [], []
    for k in keys:
        spec = yaml.safe_load((EXAMPLES / benchmark_workload(k).file).read_text())
        for variant, s in (("as bundled", spec), ("tail-free", tail_free_spec(spec))):
            for policy in POLICIES:
                jobs.append((s, policy, None, 0))
                where.append((k, variant, policy))
    data: dict = {}
    for (k, variant, policy), r in zip(where, run_many(jobs)):
        data.setdefault(k, {}).setdefault(variant, {})[policy] = _slim(r)
    return data


def render(data: dict) -> str:
    rows, less, more, largest = [], [], [], {}
    top = collections.defaultdict(list)  # largest idle place -> workloads
    for k, variants in data.items():
        recovered = {}
        for variant, runs in variants.items():
            v, j = runs["verl-sync"], runs["jigsaw"]
            bound = j["bound_s"]
            gap = v["makespan_s"] - bound
            recovered[variant] = (v["makespan_s"] - j["makespan_s"]) / gap if gap > 0 else None
            f = j["fractions"]
            name, dev_s = j["top_idle"]
            rows.append([f"({k})", variant, f"{v['makespan_s']:.0f}", f"{j['makespan_s']:.0f}", f"{bound:.0f}",
                         f"{v['makespan_s'] / j['makespan_s']:.2f}x",
                         f"{recovered[variant]:.0%}" if recovered[variant] is not None else "-",
                         " / ".join(f"{f[x]:.0%}" for x in ("idle", "rollout_above_ideal", "training_above_ideal",
                                                             "weight_sync")),
                         f"{name} {dev_s:.0f}"])
        a, b = recovered.get("as bundled"), recovered.get("tail-free")
        if a is not None and b is not None:
            (less if b <= a else more).append(f"({k}) {a:.0%} -> {b:.0%}")
        if "tail-free" in variants:
            j = variants["tail-free"]["jigsaw"]
            part = max(PARTS, key=lambda x: j["fractions"][x])
            largest.setdefault(part, []).append(f"({k}) {j['fractions'][part]:.0%}")
            top[j["top_idle"][0]].append(f"({k})")
    where = "; ".join(f"{PARTS[part]} on {', '.join(ks)}" for part, ks in largest.items())
    reading = (f"Without tails jigsaw recovers less of the gap on {', '.join(less) or 'none'}"
               f"{'; more on ' + ', '.join(more) if more else ''}. Without them the largest part of its gap is "
               f"{where}.")
    if top["rollout->old_log_prob"]:
        reading += (f" Idle devices wait most between a rollout and the log-prob pass on "
                    f"{', '.join(top['rollout->old_log_prob'])}: the devices of a replica that finished wait for "
                    f"the step's last trajectories (a replica admits what its KV cache holds, so its batches end "
                    f"one after another even when every response has the same length; early passes run once a "
                    f"rollout is down to its tail, and off the critical path only on the pipeline's own home) and "
                    f"for the pass's gang to form.")
    if top["rollout->rollout"]:
        reading += (f" Idle devices wait most between two rollout replicas on "
                    f"{', '.join(top['rollout->rollout'])}: an agent's turns end together, its replicas empty into tool calls at once, and off the job set's critical "
                    f"path the empty ones are retired and the next turns packed onto the rest "
                    f"(`keep_between_turns` keeps them only for the critical pipeline, docs/simulator.md).")
    return f"""## Without tails (`benchmarks/tail_free.py`)

Each workload beside its tail-free variant: every per-request figure of every pipeline
(prompt, response and observation lengths, turns, tool and reward latencies) a constant
at its distribution's mean (turns rounded), so a step's responses end together and no
mechanism aimed at rollout tails has anything to do. Simulated, seed 0, jigsaw with its
defaults and the default predictor; each run against its own bound (docs/simulator.md).
jigsaw's gap: its device-seconds above the ideal split as in the table above (idle /
rollout above its ideal / training above its ideal / weight syncs), and the largest place
its idle devices wait, as (task before) -> (task after), in device-seconds (`idle_gaps`).

{md_table(["workload", "variant", "verl-sync s", "jigsaw s", "lower bound s", "jigsaw / verl-sync",
           "gap recovered", "jigsaw's gap: idle / rollout / training / sync", "largest idle"], rows)}

Reading: {reading}

`python benchmarks/tail_free.py`
"""


def main() -> int:
    measure_and_write(BLOCK, RESULTS, measure, render, KEYS, ("a",))
    return 0


if __name__ == "__main__":
    sys.exit(main())
