"""OpenRLHF's ``RemoteExperienceMaker`` with the jigsaw stage hooks around each model pass.

``make_experience`` (``ppo_utils/experience_maker.py:113-233``) dispatches the reward model
(139-149), the actor's old log-probs (154-158), the critic's values (161-172) and the
reference (175-182) through ``_dispatch_forward`` and gathers them with
``_flatten_results``; this subclass fires ``jigsaw_stage_start`` at each dispatch and
``jigsaw_stage_end`` when its results are gathered (OpenRLHF waits for them in that order,
so an end is observed no earlier than the trainer sees it), and wraps
``compute_advantages_and_returns`` (238-340) as the host-only ``adv`` stage. The model
code itself is OpenRLHF's, unchanged.
"""

from __future__ import annotations

from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

from jigsaw_plugin.adapters.openrlhf.hooks import RunHooks, stage

__all__ = ["HookedExperienceMaker"]


class HookedExperienceMaker(RemoteExperienceMaker):
    def __init__(self, *args, hooks: RunHooks, clock, devices_for, **kwargs):
        super().__init__(*args, **kwargs)
        self.hooks, self.clock, self.devices_for = hooks, clock, devices_for
        self._open: dict[int, tuple] = {}  # id(refs) -> (stage, devices, samples, tokens)

    def _stage_of(self, group) -> str:
        if group is self.reward_model_group:
            return "reward"
        if group is self.critic_model_group:
            return "values"
        if group is self.initial_model_group:
            return "ref"
        return "old_log_prob"

    def _emit(self, hook, name, devices, samples, tokens):
        getattr(self.hooks.emit, hook)(pipeline=self.hooks.pipeline, step=self.clock.step, stage=name,
                                       devices=tuple(devices), samples=samples, tokens=tokens, t=self.hooks.now())

    def _dispatch_forward(self, group, sync_condition, **kwargs):
        name = self._stage_of(group)
        sequences = kwargs.get("sequences", [])
        samples = sum(len(s) for s in sequences)
        tokens = int(sum(int(m.sum()) for m in kwargs.get("attention_mask", [])))
        devices = self.devices_for(name)
        self._emit("jigsaw_stage_start", name, devices, samples, tokens)
        refs = super()._dispatch_forward(group, sync_condition, **kwargs)
        self._open[id(refs)] = (name, devices, samples, tokens)
        if sync_condition:  # OpenRLHF already waited for it (colocated models)
            self._close(refs)
        return refs

    def _close(self, refs):
        opened = self._open.pop(id(refs), None)
        if opened is not None:
            name, devices, samples, tokens = opened
            self._emit("jigsaw_stage_end", name, devices, samples, tokens)

    def _flatten_results(self, refs, duplicate_factor):
        out = super()._flatten_results(refs, duplicate_factor)
        self._close(refs)
        return out

    def make_experience(self, samples_list):
        try:
            return super().make_experience(samples_list)
        finally:
            for key in list(self._open):  # a stage OpenRLHF never gathered (an error): end it now
                name, devices, samples, tokens = self._open.pop(key)
                self._emit("jigsaw_stage_end", name, devices, samples, tokens)

    def compute_advantages_and_returns(self, experiences):
        samples = sum(len(e.sequences) for e in experiences)
        tokens = int(sum(int(e.action_mask.sum()) for e in experiences if e.action_mask is not None))
        with stage(self.hooks, self.clock.step, "adv", (), samples, tokens):
            return super().compute_advantages_and_returns(experiences)
