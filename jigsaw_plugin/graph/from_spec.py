"""Build the sub-stage graph a workload spec implies (a plan: no times, no migrations)."""

from __future__ import annotations

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.graph._steps import add_training, node_id
from jigsaw_plugin.graph.graph import SubStageGraph
from jigsaw_plugin.graph.substage import SubStage
from jigsaw_plugin.workload import sample_step

__all__ = ["build_from_spec", "find_pipeline"]


def find_pipeline(workload, name: str):
    for i, p in enumerate(workload.pipelines):
        if p.name == name:
            return i, p
    raise SpecError("--pipeline", name, ", ".join(p.name for p in workload.pipelines))


def build_from_spec(workload, pipeline: str, steps: int | None = None, seed: int = 0,
                    max_samples: int | None = None) -> SubStageGraph:
    """Per step: each sample's turns and tool calls, its reward, then the training stages
    on the pipeline's static share (one shard per device). Sync steps wait for the previous
    step's weight sync; async ones for the sync ``staleness`` steps earlier."""
    index, spec = find_pipeline(workload, pipeline)
    gang = workload.static_gpus()[index]
    tp = spec.rollout_tp or 1
    g = SubStageGraph()
    syncs = []
    for k in range(spec.steps if steps is None else min(steps, spec.steps)):
        smp = sample_step(spec, k, seed)
        n = smp.n if max_samples is None else min(smp.n, max_samples)
        lag = 1 + (spec.staleness if spec.mode == "async" else 0)
        gate = syncs[k - lag] if k - lag >= 0 else None
        rewards = []
        tokens = 0
        for i in range(n):
            off, turns = int(smp.turn_offset[i]), int(smp.turns[i])
            gen = int(smp.gen_tokens[off:off + turns].sum())
            req = g.add(SubStage(node_id(spec.name, k, "r", i), spec.name, k, "rollout_request", "rollout", tp,
                                 {"prompt_tokens": int(smp.prompt_len[i]), "tokens": gen},
                                 attrs={"request_id": f"{spec.name}/{k}/{i}"}))
            prev = req.id
            for t in range(turns):
                turn = g.add(SubStage(node_id(spec.name, k, "r", i, "t", t), spec.name, k, "gen_turn", "rollout", tp,
                                      {"tokens": int(smp.gen_tokens[off + t])}, attrs={"turn": t}))
                g.add_edge(prev, turn.id, "data" if prev != req.id else "order")
                if t == 0 and gate is not None:
                    g.add_edge(gate, turn.id, "barrier")
                prev = turn.id
                if t + 1 < turns:
                    tool = g.add(SubStage(node_id(spec.name, k, "r", i, "tool", t), spec.name, k, "tool_call", "host",
                                          0, {"tokens": int(smp.observation_len[off + t])},
                                          attrs={"latency_s": float(smp.tool_latency_s[off + t])}))
                    g.add_edge(prev, tool.id, "data")
                    prev = tool.id
            rw = g.add(SubStage(node_id(spec.name, k, "r", i, "reward"), spec.name, k, "reward", "host", 0,
                                {"samples": 1}))
            g.add_edge(prev, rw.id, "data")
            rewards.append(rw.id)
            tokens += int(smp.prompt_len[i]) + gen + int(smp.observation_len[off:off + turns].sum())
        syncs.append(add_training(g, spec.name, k, spec.algorithm, rewards, gang, n, tokens))
    return g
