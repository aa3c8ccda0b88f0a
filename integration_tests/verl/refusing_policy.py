"""A policy that asks a verl job for something verl cannot do (test_host_policy.py).

``test-verl-migrating`` is verl-sync (static halves), except that it opens ``verl-b``'s
second rollout on a server that absorbs another server's requests: a request migration.
verl declares ``migration=false`` (the coordinator does not see its requests one by one),
so the coordinator refuses the decision and the waiting job must get that refusal, not hang.

A test policy on purpose, registered under its own name: the coordinator imports this module
through ``CoordinatorConfig.policy_modules`` (this folder is on the Ray workers' PYTHONPATH,
conftest.py).
"""

from __future__ import annotations

import dataclasses

from jigsaw_plugin.scheduler.base import register_policy
from jigsaw_plugin.scheduler.baselines import VerlSync
from jigsaw_plugin.scheduler.decisions import LaunchReplica

__all__ = ["MigratingVerlSync", "NAME", "TARGET", "TARGET_STEP"]

NAME = "test-verl-migrating"
TARGET = "verl-b"
TARGET_STEP = 1  # its first step runs normally: the refusal comes mid-run


@register_policy(NAME)
class MigratingVerlSync(VerlSync):
    name = NAME

    def decide(self, state) -> list:
        out = []
        for d in super().decide(state):
            p = next((q for q in state.order if q.name == getattr(d, "pipeline", None)), None)
            if isinstance(d, LaunchReplica) and d.pipeline == TARGET and p is not None and p.gen_next == TARGET_STEP:
                d = dataclasses.replace(d, absorb=(0,))  # take over server 0's requests: a migration
            out.append(d)
        return out
