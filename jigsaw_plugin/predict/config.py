"""What the length predictor believes before a pipeline has finished anything.

A live run has no workload spec distribution to start from: the only figure it knows is
the response budget (``max_tokens``). The prior is therefore a log-normal whose median is
a fraction of that budget, worth ``weight`` finished responses; data take over after a
few finished groups. The defaults are deliberately vague (a wide sigma, a small weight).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from jigsaw_plugin.errors import SpecError

__all__ = ["PriorConfig"]


@dataclass(frozen=True)
class PriorConfig:
    """The predictor's prior and its bookkeeping horizons.

    median_fraction: prior median response length as a fraction of ``max_tokens`` (0.05:
        about 1,000 of a 20,480 budget; verl DAPO's p50 is 466, Search-R1's 57 of 4,096).
    sigma: prior standard deviation of log length (PolyTrace verl/ 0.93, search_r1/ 0.68).
    weight: how many finished responses the prior is worth (pseudo-count).
    group_icc: prior share of log-length variance that is between prompts (the GRPO group
        effect); PolyTrace verl/ 0.08, search_r1/ per turn 0.12 (docs/workload.md).
    group_icc_weight: how many finished groups the prior ICC is worth.
    epoch_weight: weight of one earlier-epoch length of the same prompt relative to a
        sibling of this step (the policy has moved since, so less than 1).
    """

    median_fraction: float = 0.05
    sigma: float = 1.0
    weight: float = 8.0
    group_icc: float = 0.1
    group_icc_weight: float = 16.0
    epoch_weight: float = 0.5

    def __post_init__(self) -> None:
        checks = (
            ("median_fraction", lambda v: 0.0 < v <= 1.0, "a number in (0, 1]"),
            ("sigma", lambda v: 0.0 < v <= 10.0, "a number in (0, 10]"),
            ("weight", lambda v: v > 0.0, "a number > 0"),
            ("group_icc", lambda v: 0.0 <= v < 1.0, "a number in [0, 1)"),
            ("group_icc_weight", lambda v: v > 0.0, "a number > 0"),
            ("epoch_weight", lambda v: 0.0 <= v <= 1.0, "a number in [0, 1]"),
        )
        for name, ok, allowed in checks:
            value = getattr(self, name)
            number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not number or not ok(value):
                raise SpecError(f"PriorConfig.{name}", value, allowed)
