"""Per-pipeline bookkeeping of a run: steps, samples, versions, stage progress, and what
has been observed of finished work (the predictor's history, stage durations)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from jigsaw_plugin.algorithms import HOST_STAGES, STAGES_BY_ALGORITHM, early_stages, waits_for_alongside  # noqa: F401  (re-exported)

__all__ = ["STAGES_BY_ALGORITHM", "StepRun", "PipelineRun", "ObservedLengths", "static_shares",
           "build_pipelines", "sample_tokens"]


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
    stages_done: set = field(default_factory=set)  # stages that have ended
    trained_version: int | None = None
    migrations: int = 0
    finished_tokens: int = 0  # prompt + generated + observation tokens of the trajectories finished so far
    covered: dict = field(default_factory=dict)  # stage -> tokens its early passes have read
    pass_tokens: dict = field(default_factory=dict)  # stage -> tokens the pass running now reads
    early_passes: int = 0  # early passes that ended
    width: int | None = None  # the rollout width its StartGen chose (``StartGen.width``)
    keep_width: bool = False


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
        # (width, seconds) of each trained step whose StartGen chose a width: from its
        # generation's start to its last stage's end before the weight sync
        self.step_widths: list[tuple[int, float]] = []
        self.stage_next = 0  # index into ``stages`` of train_next's next stage
        self.stage_running = False
        self.early: str | None = None  # the stage whose early pass runs now (docs/simulator.md)
        self.early_step: int | None = None  # the step it reads (train_next, or the one after)
        # the stage running alongside the stage sequence (``RunStage.alongside``,
        # ``algorithms.ALONGSIDE``); the step's stages after its partner wait for it
        self.alongside: str | None = None
        self.version = 0  # updates applied to the trainer's weights
        self.rollout_version = 0  # weights the rollout replicas hold
        self.replicas: list = []  # live replicas of this pipeline
        self.pending: list = []  # requests waiting for a replica
        self.max_staleness = 0
        self.context_switches = 0
        # its rollout engines' KV-overflow preemptions and the tokens they prefill again
        # (an executor that observes them: ExecutorCore.reports_kv_preemptions)
        self.kv_preemptions = 0
        self.kv_recompute_tokens = 0
        self.finished_t: float | None = None
        from jigsaw_plugin.predict import LengthHistory  # lazy: numpy-only, but keeps imports light

        self.history = LengthHistory(max_tokens=spec.max_response_len)  # finished turn lengths
        self.observed = ObservedLengths()  # per-trajectory figures of finished samples
        self.stage_history: dict[str, list] = {}  # stage -> measured durations, in order

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
        stage = self.stages[self.stage_next]
        return None if waits_for_alongside(stage, self.alongside) else stage

    def load(self) -> int:
        return sum(r.load for r in self.replicas) + len(self.pending)

    def early_stages(self) -> tuple[str, ...]:
        """The stages an early pass may run (``algorithms.early_stages``)."""
        return early_stages(self.stages)


def sample_tokens(samples) -> tuple[int, int]:
    """(prompt + generated + observation tokens, generated tokens) of a StepSamples."""
    gen = int(np.sum(samples.gen_tokens))
    obs = int(np.sum(samples.observation_len))
    return int(np.sum(samples.prompt_len)) + gen + obs, gen


class ObservedLengths:
    """Running means of finished trajectories (what a live host has seen): prompt tokens,
    generated tokens, whole context, turns. Empty until the first trajectory finishes.
    Also the mean latency of the tool calls that have returned (``tools`` of them) and of
    the rewards computed so far (``rewards`` of them, each from its trajectory's last token:
    a sandbox running tests, a reward model), where the executor timed them."""

    __slots__ = ("count", "longest", "_prompt", "_generated", "_context", "_turns", "tools", "_tool_s",
                 "rewards", "_reward_s")

    def __init__(self):
        self.count = 0
        self.longest = 0  # the longest trajectory's generated tokens
        self._prompt = self._generated = self._context = self._turns = 0.0
        self.tools = 0
        self._tool_s = 0.0
        self.rewards = 0
        self._reward_s = 0.0

    def record_reward(self, latency_s: float) -> None:
        self.rewards += 1
        self._reward_s += latency_s

    def reward_mean_s(self) -> float:
        """Mean seconds from a trajectory's last token to its reward; 0.0 before any."""
        return self._reward_s / self.rewards if self.rewards else 0.0

    def record_tool(self, latency_s: float) -> None:
        self.tools += 1
        self._tool_s += latency_s

    def tool_mean_s(self) -> float:
        """Mean seconds a returned tool call took; 0.0 before any returned."""
        return self._tool_s / self.tools if self.tools else 0.0

    def record(self, prompt: int, generated: int, context: int, turns: int) -> None:
        self.count += 1
        self.longest = max(self.longest, generated)
        self._prompt += prompt
        self._generated += generated
        self._context += context
        self._turns += turns

    def mean(self, what: str, default: float) -> float:
        """``what`` in prompt | generated | context | turns; ``default`` before any finished."""
        if not self.count:
            return default
        return getattr(self, "_" + what) / self.count


def static_shares(workload) -> list[tuple]:
    """Each pipeline's static device share (spec ``gpus`` or an equal split), as device ids."""
    total = workload.cluster.gpus
    explicit = [p.gpus for p in workload.pipelines]
    rest = [i for i, g in enumerate(explicit) if g is None]
    left = total - sum(g for g in explicit if g is not None)
    shares, start = [], 0
    for i, g in enumerate(explicit):
        if g is None:
            k = rest.index(i)
            g = left // len(rest) + (1 if k < left % len(rest) else 0)
        shares.append(tuple(range(start, start + g)))
        start += g
    return shares


def build_pipelines(workload) -> list[PipelineRun]:
    """The run's pipelines, each with its model profile (and where its training state
    lives) and static share."""
    from jigsaw_plugin.costmodel import model_profile, with_train_offload

    shares = static_shares(workload)
    return [PipelineRun(i, spec, with_train_offload(model_profile(spec.model, f"pipelines[{i}].model"),
                                                    spec.train_offload), shares[i])
            for i, spec in enumerate(workload.pipelines)]
