"""Long-tail rollout migration by abort + resume (recompute), as one helper.

``migrate(src, dst, request_id, prompt_token_ids, max_tokens)`` aborts the request on
``src``, takes the tokens it had generated (the *prefix*), resubmits ``prompt + prefix``
with the remaining budget ``max_tokens - len(prefix)`` on ``dst``, and returns the full
generated sequence ``prefix + rest``. The destination recomputes the prefix's KV in one
prefill (no KV transfer).

Exactly once: the request's original ``generate`` on ``src`` ends with ``RequestAborted``
(it delivers no result), and ``migrate`` returns the one final result. If the request had
already finished on ``src`` when the abort arrived, its original ``generate`` returned the
result and ``migrate`` raises ``RequestNotFound`` without submitting anything. If the request
completed while the abort was in flight, the abort still wins: the prefix is the whole
output and nothing is resubmitted. If the resumed request is itself migrated later,
``migrate`` raises ``RequestAborted`` whose ``tokens`` are everything generated so far
(prefix included), and the later migration (called with ``prefix=`` those tokens)
returns the result.

``src`` and ``dst`` are ``VLLMEngine`` objects (or anything with their async
``generate``/``abort``), or Ray actor handles from ``make_engine_actor``, which are
wrapped in ``ActorEngine``.
"""

from __future__ import annotations

import sys

from jigsaw_plugin.runtime.engines.vllm_engine import ActorEngine, RequestAborted, RequestNotFound

__all__ = ["migrate", "as_engine", "RequestAborted", "RequestNotFound"]


def as_engine(obj):
    """``obj`` itself, or an ``ActorEngine`` around it if it is a Ray actor handle."""
    ray_actor = sys.modules.get("ray.actor")
    if ray_actor is not None and isinstance(obj, ray_actor.ActorHandle):
        return ActorEngine(obj)
    return obj


async def migrate(src, dst, request_id: str, prompt_token_ids, max_tokens: int, *, prefix=(),
                  dst_request_id: str | None = None, on_progress=None, greedy: bool = True) -> list[int]:
    """Move a running request from ``src`` to ``dst``; returns its full generated sequence.

    ``prompt_token_ids`` and ``max_tokens`` are the request's original ones; ``prefix`` the
    tokens generated before it was last resubmitted (empty for a first move), so the
    segment running on ``src`` was submitted with ``prompt + prefix`` and
    ``max_tokens - len(prefix)``. ``on_progress(n_tokens, token)`` is called for each token
    of the resumed segment, counting from the start of the whole generation.
    ``dst_request_id`` defaults to ``request_id`` (another engine: no clash).
    """
    src, dst = as_engine(src), as_engine(dst)
    before = list(prefix)
    segment = await src.abort(request_id, missing_ok=False)  # RequestNotFound: it had finished
    done = before + list(segment)
    remaining = int(max_tokens) - len(done)
    if remaining <= 0:
        return done[: int(max_tokens)]

    forward = None
    if on_progress is not None:
        def forward(n_tokens: int, token: int) -> None:
            on_progress(len(done) + n_tokens, token)

    rid = dst_request_id or request_id
    try:
        rest = await dst.generate(rid, list(prompt_token_ids) + done, remaining, greedy=greedy,
                                  on_progress=forward)
    except RequestAborted as e:  # moved again: report everything generated so far
        raise RequestAborted(request_id, done + list(e.tokens)) from None
    return done + list(rest)
