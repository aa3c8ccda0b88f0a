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
    assert got["during_weight_sync_s"] == 0.0  # no weight sync in the record


def test_idle_gaps_count_the_seconds_a_device_waits_out_its_pipelines_weight_sync():
    # p's update on devices 0-2 ends at 10; its sync runs 10-13 on device 0; its rollout
    # starts at 13 on 0-2. Device 1 idles 10-13 (all of it the sync's), device 2 10-15 (3 s
    # of it the sync's: the rollout there starts at 15). Device 3 ran q's update to 10 and
    # idles 10-14: none of it is a sync of its own pipeline's.
    trace = [("p update_actor s0", "update_actor", (0, 1, 2), 0.0, 10.0),
             ("p weight_sync s0", "weight_sync", (0,), 10.0, 13.0),
             ("p rollout r1", "rollout", (0, 1), 13.0, 20.0),
             ("p rollout r2", "rollout", (2,), 15.0, 20.0),
             ("q update_actor s0", "update_actor", (3,), 0.0, 10.0),
             ("q rollout r3", "rollout", (3,), 14.0, 20.0)]
    got = idle_gaps(SimpleNamespace(trace=trace, gpus=4), 20.0)
    assert got["by_transition"]["update_actor->rollout"] == 3.0 + 5.0 + 4.0
    assert got["during_weight_sync_s"] == 6.0
