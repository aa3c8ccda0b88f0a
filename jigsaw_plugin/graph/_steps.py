"""The training side of a step, shared by both builders so that they give the same shape."""

from __future__ import annotations

from jigsaw_plugin.algorithms import FORWARD_STAGES, STAGES_BY_ALGORITHM
from jigsaw_plugin.graph.substage import SubStage

__all__ = ["add_training", "node_id", "reward_resource", "split"]


def node_id(pipeline: str, step: int, *parts) -> str:
    return "/".join([pipeline, f"s{step}", *map(str, parts)])


def reward_resource(kind: str | None) -> tuple[str, int]:
    """Where one sample's reward runs: a reward model on a device, a rule or sandbox on the host."""
    return ("train", 1) if kind == "model" else ("host", 0)


def split(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` near-equal integers that add up (remainder to the first ones),
    as verl's balanced dispatch gives each data-parallel rank its share."""
    q, r = divmod(int(total), parts)
    return [q + (1 if i < r else 0) for i in range(parts)]


def add_training(g, pipeline: str, step: int, algorithm: str, reward_ids: list, gang: int,
                 samples: int, tokens: int, times: dict | None = None, weight_bytes: int | None = None) -> str:
    """The step's barrier (a join after every reward, and after the previous step's actor
    update: training steps run in order), one shard per device of the gang for each forward
    stage, then adv, the updates and the weight sync. Returns the weight-sync node id.

    ``times`` maps a stage name (and ``"barrier"``) to ``(start_s, end_s)``;
    ``weight_bytes`` (the policy's weights) sizes the weight sync.
    """
    times = times or {}
    b_start, b_end = times.get("barrier", (None, None))
    barrier = g.add(SubStage(node_id(pipeline, step, "barrier"), pipeline, step, "barrier", "host", 0,
                             {"samples": samples}, b_start, b_end)).id
    g.add_edges(((r, barrier) for r in reward_ids), "barrier")
    before = node_id(pipeline, step - 1, "update_actor")
    if before in g:
        g.add_edge(before, barrier, "order")
    prev, prev_kind = [barrier], "barrier"
    shard_samples, shard_tokens = split(samples, gang), split(tokens, gang)
    critic = None
    for stage in STAGES_BY_ALGORITHM[algorithm]:
        a, b = times.get(stage, (None, None))
        if stage in FORWARD_STAGES:
            ids = [g.add(SubStage(node_id(pipeline, step, stage, d), pipeline, step, f"{stage}_shard", "train", 1,
                                  {"samples": shard_samples[d], "tokens": shard_tokens[d]}, a, b,
                                  {"shard": d})).id
                   for d in range(gang)]
            g.add_edges(((u, v) for u in prev for v in ids), prev_kind)
            prev, prev_kind = ids, "barrier"
            continue
        resource, devices = ("host", 0) if stage == "adv" else ("train", gang)
        sizes = {"samples": samples, "tokens": tokens}
        if stage == "weight_sync" and weight_bytes is not None:
            sizes["bytes"] = int(weight_bytes)
        s = g.add(SubStage(node_id(pipeline, step, stage), pipeline, step, stage, resource, devices, sizes, a, b))
        g.add_edges(((u, s.id) for u in prev), "data" if stage != "adv" else prev_kind)
        if stage == "update_critic":
            critic = s.id
            continue  # update_actor also follows adv (the critic's values are in adv already)
        if stage == "update_actor" and critic is not None:
            g.add_edge(critic, s.id, "order")  # verl updates the critic first, on the same gang
        prev, prev_kind = [s.id], "data"
    return prev[0]
