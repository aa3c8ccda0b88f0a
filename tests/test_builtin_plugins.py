"""The scheduler and the cost model are ordinary plugins: a tryfirst plugin overrides them."""

from jigsaw_plugin.builtin import CostModelPlugin
from jigsaw_plugin.costmodel import CostModel, hardware_profile, model_profile
from jigsaw_plugin.hookspecs import hookimpl
from jigsaw_plugin.manager import get_plugin_manager, register
from jigsaw_plugin.scheduler import get_policy
from jigsaw_plugin.sim import Simulation
from sim_helpers import small_workload


def test_schedule_goes_through_the_hook_and_can_be_overridden():
    wl = small_workload(pipelines=1, prompts=2, samples=2, steps=1)
    seen = []

    class Spy:
        @hookimpl(tryfirst=True)
        def jigsaw_schedule(self, state):
            seen.append(state.t)
            return None  # defer to the built-in scheduler

    pm = get_plugin_manager(load_entrypoints=False)
    register(pm, Spy(), "spy")
    result = Simulation(wl, get_policy("verl-sync"), pm=pm).run()
    assert seen and result["samples"] == 4
    assert pm.hook.jigsaw_predict_duration(kind="update_actor", pipeline="p0", sizes={"tokens": 1e6},
                                           devices=(0, 1)) > 0


def test_cost_model_plugin_prices_known_kinds_only():
    cost = CostModel(hardware_profile("h100"))
    plugin = CostModelPlugin(cost, {"p": model_profile("qwen2.5-7b")})
    pm = get_plugin_manager(load_entrypoints=False, default_plugins=False)
    register(pm, plugin, "costmodel")
    fwd = pm.hook.jigsaw_predict_duration(kind="old_log_prob", pipeline="p", sizes={"tokens": 1e7}, devices=(0,))
    assert fwd == cost.forward_s(model_profile("qwen2.5-7b"), 1, 1e7)
    assert pm.hook.jigsaw_predict_duration(kind="tool_call", pipeline="p", sizes={}, devices=()) is None
    assert pm.hook.jigsaw_predict_duration(kind="old_log_prob", pipeline="other", sizes={}, devices=()) is None
