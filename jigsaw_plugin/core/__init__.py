"""The bookkeeping both executors share: devices and claims, residency, steps and
versions, staleness checks, hook emission, the decide round and the result record.

The simulator's executor (``sim.world``: event loop + cost model) and the live executor
(``runtime.live``: Ray engines, trainers, host adapters) are siblings built on
``core.executor.ExecutorCore``; neither imports the other.
"""
