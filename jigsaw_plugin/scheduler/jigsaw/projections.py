"""What the jigsaw policy projects: each pipeline's step and whole run on its static share,
its finish at the observed pace, the job set's critical path, and when busy devices free.

A mixin of ``Jigsaw`` (``policy.py``), as are ``loans``, ``tails``, ``gangs``,
``restarts`` and ``rollout``: its methods read the policy's config and caches through ``self`` and call
one another across the mixins; ``round.py`` holds what they share besides."""

from __future__ import annotations

from jigsaw_plugin.scheduler.estimates import gen_estimate_s, gen_parts_s, observed_stats, train_estimate_s
from jigsaw_plugin.scheduler.jigsaw.round import INF, SHARE_ESTIMATES_KEPT, UNSET

__all__ = ["Projections"]


class Projections:
    """``Jigsaw``'s projections: remaining step and run times, paces, the critical path."""

    def _work_left(self, state, p) -> tuple[float, float]:
        """The rest of ``p``'s run as (device-seconds that spread over devices, seconds that
        do not), from what it has observed on its static share: training and the batched
        bulk of generation scale with devices; each step's longest response and a
        trajectory's tool calls (the observed mean turns of the observed mean call) do not.
        The current step counts whole, so shares move at step ends, not with every request."""
        if p.done:
            return 0.0, 0.0
        share = max(1, len(p.static_devices))
        stats = observed_stats(p)
        bulk, tail = gen_parts_s(p, state.cost, share, stats)
        train = train_estimate_s(p, state.cost, share, stats)
        steps = p.total_steps - p.train_next
        # a trajectory's tool calls wait in sequence whatever the devices: the mean turns' worth
        tail += max(0.0, p.lengths.turns - 1) * p.lengths.tool_s
        return steps * (bulk + train) * share, steps * tail

    def _remaining_s(self, state, p) -> float:
        """Projected time to finish the pipeline's current step on its home devices."""
        gen, train = self._on_share_s(state, p, len(p.static_devices))
        rest = 0.0
        if p.generating:
            rest = max((r.predicted_drain_s() for r in p.replicas), default=0.0)
        elif self._may_start_gen(p):
            rest = gen
        return rest + train

    def _completion_s(self, rnd, p) -> float:
        """Projected time to finish the pipeline's whole run on its static share: this step's
        rest, then its remaining steps at the rate its observed lengths give."""
        got = rnd.completion.get(p.name)
        if got is not None:
            return got
        if p.done:
            rnd.completion[p.name] = 0.0
            return 0.0
        _, per_step = self._step_on_share_s(rnd.state, p)
        later = max(0, p.total_steps - p.train_next - 1)
        rnd.completion[p.name] = got = self._remaining_s(rnd.state, p) + later * per_step
        return got

    def _step_on_share_s(self, state, p) -> tuple[float, float]:
        """(training, whole step) seconds of one step of ``p`` on its static share at its
        observed lengths: an asynchronous step overlaps its generation with training."""
        gen, train = self._on_share_s(state, p, max(1, len(p.static_devices)))
        return train, (max(gen, train) if p.spec.mode == "async" else gen + train)

    def _on_share_s(self, state, p, share: int) -> tuple[float, float]:
        """(``gen_estimate_s``, ``train_estimate_s``) of one step of ``p`` on ``share``
        devices at its observed lengths, each computed once for what it reads."""
        key = (state.cost, p.name, share, p.lengths)  # a run's pipeline name stands for its spec
        got = self._share_s.get(key)
        if got is None:
            if len(self._share_s) >= SHARE_ESTIMATES_KEPT:
                self._share_s.clear()
            stats = observed_stats(p)
            got = self._share_s[key] = (gen_estimate_s(p, state.cost, share, stats),
                                        train_estimate_s(p, state.cost, share, stats))
        return got

    def _critical_s(self, rnd) -> float:
        """The job set's projected completion: the furthest of its pipelines'."""
        if rnd.critical_s is None:
            rnd.critical_s = max((self._completion_s(rnd, p) for p in rnd.state.order if not p.done), default=0.0)
        return rnd.critical_s

    def _slack(self, rnd, p) -> float:
        """How much a tail move may stretch ``p``'s generation: ``latency_slack`` on the job
        set's critical path, up to ``max_slack`` where its completion has headroom."""
        cfg = self.config
        if not (cfg.lookahead and cfg.priority):
            return cfg.latency_slack
        mine = self._completion_s(rnd, p)
        head = (self._critical_s(rnd) - mine) / max(mine, 1e-9)
        return min(cfg.max_slack, max(cfg.latency_slack, head))

    def _busy_for_s(self, state, d) -> float:
        """Projected time until device ``d`` is free: unknown (infinite) for a device with
        no task that is not free, one that left the pool (a preemption: its replacement's
        arrival is not in the state); waiting for it as for one free now held gangs back
        for as long as preemptions kept some device of their home down (odd_workloads
        --preempt seed 200: 300,611 simulated s against 15.5 under one-step-off)."""
        task = state.devices[d].task
        if task is None:
            return 0.0 if d in state.free else INF
        if task.kind == "replica":
            rep = state.replicas.get(task.replica)
            if rep is None:
                return 0.0
            o = state.pipelines[task.pipeline]
            drain = rep.predicted_drain_s()
            if (o.lengths.tool_s > 0 and sum(1 for r in o.replicas if not r.retiring) == 1
                    and self._between_turns(o) > o.load()):
                # the last replica stays for the next turns of the trajectories in tool calls
                # (``_retire_drained``), so what it holds now does not say when it empties
                return max(drain, self._tool_calls_left_s(o))
            return drain
        o = state.pipelines[task.pipeline]
        if task.stage is not None and task.stage == o.alongside_stage:
            end = o.alongside_end_t
            return max(0.0, end - state.t) if end is not None else 0.0
        rs = o.running_stage
        if rs is not None and rs.resize_to is not None and d not in rs.resize_to:
            return max(0.0, rs.boundary_t - state.t)  # being handed back at the next boundary
        end = o.running_stage_end_t
        return max(0.0, end - state.t) if end is not None else 0.0

    @staticmethod
    def _alone(state, p) -> bool:
        """Every pipeline but ``p`` has finished: nothing else will take the devices."""
        return all(o.done for o in state.order if o is not p)

    @staticmethod
    def _tool_calls_left_s(p) -> float:
        """How long ``p``'s trajectories in tool calls keep its rollout going at least: each
        returns after its call, then may call again, about half the observed mean turns
        left, at the observed mean call (``LengthSummary.tool_s``; at least one call)."""
        return p.lengths.tool_s * max(1.0, (p.lengths.turns - 1) / 2)

    @staticmethod
    def _between_turns(p) -> int:
        """Trajectories of ``p``'s generating steps that no replica holds now: in a tool call
        or a sandbox, their next turn still to come."""
        if not p.generating:
            return 0
        open_ = 0
        for k in range(p.train_next, p.gen_next):  # the steps before are trained: all generated
            s = p.steps.get(k)
            if s is not None:
                open_ += s.samples - s.gen_done
        return max(0, open_ - p.load())

    @staticmethod
    def _reward_wait_s(o, t: float) -> float:
        """``reward_wait``: how long ``o``, whose step has generated every trajectory and
        waits on their rewards, leaves its home unused, less the time it has waited so far:
        at least the shortest wait from a step's last generated trajectory to its last reward
        that its earlier steps saw, and at least the mean reward of the trajectories so far
        (the step's last trajectory takes one too: this holds from a pipeline's first step).
        0 (it wants its home now) before any reward was timed, or when nothing waits on
        rewards."""
        s = o.steps.get(o.train_next)
        if s is None or s.gen_end_t is None or s.gen_done < s.samples or s.rewarded >= s.samples:
            return 0.0
        waits = o.stage_history_s.get("reward")
        wait = max(min(waits) if waits else 0.0, o.lengths.reward_s)
        return max(0.0, wait - (t - s.gen_end_t))

    def _paced_finish_t(self, p) -> float | None:
        """When ``p`` is projected to finish its run at the pace of its steps so far (the
        wall time its trained steps took, observed; None before its first step is trained).
        The clock is the start of the next step to train's generation: a synchronous step's
        starts once every step before it is trained; an asynchronous one's under staleness
        ``s`` once all but the last ``s`` are (it generates ``s`` steps ahead), so those
        ``s`` are not counted (counted, a pipeline at staleness 1 whose second step started
        at t = 0 was projected to finish at 0, and off the critical path)."""
        s = p.steps.get(p.train_next)
        trained = p.train_next - self.staleness_bound(p)
        if p.done or trained <= 0 or s is None:
            return None
        return s.gen_start_t * p.total_steps / trained

    def _paced_critical(self, rnd, p) -> bool:
        """``p`` is projected, at its observed pace, to finish within ``latency_slack`` of
        the last of the pipelines: its chain is the job set's makespan. Before its first
        step ends (no pace), with ``predicted_pace``: ``p`` is the one pipeline projected
        to finish clearly last (``_predicted_last``)."""
        mine = self._paced_finish_t(p)
        if mine is None:
            return self._predicted_last(rnd) is p
        return mine >= (1 - self.config.latency_slack) * self._paced_last(rnd)

    def _predicted_last(self, rnd):
        """With ``predicted_pace``: the pipeline with no pace observed yet whose projected
        finish (``_projected_finish_t``) is past every other pipeline's by more than
        ``max_slack``, or None. Once a round."""
        if rnd.predicted_last is not UNSET:
            return rnd.predicted_last
        rnd.predicted_last = None
        if not self.config.predicted_pace:
            return None
        left = [q for q in rnd.state.order if not q.done]
        if not any(self._paced_finish_t(q) is None for q in left):
            return None  # every pipeline has a pace
        top = self._projected_last(rnd)
        rest = max((self._projected_finish_t(rnd, q) for q in left if q is not top), default=0.0)
        if self._paced_finish_t(top) is None and self._projected_finish_t(rnd, top) > (1 + self.config.max_slack) * rest:
            rnd.predicted_last = top
        return rnd.predicted_last

    def _projected_finish_t(self, rnd, p) -> float:
        """When ``p`` is projected to finish its run: at its observed pace
        (``_paced_finish_t``); before its first step ends, now plus the rest of its step and
        its later steps at the rate its observed lengths give on its static share
        (``gen_estimate_s``, ``train_estimate_s``; the step's rest is its projected length
        less the time since its generation started). No length prediction is read: every
        round asks for every pipeline's. Once a round a pipeline."""
        got = rnd.projected.get(p.name)
        if got is not None:
            return got
        got = self._paced_finish_t(p)
        if got is None:
            t = rnd.state.t
            train, per_step = self._step_on_share_s(rnd.state, p)
            s = p.steps.get(p.train_next)
            since = t - s.gen_start_t if s is not None else 0.0
            later = max(0, p.total_steps - p.train_next - 1)
            got = t + max(train, per_step - since) + later * per_step
        rnd.projected[p.name] = got
        return got

    def _projected_last(self, rnd):
        """The unfinished pipeline projected to finish last (``_projected_finish_t``), or
        None when every pipeline has finished."""
        left = [q for q in rnd.state.order if not q.done]
        return max(left, key=lambda q: self._projected_finish_t(rnd, q)) if left else None

    def _paced_last(self, rnd) -> float:
        """The latest projected finish of the pipelines at their observed paces (once a
        round: _lendable asks for every free device's owner), or the projected finish of
        the pipeline projected to finish clearly last (``_predicted_last``)."""
        if rnd.paced_last is None:
            rnd.paced_last = max((f for q in rnd.state.order if (f := self._paced_finish_t(q)) is not None),
                                 default=0.0)
            top = self._predicted_last(rnd)
            if top is not None:
                rnd.paced_last = max(rnd.paced_last, self._projected_finish_t(rnd, top))
        return rnd.paced_last

    def _near_critical(self, rnd, p) -> bool:
        """``p`` may be on the job set's critical path: before its first step ends (no pace
        observed yet), or projected at its observed pace to finish within ``max_slack`` of
        the last of the pipelines."""
        mine = self._paced_finish_t(p)
        return mine is None or mine >= (1 - self.config.max_slack) * self._paced_last(rnd)

    def _within_slack_of_last(self, rnd, p) -> bool:
        """``p`` is projected (``_projected_finish_t``) to finish within ``max_slack`` of the
        last of the unfinished pipelines."""
        last = self._projected_finish_t(rnd, self._projected_last(rnd))
        return self._projected_finish_t(rnd, p) >= (1 - self.config.max_slack) * last

    def _in_tail(self, p) -> bool:
        """The rollout is down to its tail (the engines' loads say so): ``widen_requests``
        or fewer requests in all, the devices of the rest free from here on."""
        return sum(r.load for r in p.replicas if not r.retiring) + p.pending <= self.config.widen_requests

    def _returns_in_s(self, rnd, d) -> float:
        """Projected time until device ``d`` is free, counting a stage's hand-back asked for
        earlier in this round (at its next micro-batch boundary)."""
        state = rnd.state
        task = state.devices[d].task
        if task is not None and task.kind == "stage":
            o = state.pipelines[task.pipeline]
            if o.running_stage is not None and d not in rnd.stage_devices(o):
                return max(0.0, o.running_stage.boundary_t - state.t)
        return self._busy_for_s(state, d)
