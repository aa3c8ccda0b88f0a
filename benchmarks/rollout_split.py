"""Where the rollout's device-seconds go on the bundled workloads (a)-(f), verl-sync and
jigsaw: decode steps bound by their HBM reads (too few sequences for the devices' compute:
tails and thin batches), decode steps bound by their FLOPs, prefill (re-prefill after a move
included), time held with no request and the rest, beside the ideal decode and prefill
(``result["gap_breakdown"]["rollout"]``, ``core/bounds.rollout_split``). Writes the
``rollout-split`` block of docs/benchmarks.md and benchmarks/results/rollout_split.json.

    python benchmarks/rollout_split.py            # about 5 minutes on 2 cores
    python benchmarks/rollout_split.py --render   # re-render the saved results
    python benchmarks/rollout_split.py --quick    # (c) only, nothing written
"""

from __future__ import annotations

from common import ROOT, md_table, measure_and_write, run_many

WORKLOADS = {"a": "a_sync4_32gpu.yaml", "b": "b_sync8_64gpu.yaml", "c": "c_async2_16gpu.yaml",
             "d": "d_hetero_32gpu.yaml", "e": "e_dapo_longtail_32gpu.yaml", "f": "f_agentic_32gpu.yaml"}
POLICIES = ("verl-sync", "jigsaw")
OUT = ROOT / "benchmarks" / "results" / "rollout_split.json"


def _summary(r: dict) -> dict:
    g = r["gap_breakdown"]
    return {"makespan_s": r["makespan_s"], "gap_device_s": g["gap_device_s"],
            "rollout_above_ideal_device_s": g["rollout_above_ideal_device_s"], "rollout": g["rollout"]}


def measure(keys: tuple) -> dict:
    jobs = [(WORKLOADS[k], pol, None, 0) for k in keys for pol in POLICIES]
    runs = run_many(jobs)
    keys = [(k, pol) for k in keys for pol in POLICIES]
    return {f"{k}/{pol}": _summary(r) for (k, pol), r in zip(keys, runs)}


def render(data: dict) -> str:
    rows = []
    for name, r in data.items():
        key, pol = name.split("/")
        s, gap = r["rollout"], r["gap_device_s"]
        mem, comp = s["decode_memory_bound_device_s"], s["decode_compute_bound_device_s"]
        above = mem + comp - s["ideal_decode_device_s"]
        by_width = ", ".join(f"tp{w} {v['decode_memory_bound_device_s']:.0f}" for w, v in s["by_width"].items()
                             if v["decode_memory_bound_device_s"] >= 0.5)
        rows.append([f"({key})", pol, f"{r['makespan_s']:.0f}", f"{gap:.0f}", f"{above:.0f} ({above / gap:.0%})",
                     f"{mem / max(1e-9, mem + comp):.0%}", by_width or "-",
                     f"{s['prefill_device_s']:.0f} / {s['ideal_prefill_device_s']:.0f}",
                     f"{s['empty_device_s']:.0f} ({s['empty_device_s'] / gap:.0%})", f"{s['other_device_s']:.0f}"])
    return (
        "## Where the rollout's device-seconds go (`benchmarks/rollout_split.py`)\n\n"
        "Simulated, seed 0, default options and predictor. The rollout replicas' device-seconds "
        "(`gap_breakdown.rollout` in every simulated result JSON) by what they did: decode (above the "
        "bound's ideal decode, with its share of the whole gap between the run and the ideal "
        "device-seconds), and how much of the decode ran in steps bound by their HBM reads "
        "(`CostModel.decode_memory_bound`: the weights and KV take longer to read than the batch's FLOPs "
        "take to run: thin batches such as rollout tails, or long contexts), by replica width; prefill "
        "(re-prefill after a move included) against the ideal prefill; the time replicas were held with no "
        "request at all (their trajectories in tool calls, or the step's last responses decoding elsewhere); "
        "and the rest (weight loads, requests waiting behind a prefill). The ideal decode is the bound's (docs/simulator.md): every token at the "
        "engine's largest batch, or the weights once a step and each token's KV once, whichever is more.\n\n"
        + md_table(["workload", "policy", "makespan s", "gap device-s", "decode above ideal device-s (share of gap)",
                    "memory-bound share of decode", "memory-bound decode device-s by replica width",
                    "prefill / ideal device-s", "held empty device-s (share of gap)", "other held device-s"], rows)
        + "\n\nReading: on (a)-(d) jigsaw's decode above its ideal is about half of its whole gap, much "
        "of it in memory-bound steps. Part of that is the cost of not knowing lengths: a synchronous step's "
        "last responses decode a few sequences a step however they are placed, and only an order that knew "
        "the lengths (longest first) could keep every step's batch full, as the ideal decode assumes. The "
        "rest is the policy's trade: a thin tail re-sharded onto wider replicas (the tp4 and tp8 entries) "
        "ends the step on the critical path sooner at about twice the device-seconds a token "
        "(docs/simulator.md, `migration`); decoding them narrower saves device-seconds that no other "
        "pipeline could use at that moment (`max_widen` 1, on the build of stop 33: (a) 2060 s against 1984 s). On (e) long "
        "contexts make even full batches memory-bound (the KV reads the ideal counts). Held empty: verl-sync "
        "keeps every replica of a step until its last response (41% of its gap on (f)); jigsaw retires "
        "drained replicas, but keeps an agentic pipeline's last one for the next turns of trajectories in "
        "tool calls: on (f) the SWE agent's tp8 replicas sat empty for 5,596 device-seconds, in 650 waits, "
        "of which 23 longer than 5 s hold 3,139 (sandboxed test runs of about 73 s).\n\n"
        "`python benchmarks/rollout_split.py`\n")


def main() -> None:
    measure_and_write("rollout-split", OUT, measure, render, tuple(WORKLOADS), ("c",))


if __name__ == "__main__":
    main()
