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
