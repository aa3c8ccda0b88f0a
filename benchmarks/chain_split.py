"""Where the makespan's chain goes: the pipeline that finished last, its time from the
run's start to its finish split into generation, training, weight syncs and waiting
(``chain_split`` in every result JSON, ``core/bounds.py``), each beside its floor
(``critical_path_s`` in parts: ``Bounds.chains``).

    python3 benchmarks/chain_split.py            # measure (a)-(f), save, write the block
    python3 benchmarks/chain_split.py --render   # re-render the saved results
    python3 benchmarks/chain_split.py --quick    # (e) only; print, write nothing

The device-second breakdown (``gap_breakdown``) says where the pool's time above the
ideal went; this says where the last pipeline's chain did, the other half of the bound
(``makespan_lower_bound_s`` is the larger of the two): a chain part far above its floor
is a step that waited for generation, ran its passes on gangs narrower than the fastest,
or waited for devices. verl-sync and jigsaw (its defaults, seed 0, the default predictor).
Writes the block ``chain-split`` of docs/benchmarks.md and benchmarks/results/chain_split.json.
"""

from __future__ import annotations

import sys

from common import EXAMPLES, ROOT, md_table, measure_and_write, run_many

sys.path.insert(0, str(ROOT))
from jigsaw_plugin.bench.bundled import benchmark_workload  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "chain_split.json"
BLOCK = "chain-split"
KEYS = ("a", "b", "c", "d", "e", "f")
POLICIES = ("verl-sync", "jigsaw")
PARTS = ("generation", "training", "weight_sync")


def _slim(r: dict) -> dict:
    chains = r["chain_split"]
    last = max(chains, key=lambda name: chains[name]["finish_s"])
    return {"makespan_s": r["makespan_s"], "bounds": r["bounds"], "last": last, "chain": chains[last],
            "chains": chains}


def measure(keys) -> dict:
    jobs, where = [], []
    for k in keys:
        for policy in POLICIES:
            jobs.append((str(EXAMPLES / benchmark_workload(k).file), policy, None, 0))
            where.append((k, policy))
    data: dict = {}
    for (k, policy), r in zip(where, run_many(jobs)):
        data.setdefault(k, {})[policy] = _slim(r)
    return data


def _part(c: dict, part: str) -> str:
    return f"{c[f'{part}_s']:.0f} ({c[f'{part}_floor_s']:.0f})"


def render(data: dict) -> str:
    rows, gen_far, train_far = [], [], []
    for k, runs in data.items():
        for policy, r in runs.items():
            c = r["chain"]
            rows.append([f"({k})", policy, r["last"], f"{c['finish_s']:.0f}", f"{c['floor_s']:.0f}",
                         f"{r['bounds']['makespan_lower_bound_s']:.0f}",
                         *(_part(c, p) for p in PARTS), f"{c['waiting_s']:.0f}"])
        j = runs.get("jigsaw")
        if j is not None:
            c = j["chain"]
            above = {p: c[f"{p}_s"] - c[f"{p}_floor_s"] for p in PARTS}
            above["waiting"] = c["waiting_s"]
            worst = max(above, key=above.get)
            (gen_far if worst == "generation" else train_far if worst == "training" else []).append(
                f"({k}) +{above[worst]:.0f} s")
    reading = (f"The part of jigsaw's last chain furthest above its floor: generation on "
               f"{', '.join(gen_far) or 'none'}; training on {', '.join(train_far) or 'none'}. A generation "
               f"part above its floor is the steps' rollouts decoding their longest trajectories in batches "
               f"(and, in the bulk, behind others) where the floor decodes each alone at batch 1 on the widest "
               f"replica; a training part above its floor is passes on the gang the pool could spare, where "
               f"the floor runs each on its fastest gang of up to the whole pool. Both floors hold together "
               f"only if the pipeline had the pool to itself: the work bound prices the other side of that "
               f"trade.")
    return f"""## Where the makespan's chain goes (`benchmarks/chain_split.py`)

The pipeline that finished last, its time from the run's start to its finish split by
what of it ran (`chain_split` in every result JSON, `core/bounds.py`): each instant counted
once, as the first of generation (a rollout replica held, tool calls included), training
(a training-side stage, early passes included), a weight sync; else waiting (for devices,
or for its rewards); for an asynchronous pipeline, whose chain is its training, training
first. In brackets each part's floor: the pipeline's own chain in `critical_path_s` (a
synchronous step's longest trajectory at batch 1 on the widest replica, with its tool
calls and reward, or the step's generation and forward passes at their ideal over the
whole pool where that is longer, for an asynchronous pipeline only that of a step that
waits for the weight sync of the step `staleness + 1` before it; each update pass on its fastest gang of up to the whole pool,
with its fixed cost; the weight syncs). Simulated, seed 0, the default predictor; seconds.

{md_table(["workload", "policy", "last pipeline", "its finish s", "its chain floor s", "makespan lower bound s",
           "generation s (floor)", "training s (floor)", "weight sync s (floor)", "waiting s"], rows)}

Reading: {reading}

`python benchmarks/chain_split.py`
"""


def main() -> int:
    measure_and_write(BLOCK, RESULTS, measure, render, KEYS, ("e",))
    return 0


if __name__ == "__main__":
    sys.exit(main())
