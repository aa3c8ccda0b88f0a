"""A policy option of the wrong kind is refused, naming the option, the value and what is
allowed (``get_policy``; the CLI's ``--policy-opt``), never read as something else."""

from __future__ import annotations

import pytest

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.scheduler import get_policy


@pytest.mark.parametrize("key, value, allowed", [
    ("migration", "maybe", "true or false"),
    ("reprice_on_change", 1, "true or false"),
    ("tail_requests", 2.5, "an integer"),
    ("tail_requests", True, "an integer"),
    ("latency_slack", "0.1", "a number"),
])
def test_a_wrong_kind_of_option_is_refused(key, value, allowed):
    with pytest.raises(SpecError, match=f"jigsaw option {key}: got .*; allowed: {allowed}"):
        get_policy("jigsaw", **{key: value})


def test_options_of_the_right_kind_are_taken():
    p = get_policy("jigsaw", migration=False, tail_requests=16, latency_slack=1, reprice_on_change=True)
    assert (p.config.migration, p.config.tail_requests, p.config.latency_slack, p.config.reprice_on_change) == (
        False, 16, 1, True)


@pytest.mark.parametrize("key, value, allowed", [
    ("max_widen", -3, "an integer >= 1"),
    ("width", 0, "an integer >= 1"),
    ("latency_slack", 5.0, r"a fraction in \[0, 1\]"),
    ("early_from", -0.1, r"a fraction in \[0, 1\]"),
    ("loan_margin", 0.5, "a factor >= 1"),
    ("horizon_s", -1.0, "a number >= 0"),
    ("min_gain", float("nan"), "a finite number"),
])
def test_an_option_out_of_its_range_is_refused(key, value, allowed):
    # the right kind, but outside the range its rule reads it in: refused, not run
    with pytest.raises(SpecError, match=f"JigsawConfig.{key}: got .*; allowed: {allowed}"):
        get_policy("jigsaw", **{key: value})


def test_the_default_options_and_each_knobs_edges_are_taken():
    get_policy("jigsaw")
    get_policy("jigsaw", latency_slack=0.0, max_slack=1.0, loan_margin=1.0, spread_cost=1.0, min_gain=0.0,
               max_widen=1, horizon_s=0.0)
