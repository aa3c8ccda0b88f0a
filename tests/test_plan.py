"""``jigsaw plan``: ECHO-2's capacity model and provisioning rule."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from sim_helpers import small_workload

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.plan import CapacityInputs, ClassRate, evaluate, plan_pipeline
from jigsaw_plugin.plan.capacity import activation_order, least_cost, provision


def _flat(name, available, rate, price, pull=0.0):
    """A class whose replicas (1 device) make ``rate`` samples/s at any batch, no tail."""
    return ClassRate(name, "x", available, 1, price, pull, ((1.0, rate, 0.0), (1e9, rate, 0.0)))


def _inputs(*classes, n=100, train_s=10.0, dis_s=0.0, trainer_price=1.0, staleness=1):
    return CapacityInputs("p", staleness, n, "od", 1, trainer_price, train_s, dis_s, 0.0, tuple(classes))


def test_rule_picks_the_knee_on_a_hand_computable_case():
    # N / R <= T_train needs R >= 100 / 10 = 10 samples/s = 10 devices of 1 sample/s.
    # Fewer: P = 100 / n, cost/sample ~ (1 + n) / n falls; more: P = 10, cost rises with n.
    prov = provision(_inputs(_flat("a", 16, 1.0, 1.0)))
    assert prov.rollout == {"a": 10}
    assert prov.step_s == pytest.approx(10.0) and prov.learner_utilisation == pytest.approx(1.0)
    assert prov.sustains_full_utilisation and prov.limit == "trainer"
    assert prov.cost_per_step == pytest.approx(10.0 * (1 + 10) / 3600)


def test_dissemination_latency_adds_to_the_step():
    prov = evaluate(_inputs(_flat("a", 16, 1.0, 1.0), dis_s=2.5), {"a": 10})
    assert prov.step_s == pytest.approx(12.5) and prov.learner_utilisation == pytest.approx(10 / 12.5)


def test_cheaper_samples_are_activated_first():
    # b makes samples at half a's price per sample: all of b first, then a for the rest
    inputs = _inputs(_flat("a", 8, 1.0, 1.0), _flat("b", 6, 1.0, 0.5))
    assert activation_order(inputs)[5] == {"a": 0, "b": 6}
    prov = provision(inputs)
    assert prov.rollout == {"b": 6, "a": 4} and prov.sustains_full_utilisation
    # b alone (P = 100/6 s at price 1 + 3) is cheaper per sample than b + a (P = 10 s at 1 + 3 + 4),
    # but leaves the learner idle 40% of the time
    cheapest = least_cost([evaluate(inputs, pool) for pool in activation_order(inputs)])
    assert cheapest.rollout == {"b": 6} and cheapest.learner_utilisation == pytest.approx(0.6)


def test_a_slow_link_counts_as_dissemination():
    prov = evaluate(_inputs(_flat("far", 16, 1.0, 0.5, pull=7.0), dis_s=3.0), {"far": 10})
    assert prov.dissemination_s == 7.0 and prov.step_s == pytest.approx(17.0)


def test_tail_bound_is_reported():
    slow = ClassRate("a", "x", 16, 1, 1.0, 0.0, ((1.0, 1.0, 40.0), (1e9, 1.0, 40.0)))
    prov = evaluate(_inputs(slow), {"a": 16})  # T_gen = 40 + 0.3 * 6.25 > T_train = 10 at staleness 1
    assert prov.limit == "tail" and not prov.sustains_full_utilisation
    relaxed = evaluate(_inputs(slow, staleness=8), {"a": 16})
    assert relaxed.limit == "trainer"


def _async(**kw):
    return small_workload(modes=("async", "sync"), staleness=(2, 0), **kw)


def test_plan_from_a_workload_uses_the_cost_model():
    prov = plan_pipeline(_async(gpus=16), trainer_gpus=4)
    i = prov.inputs
    assert i.pipeline == "p0" and i.staleness == 2 and i.trainer_gpus == 4
    assert i.train_s > 0 and i.dissemination_s > 0 and i.classes[0].available == 12
    assert 1 <= prov.rollout_devices <= 12 and 0 < prov.learner_utilisation <= 1


@pytest.mark.parametrize("kw, field", [
    ({"workload": small_workload()}, "pipelines[*].mode"),
    ({"workload": _async(), "name": "p1"}, "pipelines[1].mode"),
    ({"workload": _async(), "name": "nope"}, "--pipeline"),
    ({"workload": _async(), "trainer_gpus": 0}, "--trainer-gpus"),
    ({"workload": _async(), "trainer_gpus": 8}, "cluster"),
    # a 32B's training state (16 bytes a parameter) needs 8 trainer H100s
    ({"workload": _async(gpus=16, models=("qwen2.5-32b", "qwen2.5-7b")), "trainer_gpus": 4}, "--trainer-gpus"),
    ({"workload": _async(), "trainer_class": "tpu"}, "--trainer-class"),
])
def test_unplannable_workloads_name_the_field(kw, field):
    w = kw.pop("workload")
    with pytest.raises(SpecError) as e:
        plan_pipeline(w, **kw)
    assert e.value.field == field


def test_async_with_staleness_zero_is_refused():
    d = _async().to_dict()
    d["pipelines"][0]["staleness"] = 0
    from jigsaw_plugin.workload import parse_workload

    with pytest.raises(SpecError) as e:
        plan_pipeline(parse_workload(d))
    assert e.value.field == "pipelines[0].staleness"


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "jigsaw_plugin.cli", "plan", *map(str, args)],
                          capture_output=True, text=True)


def test_cli_plan_prints_the_rule_and_errors_clearly(tmp_path):
    good = tmp_path / "async.yaml"
    good.write_text(yaml.safe_dump(_async(gpus=16).to_dict()))
    p = _cli(good, "--trainer-gpus", "4", "--json", tmp_path / "plan.json")
    assert p.returncode == 0, p.stderr
    assert "provision:" in p.stdout and "learner utilisation" in p.stdout and (tmp_path / "plan.json").exists()
    bad = tmp_path / "sync.yaml"
    bad.write_text(yaml.safe_dump(small_workload().to_dict()))
    p = _cli(bad)
    assert p.returncode == 2 and "pipelines[*].mode" in p.stderr and "Traceback" not in p.stderr


def test_a_cheap_class_behind_a_slow_link_is_not_forced_into_every_pool():
    # "far" makes samples at half "near"'s price, but each version reaches it 50 s after the
    # trainer's own sync: its first sustaining pool (10 devices) steps in 10 + 50 s at price
    # 1 + 5, cost/sample 60 * 6 / 3600 / 100; "near" alone steps in 10 s at 1 + 10: cheaper
    inputs = _inputs(_flat("far", 16, 1.0, 0.5, pull=50.0), _flat("near", 16, 1.0, 1.0))
    assert all(pool["far"] > 0 for pool in activation_order(inputs))  # the order alone holds no pool without it
    prov = provision(inputs)
    assert prov.rollout == {"near": 10} and prov.step_s == pytest.approx(10.0)
    assert prov.cost_per_sample == pytest.approx(10.0 * 11 / 3600 / 100)
    assert prov.cost_per_sample < evaluate(inputs, {"far": 10}).cost_per_sample / 3
    # a link no slower than the trainer's own sync leaves the one order as it was
    same = _inputs(_flat("far", 16, 1.0, 0.5, pull=2.0), _flat("near", 16, 1.0, 1.0), dis_s=2.0)
    assert provision(same).rollout == {"far": 10}
