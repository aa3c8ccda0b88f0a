"""The request router over EMULATED engines (no vLLM here): dispatch, migration, resizing,
faults. The same router drives the real vLLM engines in integration_tests/."""

import asyncio
import random

import pytest

from jigsaw_plugin.costmodel import CostModel, hardware_profile, model_profile
from jigsaw_plugin.runtime.emulated import EmulatedEngine, next_token
from jigsaw_plugin.runtime.router import Router, RouterError


def reference(prompt, n):
    out = []
    for _ in range(n):
        out.append(next_token(prompt + out))
    return out


def engines(k, scale=1e-3):
    cost = CostModel(hardware_profile("h100"))
    return {i: EmulatedEngine(cost, model_profile("qwen2.5-1.5b"), time_scale=scale) for i in range(k)}


def run(coro):
    return asyncio.run(coro)


async def wait_until(cond, timeout=10.0):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.001)


def test_least_in_flight_dispatch_and_exact_lengths():
    async def main():
        r = Router(engines(3))
        reqs = [(f"q{i}", [i, i + 1], 5 + 3 * i) for i in range(9)]
        outs = await asyncio.gather(*(r.generate(q, p, n) for q, p, n in reqs))
        for (q, p, n), out in zip(reqs, outs):
            assert out == reference(p, n)
        return r

    r = run(main())
    assert r.finished == 9 and not r.requests
    assert sum(e.steps > 0 for e in r.engines.values()) == 3  # all replicas were used


def test_migration_keeps_prefix_and_finishes_exactly_once():
    events = []

    async def main():
        r = Router(engines(2), on_event=lambda name, **kw: events.append((name, kw)))
        task = asyncio.create_task(r.generate("long", [7, 8, 9], 200))
        await wait_until(lambda: "long" in r.requests and len(r.requests["long"].live) >= 50)
        src = r.requests["long"].replica
        await r.migrate("long", 1 - src)
        return await task

    out = run(main())
    assert out == reference([7, 8, 9], 200)  # greedy: identical with and without the move
    assert [n for n, _ in events].count("finished") == 1
    moved = [kw for n, kw in events if n == "migrated"]
    assert len(moved) == 1 and moved[0]["generated_tokens"] >= 50


def test_many_migrations_lose_and_duplicate_nothing():
    async def main():
        r = Router(engines(4))
        rng = random.Random(0)
        reqs = {f"q{i}": ([i], rng.randint(20, 120)) for i in range(40)}
        tasks = {q: asyncio.create_task(r.generate(q, p, n)) for q, (p, n) in reqs.items()}
        for _ in range(60):
            await asyncio.sleep(0.002)
            live = [q for q in list(r.requests) if r.requests[q].replica is not None]
            if live:
                q = rng.choice(live)
                await r.migrate(q, rng.choice([i for i in r.live_replicas() if i != r.requests[q].replica]))
        outs = {q: await t for q, t in tasks.items()}
        return r, reqs, outs

    r, reqs, outs = run(main())
    assert set(outs) == set(reqs)
    for q, (p, n) in reqs.items():
        assert outs[q] == reference(p, n)
    assert r.finished == len(reqs)


def test_resizing_adds_and_removes_replicas_mid_flight():
    async def main():
        es = engines(3, scale=0.2)
        r = Router({0: es[0]})
        tasks = [asyncio.create_task(r.generate(f"q{i}", [i], 80)) for i in range(6)]
        await wait_until(lambda: len(r.requests) == 6 and all(len(x.live) >= 5 for x in r.requests.values()))
        r.add_replica(1, es[1])
        r.add_replica(2, es[2])
        more = [asyncio.create_task(r.generate(f"m{i}", [100 + i], 30)) for i in range(6)]
        await wait_until(lambda: r.load(1) + r.load(2) >= 6)
        moved = await r.remove_replica(0)
        outs = await asyncio.gather(*tasks, *more)
        return r, moved, outs

    r, moved, outs = run(main())
    assert moved > 0 and 0 not in r.engines
    assert outs[:6] == [reference([i], 80) for i in range(6)]
    assert outs[6:] == [reference([100 + i], 30) for i in range(6)]


def test_a_dead_replica_s_requests_finish_elsewhere():
    async def main():
        es = engines(2, scale=0.2)
        r = Router(es)
        tasks = [asyncio.create_task(r.generate(f"q{i}", [i], 100)) for i in range(8)]
        await wait_until(lambda: len(r.requests) == 8 and all(len(x.live) >= 10 for x in r.requests.values()))
        assert r.load(0) == 4
        es[0].kill()
        return await asyncio.gather(*tasks), r

    outs, r = run(main())
    assert outs == [reference([i], 100) for i in range(8)]
    assert r.live_replicas() == [1]


def test_sticky_sessions_and_errors():
    async def main():
        r = Router(engines(2))
        await r.generate("t0", [1], 3, sticky="traj")
        first = r._sticky["traj"]
        await r.generate("t1", [1, 2], 3, sticky="traj")
        assert r._sticky["traj"] == first
        with pytest.raises(RouterError, match="not in flight"):
            await r.migrate("nope", 0)
        await r.remove_replica(0)
        await r.remove_replica(1)
        with pytest.raises(RouterError, match="no live replica"):
            await r.generate("x", [1], 2)

    run(main())


class _SeenSampling(EmulatedEngine):
    """Records the sampling keywords each segment reached the engine with."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.seen = []

    async def generate(self, request_id, prompt_token_ids, max_tokens, on_progress=None, **sampling):
        self.seen.append((request_id, sampling))
        return await super().generate(request_id, prompt_token_ids, max_tokens, on_progress=on_progress, **sampling)


def test_sampling_keywords_reach_every_segment_with_a_fresh_seed_after_a_move():
    cost = CostModel(hardware_profile("h100"))
    pair = {i: _SeenSampling(cost, model_profile("qwen2.5-1.5b"), time_scale=1e-3) for i in range(2)}

    async def main():
        r = Router(pair)
        with pytest.raises(RouterError, match=r"sampling keys \['top_k'\] are not supported; allowed: greedy"):
            await r.generate("bad", [1], 3, sampling={"top_k": 5})
        task = asyncio.create_task(
            r.generate("s", [1, 2], 120, sampling={"greedy": False, "temperature": 0.7, "sampling_seed": 11}))
        await wait_until(lambda: "s" in r.requests and len(r.requests["s"].live) >= 20)
        await r.migrate("s", 1 - r.requests["s"].replica)
        return await task

    assert len(run(main())) == 120
    seen = sorted(s for e in pair.values() for s in e.seen)
    assert [rid for rid, _ in seen] == ["s#1", "s#2"]
    assert seen[0][1] == {"greedy": False, "temperature": 0.7, "sampling_seed": 11}
    assert seen[1][1]["temperature"] == 0.7 and seen[1][1]["sampling_seed"] != 11
