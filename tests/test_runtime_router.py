"""The request router over EMULATED engines (no vLLM here): dispatch, migration, resizing,
faults. The same router drives the real vLLM engines in integration_tests/."""

import asyncio
import random

import pytest

from jigsaw_plugin.costmodel import CostModel, hardware_profile, model_profile
from jigsaw_plugin.runtime.emulated import EmulatedEngine, RequestAborted, next_token
from jigsaw_plugin.runtime.router import RequestRecord, Router, RouterError


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
        moved = await r.drain_to(0)
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
        first = r.trajectory_replica("traj")
        await r.generate("t1", [1, 2], 3, sticky="traj")
        assert r.trajectory_replica("traj") == first
        with pytest.raises(RouterError, match="not in flight"):
            await r.migrate("nope", 0)
        await r.drain_to(0)
        await r.remove_replica(1)  # the older name of drain_to
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


# ---- the public replica API, drain_to, and the migrated event's token count ----------------
class _RemoteLike:
    """TEST DOUBLE around the EMULATED engine for an engine in another process (a Ray actor):
    its progress callbacks never arrive, and an aborted ``generate`` ends ``unwind_s`` after
    ``abort`` has returned (the aborted call's answer comes back late)."""

    def __init__(self, unwind_s: float = 0.0):
        self.inner, self.unwind_s = EmulatedEngine(time_scale=1.0), unwind_s  # 1 ms per decode step
        self.prompts: list[tuple[str, int]] = []  # (segment id, prompt length)
        self.aborts: list[str] = []

    async def generate(self, request_id, prompt_token_ids, max_tokens, on_progress=None, **sampling):
        self.prompts.append((request_id, len(prompt_token_ids)))
        try:
            return await self.inner.generate(request_id, prompt_token_ids, max_tokens, **sampling)
        except RequestAborted:
            await asyncio.sleep(self.unwind_s)
            raise

    async def abort(self, request_id):
        self.aborts.append(request_id)
        return await self.inner.abort(request_id)


def test_public_replica_api():
    async def main():
        r = Router(engines(2, scale=0.2))
        assert r.replicas() == [0, 1] and r.live_replicas() == [0, 1]
        with pytest.raises(RouterError, match=r"replica 7 is not attached; attached: \[0, 1\]"):
            r.engine(7)
        rec = RequestRecord("q", [1], 5, sticky="traj")
        assert r.choose_replica(rec) == 0 and r.choose_replica(rec, exclude={0}) == 1
        r.acquire(0, sticky="traj")  # an externally dispatched request (verl's balancer)
        assert r.load(0) == 1 and r.trajectory_replica("traj") == 0
        assert r.choose_replica(RequestRecord("other", [1], 5, sticky=None)) == 1  # least in flight
        r.mark_retiring(0)
        assert r.live_replicas() == [1] and r.choose_replica(rec) == 1  # sticky only to a live replica
        with pytest.raises(RouterError, match="replica 0 is retiring"):
            r.acquire(0)
        r.unmark_retiring(0)
        assert r.choose_replica(rec) == 0
        with pytest.raises(RouterError, match=r"replica 0 still has 1 request\(s\) in flight"):
            r.detach_replica(0)
        r.release_slot(0)
        r.release_slot(0)  # never below zero
        assert r.load(0) == 0 and r.clear_sticky() == 1 and r.trajectory_replica("traj") is None
        task = asyncio.create_task(r.generate("g", [3], 60, sticky="t2"))
        await wait_until(lambda: r.records_on(0) or r.records_on(1))
        where = r.trajectory_replica("t2")
        assert [x.request_id for x in r.records_on(where)] == ["g"] and r.records_on(1 - where) == []
        r.detach_replica(1 - where)
        assert r.replicas() == [where] and r.trajectory_replica("t2") == where
        assert await task == reference([3], 60)
        r.detach_replica(where)
        assert r.replicas() == [] and r.records_on(where) == []
        with pytest.raises(RouterError, match="no live replica for request q"):
            r.choose_replica(rec)

    run(main())


def test_drain_to_moves_each_request_exactly_once_even_when_aborts_unwind_late():
    events = []

    async def main():
        es = {i: _RemoteLike(unwind_s=0.05) for i in range(3)}
        r = Router(es, on_event=lambda name, **kw: events.append((name, kw)))
        tasks = [asyncio.create_task(r.generate(f"q{i}", [i], 300)) for i in range(6)]
        await wait_until(lambda: len(r.records_on(0)) == 2 and all(r.records_on(i) for i in range(3)))
        await asyncio.sleep(0.03)  # tokens are generated; the router sees none (no progress callbacks)
        on_src = sorted(x.request_id for x in r.records_on(0))
        with pytest.raises(RouterError, match=r"target replica 0 is not live"):
            await r.drain_to(0, target=0)
        first = asyncio.create_task(r.drain_to(0, target=1))
        await wait_until(lambda: len(es[0].aborts) == 2)
        # The aborted segments are still unwinding: a second drain and the same moves again
        # (as a controller's next poll would ask) must not abort anything twice.
        second = asyncio.create_task(r.drain_to(0))
        for rid in on_src:
            await r.migrate(rid, 1)
        assert await first == 2 and await second == 0
        assert 0 not in r.replicas() and r.records_on(0) == []
        assert sorted(x.request_id for x in r.records_on(1) if x.request_id in on_src) == on_src  # resumed there
        with pytest.raises(RouterError, match="replica 0 is not attached"):
            await r.drain_to(0)
        outs = await asyncio.gather(*tasks)
        return es, on_src, outs

    es, on_src, outs = run(main())
    assert outs == [reference([i], 300) for i in range(6)]  # nothing lost or duplicated
    assert sorted(es[0].aborts) == sorted(f"{rid}#1" for rid in on_src)  # one abort per request
    moved = [kw for n, kw in events if n == "migrated"]
    assert sorted(m["request_id"] for m in moved) == on_src
    assert all(m["src_replica"] == 0 and m["dst_replica"] == 1 for m in moved)


def test_drain_to_needs_another_live_replica():
    async def main():
        r = Router(engines(1, scale=0.2))
        task = asyncio.create_task(r.generate("q", [1], 50))
        await wait_until(lambda: r.records_on(0))
        with pytest.raises(RouterError, match=r"drain_to\(0\): no other live replica"):
            await r.drain_to(0)
        assert r.live_replicas() == [0]  # refused before anything changed
        return await task

    assert run(main()) == reference([1], 50)


def test_migrated_event_counts_the_aborted_segment_s_tokens_without_progress_callbacks():
    events = []

    async def main():
        es = {i: _RemoteLike() for i in range(2)}
        r = Router(es, on_event=lambda name, **kw: events.append((name, kw)))
        task = asyncio.create_task(r.generate("long", [7, 8, 9], 300))
        await wait_until(lambda: r.records_on(0) or r.records_on(1))
        await asyncio.sleep(0.03)
        src = 0 if r.records_on(0) else 1
        assert r.records_on(src)[0].live == []  # a remote engine's progress never reaches the router
        await r.migrate("long", 1 - src)
        return es, src, await task

    es, src, out = run(main())
    assert out == reference([7, 8, 9], 300)
    (moved,) = [kw for n, kw in events if n == "migrated"]
    resumed_prompt = dict(es[1 - src].prompts)["long#2"]
    assert moved["generated_tokens"] == resumed_prompt - 3 > 0  # exactly the prefix it resumed with
