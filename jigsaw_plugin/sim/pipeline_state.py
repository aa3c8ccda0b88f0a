"""Per-pipeline bookkeeping of a run: steps, samples, versions, stage progress."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from jigsaw_plugin.algorithms import HOST_STAGES, STAGES_BY_ALGORITHM  # noqa: F401  (re-exported)

__all__ = ["STAGES_BY_ALGORITHM", "StepRun", "PipelineRun"]


@dataclass
class StepRun:
    """One step of one pipeline: its samples and when each part happened."""

    step: int
    samples: object  # workload.StepSamples
    n: int
    gen_start_t: float | None = None
    gen_end_t: float | None = None  # last response returned
    reward_end_t: float | None = None  # last reward computed: the batch is trainable
    n_rewarded: int = 0
    n_gen_done: int = 0
    min_version: int | None = None  # oldest policy version that generated any sample
    tokens: int = 0  # prompt + generated tokens of the whole batch (what training reads)
    generated: int = 0
    stage_t: dict = field(default_factory=dict)  # stage -> (start, end)
    trained_version: int | None = None
    migrations: int = 0


class PipelineRun:
    """The live state of one pipeline in a run (read by policies, written by the executor)."""

    def __init__(self, index: int, spec, model, static_devices: tuple):
        self.index = index
        self.spec = spec
        self.name = spec.name
        self.model = model
        self.stages = STAGES_BY_ALGORITHM[spec.algorithm]
        self.static_devices = static_devices  # the share a static-partition baseline uses
        self.steps: dict[int, StepRun] = {}
        self.gen_next = 0  # next step whose generation has not started
        self.train_next = 0  # next step to train
        self.stage_next = 0  # index into ``stages`` of train_next's next stage
        self.stage_running = False
        self.version = 0  # updates applied to the trainer's weights
        self.rollout_version = 0  # weights the rollout replicas hold
        self.replicas: list = []  # live replicas of this pipeline
        self.pending: list = []  # requests waiting for a replica
        self.max_staleness = 0
        self.context_switches = 0
        self.finished_t: float | None = None

    @property
    def total_steps(self) -> int:
        return self.spec.steps

    @property
    def done(self) -> bool:
        return self.train_next >= self.spec.steps

    @property
    def generating(self) -> bool:
        """Some started step still has responses to generate."""
        return any(s.gen_end_t is None for s in self.steps.values())

    def batch_ready(self, step: int) -> bool:
        s = self.steps.get(step)
        return s is not None and s.reward_end_t is not None

    @property
    def next_stage(self) -> str | None:
        """The next training-side stage to run (None if none is ready or one is running)."""
        if self.done or self.stage_running or not self.batch_ready(self.train_next):
            return None
        return self.stages[self.stage_next]

    def load(self) -> int:
        return sum(r.load for r in self.replicas) + len(self.pending)


def sample_tokens(samples) -> tuple[int, int]:
    """(prompt + generated + observation tokens, generated tokens) of a StepSamples."""
    gen = int(np.sum(samples.gen_tokens))
    obs = int(np.sum(samples.observation_len))
    return int(np.sum(samples.prompt_len)) + gen + obs, gen
