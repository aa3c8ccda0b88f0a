"""A training gang the policy starts is priced as it is placed.

The policy picks a gang's width from each width's time placed at best (node-local hybrid
shard groups); the executor prices the devices it is given, whose nodes may allow no such
groups. Synthetic mix s31 (benchmarks/random_mixes.py) reached both ways the two parted:
a 32B's update took the first 16 of its home (6, 8 and 2 devices on three nodes: 63 s where
two whole nodes take 11 s), and an 8B PPO step's actor update, run beside its critic's, got
the 21 devices the critic left spread over six nodes (17.5 s against 6.6 s).
"""

import sys
from pathlib import Path

from jigsaw_plugin.algorithms import FORWARD_STAGES, UPDATE_STAGES
from jigsaw_plugin.hookspecs import hookimpl
from jigsaw_plugin.manager import get_plugin_manager, register
from jigsaw_plugin.scheduler import get_policy
from jigsaw_plugin.sim import Simulation
from jigsaw_plugin.workload import parse_workload

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import random_mixes as rm  # noqa: E402


class _Priced:
    """Every training-side pass the executor prices: (pipeline, stage, devices, tokens, s)."""

    def __init__(self):
        self.calls = []

    @hookimpl(hookwrapper=True)
    def jigsaw_predict_duration(self, kind, pipeline, sizes, devices):
        outcome = yield
        if kind in FORWARD_STAGES or kind in UPDATE_STAGES:
            self.calls.append((pipeline, kind, tuple(devices), sizes["tokens"], outcome.get_result()))


def test_no_gang_is_priced_far_above_its_width_placed_at_best():
    (_, spec), = rm.synthetic_mixes(31, 1)
    wl = parse_workload(spec, base_dir=rm.EXAMPLES)
    pm = get_plugin_manager(load_entrypoints=False)
    priced = _Priced()
    register(pm, priced, "priced")
    sim = Simulation(wl, get_policy("jigsaw"), seed=0, pm=pm)
    sim.run()
    cost, models = sim.cost, {name: p.model for name, p in sim.world.pipelines.items()}
    assert any(len(devs) > 8 for _, _, devs, _, _ in priced.calls)  # gangs past a node were priced
    far = []
    for pipeline, stage, devs, tokens, s in priced.calls:
        at_best = (cost.forward_s if stage in FORWARD_STAGES else cost.train_s)(models[pipeline], len(devs), tokens)
        if s > 1.2 * at_best + 0.5:
            far.append((pipeline, stage, len(devs), round(s, 1), round(at_best, 1)))
    assert not far
