"""``core.bounds.idle_gaps``: where a run's idle device-seconds lie."""

from types import SimpleNamespace

from jigsaw_plugin.core.bounds import idle_gaps


def test_idle_gaps_place_each_idle_second_by_length_and_neighbours():
    # device 0: idle 0-1 (start), rollout 1-4, idle 4-10 (6 s), old_log_prob 10-12, idle to 30
    # device 1: never used (30 s from start to end)
    trace = [("p rollout", "rollout", (0,), 1.0, 4.0), ("p old_log_prob s0", "old_log_prob", (0,), 10.0, 12.0)]
    got = idle_gaps(SimpleNamespace(trace=trace, gpus=2), 30.0)
    assert got["by_length_s"]["<= 2"] == 1.0 and got["by_length_s"]["<= 10"] == 6.0
    assert got["by_length_s"]["<= 20"] == 18.0 and got["by_length_s"]["<= 50"] == 30.0
    assert got["by_transition"] == {"start->end": 30.0, "old_log_prob->end": 18.0, "rollout->old_log_prob": 6.0,
                                    "start->rollout": 1.0}
