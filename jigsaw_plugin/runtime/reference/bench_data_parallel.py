"""What a second core buys the reference trainer's ``update_actor``: one process at one
torch thread, one process at two torch threads (what a 2-device stage runs today), and two
processes (data parallel: each computes half of a mini-batch's micro-batches, the
gradients summed in micro-batch order in the first, one optimizer step).

    .venv-cpu/bin/python -m jigsaw_plugin.runtime.reference.bench_data_parallel --repeats 5

The batch is shaped like the agentic pair's ``agent`` step (8 prompts x 4 samples of 40
prompt + ``--response`` tokens). Every round runs the three configurations one after
another (the order rotating), from the same weights; the data-parallel update must end
``torch.equal`` to the serial one (checked every round: the gradients are computed from
the same weights with one thread, and summed in index order, as micro_stage.py does).
Medians of wall seconds; a shared machine's load moves them, so the load is printed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

__all__ = ["main", "measure"]


def _worker(conn, model_dir: str, seed: int) -> None:
    """The second process: the same trainer; computes the micro-batches it is sent on the
    weights it is sent, and returns their gradients."""
    from jigsaw_plugin.runtime.reference import ReferenceTrainer

    trainer = ReferenceTrainer(model_dir, seed=seed, num_threads=1)
    while True:
        msg = conn.recv()
        if msg is None:
            return
        state, jobs = msg
        trainer.model.load_state_dict(state)
        out = []
        for index, samples, old, adv, ref, normalizer in jobs:
            st = trainer.micro_grad(index, samples, old, adv, ref, normalizer)
            out.append((index, st, trainer.take_gradient(index)))
        conn.send(out)


def _dp_update(trainer, conn, batch, old, adv, ref) -> dict:
    """``update_actor`` split over two processes: per mini-batch, the odd micro-batches go
    to the worker (with the current weights), the even ones run here; then one optimizer
    step over all of them in index order."""
    import numpy as np
    import torch

    from jigsaw_plugin.runtime.reference.microbatch import trained_tokens

    t0 = time.perf_counter()
    adv = np.asarray(adv, dtype=np.float32)
    plan = trainer.update_plan(len(batch))
    stats, norms, tokens = {}, [], 0
    for group in plan.groups():
        n_tok = trained_tokens(batch, [i for m in group for i in m.samples])
        tokens += n_tok
        jobs = [(m.index, [batch[i] for i in m.samples], old[list(m.samples)], adv[list(m.samples)],
                 None if ref is None else ref[list(m.samples)], n_tok) for m in group[1::2]]
        if jobs:
            conn.send(({k: v.detach().clone() for k, v in trainer.model.state_dict().items()}, jobs))
        for m in group[0::2]:
            idx = list(m.samples)
            stats[m.index] = trainer.micro_grad(m.index, [batch[i] for i in idx], old[idx], adv[idx],
                                                None if ref is None else ref[idx], n_tok)
        if jobs:
            for index, st, grads in conn.recv():
                stats[index] = st
                trainer.put_gradient(index, grads)
        norms.append(trainer.optimizer_step([m.index for m in group]))
    with torch.no_grad():
        return trainer.finish_update([stats[i] for i in sorted(stats)], norms, plan.mini_batches, tokens,
                                     time.perf_counter() - t0)


def measure(model_dir, repeats: int = 5, response_len: int = 300) -> dict:
    import torch

    from jigsaw_plugin.runtime.reference import ReferenceTrainer, grpo_advantages, low_id_reward
    from jigsaw_plugin.runtime.reference.bench_microbatch import _batch

    batch = [(p, r, g, [1] * len(r)) for p, r, g in _batch(prompt_len=40, response_len=response_len)]
    adv = grpo_advantages(low_id_reward().batch(batch), [s[2] for s in batch])
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_worker, args=(there, str(model_dir), 0), daemon=True)
    proc.start()
    times: dict[str, list] = {"1 process, 1 thread": [], "1 process, 2 threads": [], "2 processes": []}
    loads, equal = [], []
    try:
        for r in range(repeats):
            results = {}
            names = list(times)
            for name in names[r % 3:] + names[:r % 3]:
                trainer = ReferenceTrainer(str(model_dir), seed=0, num_threads=2 if "2 threads" in name else 1)
                old, ref = trainer.old_log_prob(batch), trainer.ref_log_prob(batch)
                t0 = time.perf_counter()
                if name == "2 processes":
                    torch.set_num_threads(1)
                    _dp_update(trainer, here, batch, old, adv, ref)
                else:
                    trainer.update_actor(batch, old, adv, ref)
                times[name].append(time.perf_counter() - t0)
                results[name] = [p.detach().clone() for p in trainer.model.parameters()]
            equal.append(all(torch.equal(a, b) for a, b in zip(results["1 process, 1 thread"],
                                                               results["2 processes"])))
            loads.append(round(os.getloadavg()[0], 1))
    finally:
        here.send(None)
        proc.join(10)
    return {"samples": len(batch), "response_len": response_len, "repeats": repeats,
            "update_actor_s": {k: statistics.median(v) for k, v in times.items()},
            "all_s": times, "speedup_2_processes": statistics.median(times["1 process, 1 thread"])
            / statistics.median(times["2 processes"]),
            "speedup_2_threads": statistics.median(times["1 process, 1 thread"])
            / statistics.median(times["1 process, 2 threads"]),
            "dp_equal_to_serial": all(equal), "load_1m": loads}


def main(argv=None) -> int:
    from jigsaw_plugin.runtime.ray_bench import _model_dir

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--response", type=int, default=300, help="response tokens per sample")
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args(argv)
    # as the Ray backend's trainer actors run (ray_bench.py): libgomp's spinning at barriers made
    # two threads ~6x slower than one on this loaded machine (15.1 s against 2.6 s, load 9.7)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    out = measure(_model_dir(0), args.repeats, args.response)
    print(json.dumps({k: v for k, v in out.items() if k != "all_s"}, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if out["dp_equal_to_serial"] else 1


if __name__ == "__main__":
    sys.exit(main())
