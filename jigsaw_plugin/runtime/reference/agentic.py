"""The agentic reference pipeline's outside world: tool calls and a sandboxed reward over HTTP.

``LiveExecutor(..., tools=AgenticTools(ToolClient(url)))`` sends, for every turn of an
agentic trajectory but the last, the context so far to the tool server's ``/tool``
endpoint and appends the observation it answers before the next turn; and, for a
pipeline whose ``reward.kind`` is ``sandbox``, each finished trajectory's generated tokens
to ``/reward``, where the check runs in a subprocess (runtime/tool_server.py). While a
trajectory waits, the engine serves the others: what is left idle is the time
multiplexing exists to fill.

The latencies sent are the workload sampler's draws (so both policies of an A/B and the
simulator see the same ones); the server sleeps them. ``SandboxReward`` hands the stage
runner (``ReferenceStageRunner(reward=...)``) the rewards the sandbox returned, and the
rule reward (reward.py) for samples of pipelines without a sandbox.

Pure Python: no torch, no Ray.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from jigsaw_plugin.runtime.reference.reward import low_id_reward

__all__ = ["AgenticTools", "SandboxReward", "ToolWait"]


@dataclass(frozen=True)
class ToolWait:
    """One call to the tool server as the trajectory saw it."""

    pipeline: str
    request_id: str
    turn: int | None  # None: the reward call
    kind: str  # "tool" | "reward"
    latency_s: float  # what the server waited (the workload's draw)
    wall_s: float  # the trajectory's wait, HTTP included
    end_s: float  # time.perf_counter() at the answer


@dataclass
class AgenticTools:
    """The ``tools`` of ``LiveExecutor``: a ``ToolClient`` plus what it saw."""

    client: object  # runtime.tool_server.ToolClient
    waits: list = field(default_factory=list)  # ToolWait, in answer order
    # (prompt tuple, response tuple) -> the sandbox's rewards not yet used (a list: two samples
    # of one prompt may, rarely, generate the same tokens)
    sandbox_rewards: dict = field(default_factory=dict)

    async def tool_call(self, pipeline: str, request_id: str, turn: int, context, latency_s: float,
                        observation_tokens: int) -> list[int]:
        reply = await self.client.tool(pipeline, request_id, int(turn), [int(t) for t in context],
                                       latency_s=float(latency_s), observation_tokens=int(observation_tokens))
        self.waits.append(ToolWait(pipeline, request_id, int(turn), "tool", reply.latency_s, reply.wall_s,
                                   time.perf_counter()))
        return list(reply.observation)

    async def reward(self, pipeline: str, step: int, request_id: str, prompt, response, mask,
                     latency_s: float) -> float:
        reply = await self.client.reward(pipeline, request_id, [int(t) for t in response], [int(m) for m in mask],
                                         latency_s=float(latency_s))
        key = (tuple(int(t) for t in prompt), tuple(int(t) for t in response))
        self.sandbox_rewards.setdefault(key, []).append(reply.reward)
        self.waits.append(ToolWait(pipeline, request_id, None, "reward", reply.latency_s, reply.wall_s,
                                   time.perf_counter()))
        return reply.reward

    def summary(self) -> dict:
        """Per pipeline and kind: calls, the server's waits and the trajectories' (seconds)."""
        out: dict = {}
        for w in self.waits:
            d = out.setdefault(w.pipeline, {}).setdefault(w.kind, {"calls": 0, "latency_s": 0.0, "wall_s": 0.0})
            d["calls"] += 1
            d["latency_s"] += w.latency_s
            d["wall_s"] += w.wall_s
        return out


class SandboxReward:
    """``batch(samples) -> rewards`` for the stage runner: the sandbox's answer for a sample
    it judged, the rule reward (reward.py) for the others. ``from_sandbox`` counts the former."""

    def __init__(self, tools: AgenticTools, rule=None):
        self._tools = tools
        self.rule = rule if rule is not None else low_id_reward()
        self.from_sandbox = 0

    def batch(self, batch) -> list[float]:
        fallback = self.rule.batch(batch)
        out = []
        for item, rule_value in zip(batch, fallback):
            key = (tuple(int(t) for t in item[0]), tuple(int(t) for t in item[1]))
            pending = self._tools.sandbox_rewards.get(key)
            if not pending:
                out.append(rule_value)
                continue
            out.append(pending.pop(0))
            self.from_sandbox += 1
            if not pending:
                del self._tools.sandbox_rewards[key]
        return out
