"""Discrete-event simulator: runs pure policies against the cost model."""

__all__ = ["simulate", "Simulation", "SimulationStalled"]


def __getattr__(name):
    # Lazy: keeps `import jigsaw_plugin.sim.replica` from pulling the workload package.
    if name in __all__:
        from jigsaw_plugin.sim import engine

        return getattr(engine, name)
    raise AttributeError(name)
