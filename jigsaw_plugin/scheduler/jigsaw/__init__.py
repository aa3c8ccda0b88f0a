"""The jigsaw policy (``Jigsaw``, registered as ``jigsaw``), one module per mechanism:

- ``policy.py``: the class, its decide round and the order it serves ready work in;
- ``config.py``: ``JigsawConfig``, a switch per mechanism and the knobs;
- ``round.py``: what one round works on and the helpers the mechanisms share;
- ``projections.py``: step, run and critical-path projections;
- ``loans.py``: lending home devices and reclaiming them;
- ``tails.py``: rollout tails merged or re-sharded, priced in device-seconds;
- ``gangs.py``: training gangs (the look-ahead), early passes, stages side by side;
- ``rollout.py``: rollout replicas' count, width, placement and admission limits.
"""

from jigsaw_plugin.scheduler.jigsaw.config import JigsawConfig
from jigsaw_plugin.scheduler.jigsaw.policy import Jigsaw
from jigsaw_plugin.scheduler.jigsaw.round import JigsawMemo, apportion, assign_devices, finish_together

__all__ = ["Jigsaw", "JigsawConfig", "JigsawMemo", "apportion", "assign_devices", "finish_together"]
