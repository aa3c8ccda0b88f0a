"""The training side of a step, shared by both builders so that they give the same shape."""

from __future__ import annotations

from jigsaw_plugin.algorithms import FORWARD_STAGES, STAGES_BY_ALGORITHM
from jigsaw_plugin.graph.substage import SubStage

__all__ = ["add_training", "node_id"]


def node_id(pipeline: str, step: int, *parts) -> str:
    return "/".join([pipeline, f"s{step}", *map(str, parts)])


def add_training(g, pipeline: str, step: int, algorithm: str, reward_ids: list, gang: int,
                 samples: int, tokens: int, times: dict | None = None) -> str:
    """Shards of each forward stage (one per device of the gang, barrier after the rewards),
    then adv, the updates and the weight sync. Returns the weight-sync node id."""
    times = times or {}
    prev = list(reward_ids)
    prev_kind = "barrier"
    for stage in STAGES_BY_ALGORITHM[algorithm]:
        a, b = times.get(stage, (None, None))
        sizes = {"samples": samples, "tokens": tokens}
        if stage in FORWARD_STAGES:
            ids = []
            for d in range(gang):
                s = g.add(SubStage(node_id(pipeline, step, stage, d), pipeline, step, f"{stage}_shard", "train", 1,
                                   {"samples": samples // gang, "tokens": tokens // gang}, a, b))
                ids.append(s.id)
            for u in prev:
                for v in ids:
                    g.add_edge(u, v, prev_kind)
            prev, prev_kind = ids, "barrier"
            continue
        resource, devices = ("host", 0) if stage == "adv" else ("train", gang)
        s = g.add(SubStage(node_id(pipeline, step, stage), pipeline, step, stage, resource, devices, sizes, a, b))
        for u in prev:
            g.add_edge(u, s.id, prev_kind)
        if stage == "update_critic":
            continue  # update_actor also follows adv, not the critic update
        prev, prev_kind = [s.id], "data"
    return prev[0]
