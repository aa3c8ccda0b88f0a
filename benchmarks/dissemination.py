"""Weight dissemination on this machine: naive, chain (ECHO-2) and pull (RLAX), measured on
Ray with real buffers, beside the cost model's closed forms.

    .venv-cpu/bin/python benchmarks/dissemination.py            # measure (about 10 min at load ~40), fit, write
    .venv-cpu/bin/python benchmarks/dissemination.py --quick    # a small grid (about 1 min)
    .venv-cpu/bin/python benchmarks/dissemination.py --resume   # go on after an interrupted run
    .venv-cpu/bin/python benchmarks/dissemination.py --render   # re-render the saved JSON
    .venv-cpu/bin/python benchmarks/dissemination.py --large [--sizes 1024,2048] [--resume]
        # add the 1-2 GB rows to the saved JSON (about 10 min per size; under the real-run lock);
        # --counts 4 measures only those replica counts

Every cell is the median of 3 runs, the strategies interleaved run by run so they share
the machine's load. The per-message constants of the prediction are fitted in the same
run to naive and chain with one replica and no link (the only cells that are not
predictions); every other cell is predicted. A modelled WAN link holds each sender's
uplink for bytes / bandwidth and delivers latency later, on top of the real transfer
(docs/dissemination.md). Writes
benchmarks/results/dissemination.json and the ``dissemination`` block of docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from common import write_doc_block  # noqa: E402

from jigsaw_plugin.costmodel.dissemination import dissemination_price, fit_hop  # noqa: E402
from jigsaw_plugin.runtime.dissemination import STRATEGIES, DisseminationSpec, LinkSpec  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "dissemination.json"
PARTIAL = RESULTS.with_suffix(".partial.json")  # rows so far: --resume goes on from here
PARTIAL_LARGE = RESULTS.with_name("dissemination.large.partial.json")  # the same for --large
START, END = "<!-- dissemination:start -->", "<!-- dissemination:end -->"
MB = 1024 * 1024
REPEATS = 3
WAN = LinkSpec.from_gbit_s(5.0, latency_ms=10.0)  # a 5 Gbit/s, 10 ms inter-site link

# (size MB, replica counts, with the WAN link?). 512 MB stops at 4 replicas; the GB sizes are
# measured apart (--large, under the real-run lock): a first 1 GB run inside this grid, beside
# other users' runs, was stopped by Ray's out-of-memory killer (memory above 95% of the machine's).
FULL = [(8, (1, 2, 4, 8), False), (64, (1, 2, 4, 8), False), (256, (1, 2, 4, 8), False), (512, (1, 2, 4), False),
        (64, (1, 2, 4, 8), True), (256, (1, 2, 4, 8), True), (512, (1, 4), True)]
QUICK = [(8, (1, 2, 4), False), (32, (1, 2, 4), False), (32, (1, 4), True)]
# --large: GB-sized states, appended to the saved rows (their own session: load and free memory
# are recorded per row). A row is skipped, and says so, when the machine's available memory
# does not cover its estimate with LARGE_MARGIN to spare.
LARGE_SIZES_MB = (1024, 2048)
LARGE_COUNTS = (1, 2, 4)
GIB = 1024**3
LARGE_MARGIN = 4 * GIB


def large_grid(sizes_mb, counts=LARGE_COUNTS) -> list:
    return [(mb, tuple(counts), wan) for mb in sizes_mb for wan in (False, True)]


def row_extra_bytes(size: int, replicas: int) -> int:
    """What a row adds to the machine's memory beyond the trainer's buffer (already built):
    each replica's copy and two copies in the object store (one in flight, one being released)."""
    return size * (replicas + 2)


def available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable")


