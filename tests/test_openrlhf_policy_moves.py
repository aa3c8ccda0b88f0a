"""OpenRLHF's rollout carrying out a coordinator policy's chosen migrations
(``adapters/openrlhf/policy_moves.py``): jigsaw's real ``Router`` over emulated engines
(vLLM cannot run in the unit-test environment), commands driven by hand."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace as Cmd

from jigsaw_plugin.adapters.openrlhf.policy_moves import DROPPED, MOVED, PolicyMoves
from jigsaw_plugin.runtime.emulated import EmulatedEngine, next_token
from jigsaw_plugin.runtime.router import Router


def expected(prompt: list[int], n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        out.append(next_token(prompt + out))
    return out


async def _until(cond, timeout_s: float = 5.0):
    t = 0.0
    while not cond():
        await asyncio.sleep(0.002)
        t += 0.002
        assert t < timeout_s, "condition not reached"


def test_policy_moves_requests_keep_their_prefix_and_the_emptied_engine_goes_back():
    async def main():
        events, released = [], []
        router = Router({0: EmulatedEngine(time_scale=2.0), 1: EmulatedEngine(time_scale=2.0)},
                        on_event=lambda name, **kw: events.append((name, kw)))
        moves = PolicyMoves(router, released.append)
        prompts = {f"r{i}": [i + 1, 2, 3] for i in range(4)}
        tasks = {rid: asyncio.ensure_future(router.generate(rid, p, 60)) for rid, p in prompts.items()}
        await _until(lambda: all(len(r.live) >= 5 for i in router.replicas() for r in router.records_on(i))
                     and sum(len(router.records_on(i)) for i in router.replicas()) == 4)
        on1 = sorted(r.request_id for r in router.records_on(1))
        assert len(on1) == 2  # least in flight: two per engine
        out = await moves.carry_out([Cmd(request_id=rid, src_server=1, dst_server=0) for rid in on1])
        assert [o.status for o in out] == [MOVED, MOVED]
        assert 1 not in router.live_replicas()  # emptied by the policy: takes no new request
        await _until(lambda: not router.records_on(1))
        assert moves.release_emptied() == [1] and released == [1]
        assert router.replicas() == [0]
        results = {rid: await t for rid, t in tasks.items()}
        # every request once, at its full length, the same tokens as without the move
        assert results == {rid: expected(p, 60) for rid, p in prompts.items()}
        migrated = [kw for name, kw in events if name == "migrated"]
        assert sorted(kw["request_id"] for kw in migrated) == on1
        assert all(kw["src_replica"] == 1 and kw["dst_replica"] == 0 and kw["generated_tokens"] >= 5
                   for kw in migrated)

    asyncio.run(main())


def test_a_partial_move_keeps_the_source_on_and_stale_commands_are_dropped_with_a_reason():
    async def main():
        router = Router({0: EmulatedEngine(time_scale=2.0), 1: EmulatedEngine(time_scale=2.0)})
        moves = PolicyMoves(router, lambda i: None)
        tasks = [asyncio.ensure_future(router.generate(f"r{i}", [i + 1], 40)) for i in range(4)]
        await _until(lambda: sum(len(router.records_on(i)) for i in router.replicas()) == 4)
        a, b = sorted(r.request_id for r in router.records_on(1))
        out = await moves.carry_out([
            Cmd(request_id=a, src_server=1, dst_server=0),  # one of two: the engine stays on
            Cmd(request_id="gone", src_server=1, dst_server=0),  # finished before the command came
            Cmd(request_id=b, src_server=1, dst_server=7),  # no such engine on
        ])
        assert [(o.request_id, o.status) for o in out] == [(a, MOVED), ("gone", DROPPED), (b, DROPPED)]
        assert "not running" in out[1].reason and "engine 7 is not on" in out[2].reason
        assert 1 in router.live_replicas() and moves.release_emptied() == []
        assert [len(x) for x in await asyncio.gather(*tasks)] == [40] * 4

    asyncio.run(main())


def test_two_engines_emptied_into_each_other_keep_one_on():
    async def main():
        router = Router({0: EmulatedEngine(time_scale=2.0), 1: EmulatedEngine(time_scale=2.0)})
        moves = PolicyMoves(router, lambda i: None)
        tasks = [asyncio.ensure_future(router.generate(f"r{i}", [i + 1], 30)) for i in range(2)]
        await _until(lambda: all(router.records_on(i) for i in (0, 1)))
        (x,), (y,) = ([r.request_id for r in router.records_on(i)] for i in (0, 1))
        await moves.carry_out([Cmd(request_id=x, src_server=0, dst_server=1),
                               Cmd(request_id=y, src_server=1, dst_server=0)])
        assert router.live_replicas() == [0, 1]  # each receives: neither is switched off
        assert [len(t) for t in await asyncio.gather(*tasks)] == [30, 30]

    asyncio.run(main())
