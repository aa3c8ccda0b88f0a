"""Build the sub-stage graph a workload spec implies (a plan: no times, no migrations)."""

from __future__ import annotations

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.graph._steps import add_training, reward_resource
from jigsaw_plugin.graph.graph import SubStageGraph
from jigsaw_plugin.graph.substage import SubStage

__all__ = ["build_from_spec", "find_pipeline"]


def find_pipeline(workload, name: str):
    """``(index, PipelineSpec)`` of the pipeline called ``name``; a :class:`SpecError`
    listing the valid names otherwise."""
    for i, p in enumerate(workload.pipelines):
        if p.name == name:
            return i, p
    raise SpecError("--pipeline", name, ", ".join(p.name for p in workload.pipelines))


def _positive(field: str, value, what: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise SpecError(field, value, what)


def build_from_spec(workload, pipeline: str, steps: int | None = None, seed: int = 0,
                    max_samples: int | None = None) -> SubStageGraph:
    """The plan of ``pipeline``'s first ``steps`` steps (default and most: the spec's ``steps``).

    Per step and sample (``sample_step(spec, step, seed)``, the first ``max_samples`` only
    when given): a ``rollout_request`` (``rollout_tp`` devices, default 1) before its
    ``gen_turn`` nodes, a ``tool_call`` (host) between consecutive turns, a ``reward`` after
    the last turn (host; one device of ``train`` for a reward model). Then the training side (``_steps.add_training``) on the pipeline's static
    share of devices: a barrier after every reward, one shard per device for each forward
    stage, adv, update_critic (ppo), update_actor, weight_sync. A synchronous step's first
    turns wait for the previous step's weight sync; an asynchronous one's for the sync
    ``staleness + 1`` steps earlier (none before that exists).
    """
    from jigsaw_plugin.costmodel import model_profile
    from jigsaw_plugin.workload import sample_step

    index, spec = find_pipeline(workload, pipeline)
    _positive("--steps", steps, "an integer >= 1")
    _positive("--max-samples", max_samples, "an integer >= 1")
    gang = workload.static_gpus()[index]
    tp = spec.rollout_tp or 1
    lag = 1 + (spec.staleness if spec.mode == "async" else 0)
    r_res, r_dev = reward_resource(spec.reward.kind)
    weights = int(model_profile(spec.model).weight_bytes)  # bf16 weights, what a weight sync moves
    name = spec.name
    g = SubStageGraph()
    syncs = []
    for k in range(spec.steps if steps is None else min(steps, spec.steps)):
        smp = sample_step(spec, k, seed)
        n = smp.n if max_samples is None else min(smp.n, max_samples)
        gate = syncs[k - lag] if k - lag >= 0 else None
        # plain Python ints/floats: JSON-able sizes and no numpy scalar overhead per node
        prompt = smp.prompt_len[:n].tolist()
        turns = smp.turns[:n].tolist()
        off = smp.turn_offset[: n + 1].tolist()
        t_all = off[n]
        gen = smp.gen_tokens[:t_all].tolist()
        obs = smp.observation_len[:t_all].tolist()
        tool_s = smp.tool_latency_s[:t_all].tolist()
        reward_s = smp.reward_latency_s[:n].tolist()
        rewards, first_turns, edges, order, tokens = [], [], [], [], 0
        subs = []
        add = subs.append
        for i in range(n):
            o, nt = off[i], turns[i]
            rid = f"{name}/{k}/{i}"  # the simulator's trajectory id
            generated = sum(gen[o:o + nt])
            req = f"{name}/s{k}/r{i}"  # readable ids: p/s0/r5, p/s0/r5/t1, p/s0/r5/tool0, p/s0/r5/reward
            add(SubStage(req, name, k, "rollout_request", "rollout", tp,
                         {"prompt_tokens": prompt[i], "tokens": generated, "turns": nt},
                         attrs={"request_id": rid, "sample": i}))
            context = prompt[i]
            prev = None
            for t in range(nt):
                turn = f"{req}/t{t}"
                add(SubStage(turn, name, k, "gen_turn", "rollout", tp, {"tokens": gen[o + t], "prompt_tokens": context},
                             attrs={"request_id": rid, "turn": t}))
                if prev is None:
                    order.append((req, turn))
                    first_turns.append(turn)
                else:
                    edges.append((prev, turn))
                prev = turn
                context += gen[o + t]
                if t + 1 < nt:
                    tool = f"{req}/tool{t}"
                    add(SubStage(tool, name, k, "tool_call", "host", 0, {"tokens": obs[o + t]},
                                 attrs={"request_id": rid, "turn": t, "latency_s": tool_s[o + t]}))
                    edges.append((prev, tool))
                    prev = tool
                    context += obs[o + t]
            rw = f"{req}/reward"
            add(SubStage(rw, name, k, "reward", r_res, r_dev, {"samples": 1, "tokens": context},
                         attrs={"request_id": rid, "reward_kind": spec.reward.kind, "latency_s": reward_s[i]}))
            edges.append((prev, rw))
            rewards.append(rw)
            tokens += context  # prompt + generated + observations, as the trainer sees it
        g.add_many(subs)
        g.add_edges(order, "order")
        g.add_edges(edges, "data")
        if gate is not None:
            g.add_edges(((gate, t) for t in first_turns), "barrier")
        syncs.append(add_training(g, name, k, spec.algorithm, rewards, gang, n, tokens, weight_bytes=weights))
    return g