def chunk_for(size_bytes: int) -> int:
    """A sixteenth of the state, between 1 MB and 16 MB."""
    return int(min(16 * MB, max(MB, size_bytes // 16)))


def load_avg() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def measure(grid: list, partial: Path, large: bool = False) -> dict:
    import ray

    from jigsaw_plugin.runtime.dissemination import DisseminationGroup, SyntheticSource

    try:
        import torch  # noqa: F401  # real torch tensors where the environment has torch

        backend = "torch"
    except ImportError:
        backend = "numpy"
    largest = max(mb for mb, _, _ in grid) * MB
    # two versions of the largest state fit at once (one leaving, one being released)
    ray.init(num_cpus=2, object_store_memory=max(3 * GIB, 2 * largest + GIB), include_dashboard=False,
             log_to_driver=False, namespace="bench-dissemination")
    done = json.loads(partial.read_text()) if "--resume" in sys.argv and partial.exists() else {}
    free_start = done.get("free_g_start") or free_g()
    rows, load_start = done.get("rows", []), done.get("load_start", load_avg())
    skipped = done.get("skipped", [])
    have = {(r["size_bytes"], r["replicas"], r["wan"]) for r in rows}
    attempts = done.get("attempts", 0) + 1
    t_start = time.perf_counter() - done.get("wall_s", 0.0)
    with DisseminationGroup(max(max(counts) for _, counts, _ in grid)) as group:
        if backend == "torch" and not large:
            from jigsaw_plugin.runtime.tiny_model import tiny_qwen2_state_dict

            group.set_state(tiny_qwen2_state_dict(seed=0))  # the real tiny Qwen2, every strategy
            qwen = [group.run(DisseminationSpec(s, chunk_bytes=256 * 1024)) for s in STRATEGIES]
            tiny = {"bytes": qwen[0].total_bytes, "replicas": qwen[0].replicas,
                    "bit_identical": all(r.bit_identical for r in qwen)}
        else:
            tiny = None
        for size_mb, counts, wan in grid:
            size = size_mb * MB
            counts = [n for n in counts if (size, n, wan) not in have]
            if not counts:
                continue
            group.set_state(SyntheticSource(size, seed=size_mb, backend=backend))
            link = WAN if wan else None
            for n in counts:
                if large:  # the earlier rows' copies go first: available memory is then the row's
                    group.drop_replicas()
                need, free = row_extra_bytes(size, n), available_bytes()
                if large and need + LARGE_MARGIN > free:
                    skipped.append({"size_bytes": size, "replicas": n, "wan": wan, "need_bytes": need,
                                    "available_bytes": free, "load": load_avg()})
                    print(f"{size_mb:5d} MB x{n} wan={wan}: skipped, needs ~{need / GIB:.1f} GiB "
                          f"+ {LARGE_MARGIN / GIB:.0f} GiB margin, {free / GIB:.1f} GiB available", flush=True)
                    continue
                runs = {s: [] for s in STRATEGIES}
                for _ in range(REPEATS):
                    for s in STRATEGIES:
                        r = group.run(DisseminationSpec(s, chunk_bytes=chunk_for(size), link=link), replicas=n)
                        if not r.bit_identical:
                            raise SystemExit(f"{s} x{n} {size_mb} MB: a replica's checksum differs")
                        runs[s].append((r.seconds, r.trainer_seconds))
                        group.free_published()  # one version in the store at a time
                rows.append({"size_bytes": size, "replicas": n, "wan": wan, "chunk_bytes": chunk_for(size),
                             "runs": runs, "load": load_avg(), "available_gib": round(available_bytes() / GIB, 1),
                             "session": "large" if large else "base"})
                partial.write_text(json.dumps({"rows": rows, "load_start": load_start, "attempts": attempts,
                                               "skipped": skipped, "free_g_start": free_start,
                                               "wall_s": time.perf_counter() - t_start}))
                print(f"{size_mb:5d} MB x{n} wan={wan}: " + "  ".join(
                    f"{s} {statistics.median(x for x, _ in runs[s]):.3f}s" for s in STRATEGIES), flush=True)
    ray.shutdown()
    return {"backend": backend, "tiny_qwen2": tiny, "load_start": load_start, "load_end": load_avg(), "attempts": attempts,
            "wall_s": time.perf_counter() - t_start, "link": {"gbit_s": WAN.bandwidth_bytes_s * 8 / 1e9,
                                                              "latency_ms": WAN.latency_s * 1e3},
            "cpu": os.cpu_count(), "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
            "rows": rows, "skipped": skipped, "free_g_start": free_start,
            "free_g_end": free_g()}


def free_g() -> str:
    """``free -g``'s Mem line (total used free shared buff/cache available, GiB)."""
    out = subprocess.run(["free", "-g"], capture_output=True, text=True).stdout.splitlines()
    return " ".join(out[1].split()[1:]) if len(out) > 1 else "?"


def fit(data: dict):
    """o and beta of ``hop`` from the one-replica rows without a link: naive sends one
    message of S bytes, chain S / c messages of c bytes (the only rows not predicted)."""
    points = []
    for row in data["rows"]:  # the first session's rows only: the GB rows are all predictions
        if row["replicas"] == 1 and not row["wan"] and row.get("session", "base") == "base":
            chunks = DisseminationSpec("chain", chunk_bytes=row["chunk_bytes"]).chunks(row["size_bytes"])
            for strategy, messages in (("naive", 1), ("chain", chunks)):
                points.append((messages, row["size_bytes"], statistics.median(x for x, _ in row["runs"][strategy])))
    return fit_hop(points, parallel_hops=2, source="fitted in this run: naive x1 and chain x1, no link")


def render(data: dict) -> str:
    hop = fit(data)
    link = LinkSpec.from_gbit_s(data["link"]["gbit_s"], data["link"]["latency_ms"])
    out = [START, "## Weight dissemination on Ray (real transfers on CPU; docs/dissemination.md)", "",
           f"`{'.venv-cpu/bin/python' if data['backend'] == 'torch' else '.venv/bin/python'} benchmarks/dissemination.py`: "
           f"a trainer actor sends {data['backend']} float32 weights to N replica actors on this "
           f"{data['cpu']}-core machine; every cell is the median of {REPEATS} runs (strategies interleaved), "
           f"seconds until every replica holds the weights, with the cost model's prediction in brackets. "
           f"Every run checked every replica's sha256 against the trainer's (all identical). Per-hop "
           f"constants fitted in this run to naive x1 and chain x1 without link: overhead {hop.overhead_s * 1e3:.1f} ms, "
           f"{hop.bytes_per_s / 1e9:.2f} GB/s, 2 hops at once (2 cores); the x1 naive and chain cells without a link are the fit, every other cell is a prediction. "
           f"Load average {data['load_start']} at the start, {data['load_end']} at the end "
           f"(other engineers share the machine); {data['wall_s']:.0f} s of measuring in all"
           + (f", in {data['attempts']} attempts (`--resume`: Ray's out-of-memory monitor stopped the earlier ones "
              "when the shared machine's memory passed 95%)" if data.get("attempts", 1) > 1 else "") + ".", ""]
    if data.get("tiny_qwen2"):
        t = data["tiny_qwen2"]
        out += [f"The real tiny Qwen2 state dict ({t['bytes'] / MB:.1f} MB, torch tensors) to {t['replicas']} "
                f"replicas by each strategy: bit-identical on every replica: {t['bit_identical']}.", ""]
    for session, wan in ((s, w) for s in ("base", "large") for w in (False, True)):
        rows = [r for r in data["rows"] if r["wan"] == wan and r.get("session", "base") == session]
        if session == "large" and not wan:
            out += _large_sessions(data)
        if not rows:
            continue
        title = (f"With a modelled WAN link ({data['link']['gbit_s']:g} Gbit/s, {data['link']['latency_ms']:g} ms "
                 "per transfer, each sender its own uplink)" if wan else "Machine only (no modelled link)")
        large = session == "large"
        out += [f"**{'GB-sized states, ' + title[0].lower() + title[1:] if large else title}**", "",
                "| size | replicas | chunk | naive s | chain s | pull s | trainer held s (naive / chain / pull) | load |"
                + (" available GiB |" if large else ""),
                "|---|---|---|---|---|---|---|---|" + ("---|" if large else "")]
        for r in rows:
            cells, held = [], []
            for s in STRATEGIES:
                spec = DisseminationSpec(s, chunk_bytes=r["chunk_bytes"], link=link if wan else None)
                p = dissemination_price(spec, r["size_bytes"], r["replicas"], hop=hop)
                m = statistics.median(x for x, _ in r["runs"][s])
                cells.append(f"{m:.3f} ({p.seconds:.3f})")
                held.append(f"{statistics.median(t for _, t in r['runs'][s]):.3f}")
            size = f"{r['size_bytes'] / MB:.0f} MB"
            out.append(f"| {size} | {r['replicas']} | {r['chunk_bytes'] / MB:.0f} MB | " + " | ".join(cells)
                       + f" | {' / '.join(held)} | {r['load'].split()[0]} |"
                       + (f" {r['available_gib']} |" if large else ""))
        out.append("")
    out.append(END)
    return "\n".join(out)


def _large_sessions(data: dict) -> list[str]:
    """The GB rows' own sessions: load, free memory, rows skipped for memory."""
    out = []
    for s in data.get("large_sessions", []):
        skipped = "; ".join(f"{x['size_bytes'] / MB:.0f} MB x{x['replicas']}{' WAN' if x['wan'] else ''} "
                            f"(needs ~{x['need_bytes'] / GIB:.1f} GiB + {LARGE_MARGIN / GIB:.0f} GiB margin, "
                            f"{x['available_bytes'] / GIB:.1f} GiB available"
                            + ("; measured in a later session" if x.get("measured_later") else "") + ")"
                            for x in s.get("skipped", []))
        counts = f" --counts {','.join(map(str, s['counts']))}" if s.get("counts") else ""
        out += [f"GB-sized states ({', '.join(f'{mb / 1024:g} GB' for mb in s['sizes_mb'])}; "
                f"`--large --sizes {','.join(str(mb) for mb in s['sizes_mb'])}{counts}`, under the real-run lock), a later session "
                f"with the same fitted constants (every cell a prediction): load average {s['load_start']} at the "
                f"start, {s['load_end']} at the end; `free -g` (total used free shared buff/cache available) "
                f"{s['free_g_start']} at the start, {s['free_g_end']} at the end; {s['wall_s']:.0f} s of measuring. "
                "The trainer draws the state straight into its packed buffer, the registry drops each pulled "
                "version after the run and the object store is sized for two versions of the largest state, "
                "so a 1 GB row holds about (replicas + 3) GB. "
                + (f"Skipped for memory: {skipped}." if skipped else "No row was skipped for memory."), ""]
    return out


def measure_large(sizes_mb, counts=LARGE_COUNTS) -> dict:
    """The saved results with the GB-sized rows added (replacing earlier ones of the same
    size, count and link); the session's load, memory and skipped rows under ``large``."""
    data = json.loads(RESULTS.read_text())
    session = measure(large_grid(sizes_mb, counts), PARTIAL_LARGE, large=True)
    new = {(r["size_bytes"], r["replicas"], r["wan"]) for r in session["rows"]}
    for earlier in data.get("large_sessions", []):  # a row skipped then and measured now says so
        for x in earlier.get("skipped", []):
            x["measured_later"] = x.get("measured_later") or (x["size_bytes"], x["replicas"], x["wan"]) in new
    data["rows"] = [r for r in data["rows"] if (r["size_bytes"], r["replicas"], r["wan"]) not in new] + session["rows"]
    data.setdefault("large_sessions", []).append(
        {"sizes_mb": list(sizes_mb), **({"counts": list(counts)} if tuple(counts) != LARGE_COUNTS else {}),
         **{k: v for k, v in session.items()
                                        if k not in ("rows", "tiny_qwen2", "link", "cpu", "backend")}})
    return data


def main() -> None:
    if "--render" in sys.argv:
        data = json.loads(RESULTS.read_text())
    elif "--large" in sys.argv:
        sizes = LARGE_SIZES_MB
        if "--sizes" in sys.argv:
            sizes = tuple(int(x) for x in sys.argv[sys.argv.index("--sizes") + 1].split(","))
        counts = LARGE_COUNTS
        if "--counts" in sys.argv:
            counts = tuple(int(x) for x in sys.argv[sys.argv.index("--counts") + 1].split(","))
        data = measure_large(sizes, counts)
        RESULTS.write_text(json.dumps(data, indent=1))
        PARTIAL_LARGE.unlink(missing_ok=True)
    else:
        data = measure(QUICK if "--quick" in sys.argv else FULL, PARTIAL)
        if "--quick" not in sys.argv:
            RESULTS.parent.mkdir(parents=True, exist_ok=True)
            RESULTS.write_text(json.dumps(data, indent=1))
        PARTIAL.unlink(missing_ok=True)
    hop = fit(data)
    print(f"fitted hop: overhead {hop.overhead_s:.4f} s, {hop.bytes_per_s:.3e} B/s")
    block = render(data)
    if "--quick" not in sys.argv:
        write_doc_block("dissemination", block)
    print(block)


if __name__ == "__main__":
    main()
