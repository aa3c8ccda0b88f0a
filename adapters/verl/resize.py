"""Resize a verl trainer's rollout at run time: replicas leave and rejoin the routing set.

verl 0.9.1 fixes the number of replicas when ``LLMServerManager`` starts; what can change is
which replicas the balancer routes to and which are awake. ``ReplicaResizer`` does both,
with verl's own ``CheckpointEngineManager`` (``checkpoint_engine/base.py:380-562``) and a
``JigsawLoadBalancer`` actor:

- ``shrink(replica)``: stop routing to it and migrate its running requests to the others
  (``drain``), wait until nothing is in flight there, take it out of the balancer and out of
  the manager's replica list (weight updates skip it), then ``replica.sleep()`` (frees its
  weights and KV cache: the devices go back to the pool);
- ``grow(replica)``: ``replica.wake_up()``, back into the manager's list, then
  ``manager.update_weights(global_steps)`` if a version is given (a parked replica missed
  the syncs since it left), and back into the balancer.
"""

from __future__ import annotations

import asyncio
import time

__all__ = ["ReplicaResizer"]


async def _get(ref):
    return await ref


class ReplicaResizer:
    """:param manager: verl's ``CheckpointEngineManager``. :param balancer: the jigsaw balancer actor."""

    def __init__(self, manager, balancer):
        self.manager = manager
        self.balancer = balancer
        self.parked: list = []

    @property
    def active(self) -> list:
        return list(self.manager.replicas)

    async def shrink(self, replica, timeout_s: float = 120.0) -> list[str]:
        """Park ``replica``; returns the request ids migrated off it."""
        address = replica.server_address
        moved = await _get(self.balancer.drain.remote(address))
        deadline = time.monotonic() + timeout_s
        while await _get(self.balancer.get_inflight_count.remote(address)) > 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"replica {address}: requests still in flight after {timeout_s} s")
            await asyncio.sleep(0.05)
        await _get(self.balancer.remove_servers.remote([address]))
        self.manager.remove_replicas([replica])
        await replica.sleep()
        self.parked.append(replica)
        return list(moved)

    async def grow(self, replica, global_steps: int | None = None) -> None:
        """Bring a parked (or new) ``replica`` back: awake, in the manager, routed to."""
        await replica.wake_up()
        self.manager.add_replicas([replica])
        if global_steps is not None:
            result = self.manager.update_weights(global_steps)
            if asyncio.iscoroutine(result):
                await result
        if replica in self.parked:
            self.parked.remove(replica)
        await _get(self.balancer.add_servers.remote({replica.server_address: replica.server_handle}))
