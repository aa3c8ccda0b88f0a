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

from common import BUNDLED, ROOT, md_table, measure_and_write, run_many

WORKLOADS = BUNDLED
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


def _parts(s: dict, above: float) -> str:
    """The decode's host-side step work and all-reduces (device-s), with their share of the
    decode above the ideal; "-" where the run did not record them."""
    host, allreduce = s.get("decode_host_device_s"), s.get("decode_allreduce_device_s")
    if host is None or allreduce is None:
        return "-"
    return f"{host:.0f} / {allreduce:.0f} ({(host + allreduce) / max(1e-9, above):.0%})"


def _parts_range(data: dict, policy: str) -> str:
    """The lowest and highest share of ``policy``'s decode above its ideal that its host
    work and all-reduces take, over the workloads that recorded them."""
    shares = []
    for name, r in data.items():
        s = r["rollout"]
        if name.endswith("/" + policy) and s.get("decode_host_device_s") is not None:
            above = s["decode_memory_bound_device_s"] + s["decode_compute_bound_device_s"] - s["ideal_decode_device_s"]
            shares.append((s["decode_host_device_s"] + s["decode_allreduce_device_s"]) / max(1e-9, above))
    return f"{min(shares):.0%}-{max(shares):.0%}" if shares else "n/a"


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
                     _parts(s, above), f"{mem / max(1e-9, mem + comp):.0%}", by_width or "-",
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
        "and the rest (weight loads, requests waiting behind a prefill). Of the decode, two parts of its steps "
        "the ideal leaves out (`CostModel.decode_step_parts`): the engine's host-side work each step "
        "(scheduler, sampler, launches: `decode_step_overhead_s` on each of the replica's devices, the GPU "
        "idle meanwhile) and the tensor-parallel all-reduces, with their share of the decode above the ideal. "
        "The ideal decode is the bound's (docs/simulator.md): every token at the "
        "engine's largest batch, or the weights once a step and each token's KV once, whichever is more.\n\n"
        + md_table(["workload", "policy", "makespan s", "gap device-s", "decode above ideal device-s (share of gap)",
                    "of which host step work / all-reduce device-s (share of the decode above ideal)",
                    "memory-bound share of decode", "memory-bound decode device-s by replica width",
                    "prefill / ideal device-s", "held empty device-s (share of gap)", "other held device-s"], rows)
        + "\n\nReading: on (a)-(d) jigsaw's decode above its ideal is about half of its whole gap, much "
        f"of it in memory-bound steps, and {_parts_range(data, 'jigsaw')} of it (verl-sync: "
        f"{_parts_range(data, 'verl-sync')}) is the engines' per-step host work and all-reduces. The ideal "
        "counts neither: a replica's host work can run under another engine's kernels on the same devices "
        "(co-location, docs/colocation.md), and one-device replicas run no all-reduce. Neither comes back "
        "for free: two co-located replicas' GPU work adds, so both decode slower (a tail on the chain that "
        "sets the makespan, as (f)'s SWE agent's few sequences a step on eight devices, ends later), and a "
        "bulk batch whose size its KV cache sets halves to share the devices, so each token reads the "
        "weights twice as often, which costs more than the host work hidden wherever reading a replica's "
        "weight shard takes longer than its 1.6 ms of host work (the 7B on one device 5.0 ms, the 32B on "
        "eight 2.7 ms, on H100); a tail on one device runs no all-reduce but decodes 2-4x slower than on "
        "eight (the 7B to the 32B). That share is the part of the gap the bound leaves unpriced rather than one a schedule "
        "recovers; what shrinks it is in the engine (CUDA graphs over several steps, scheduling overlapped "
        "with the GPU). The rest of the decode above the "
        "ideal: a synchronous step's last responses decode a few sequences a step however they are placed, "
        "where the ideal has every step's batch full (an order that knew the lengths, longest first, did not "
        "recover it: docs/simulator.md, stop 55); and the policy's trade: a thin tail re-sharded onto wider replicas (the tp4 and tp8 entries) "
        "ends the step on the critical path sooner at about twice the device-seconds a token "
        "(docs/simulator.md, `migration`); decoding them narrower saves device-seconds that no other "
        "pipeline could use at that moment (`max_widen` 1, on the build of stop 56: (a) 2084 s against 1979 s). On (e) long "
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
