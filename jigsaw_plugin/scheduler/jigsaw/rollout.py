"""Rollout replicas: how many and how wide, where they go (home first, then devices other
pipelines can spare), a crowded critical rollout spread mid-step, admission limits, and
(``move_preempted``) preempted requests resumed on a sibling.

A mixin of ``Jigsaw`` (``policy.py``); see ``projections.py`` for how the mixins fit."""

from __future__ import annotations

import math

import numpy as np

from jigsaw_plugin.scheduler.activation import activate, trainer_site
from jigsaw_plugin.scheduler.admission import HeldFit, launch_limit, spread_of, trade_count
from jigsaw_plugin.scheduler.decisions import AdmissionLimit, LaunchReplica, Migrate
from jigsaw_plugin.scheduler.estimates import (gen_estimate_s, observed_stats, holding_replica, rollout_tp,
                                               train_estimate_s)
from jigsaw_plugin.scheduler.jigsaw.round import UNSET, batch_held, ended_replicas, limit_of, running_context
from jigsaw_plugin.scheduler.jigsaw.trials import launch_width, running_width
from jigsaw_plugin.scheduler.state import ReplicaView

__all__ = ["RolloutReplicas"]


class RolloutReplicas:
    """``Jigsaw``'s rollout replicas: their count, width, devices and batch limits."""

    def _launch_limits_of(self, rnd, p, groups) -> dict:
        """Devices (a tuple) -> the batch limit a replica of ``p`` on them starts with
        (``admission.launch_limit`` on the pipeline's recent finished first turns, in the KV
        cache its width holds on its devices' class; None: no limit: nothing observed yet, or
        the engine's own is lower)."""
        state = rnd.state
        if p.history is None:
            return {}
        lengths = p.history.recent_lengths(0)
        out, of = {}, {}  # of: (width, its class's cost model) -> limit, computed once
        for g in groups:
            cost = state.cost_of(g)
            key = (len(g), id(cost))
            if key not in of:
                n = launch_limit(lengths, p.lengths.prompt_tokens, cost.kv_capacity_tokens(p.model, len(g)))
                of[key] = n if n is not None and n < state.max_num_seqs else None
            out[tuple(g)] = of[key]
        return out

    def _limit_before_start(self, rnd, p, live, out) -> None:
        """A step's requests reach the pipeline's live replicas as it starts, and an engine
        admits what fits at once: each gets the launch limit of its width first."""
        limits = self._launch_limits_of(rnd, p, [r.devices for r in live])
        ended = ended_replicas(out)
        for r in live:
            if r.id in ended:
                continue
            n = limits.get(tuple(r.devices))
            if n != limit_of(r, rnd.state.max_num_seqs):
                out.append(AdmissionLimit(r.id, n))

    def _limit_admission(self, rnd, out) -> None:
        """Each replica with requests waiting admits them only while the expected KV peak
        of what it then runs stays within its cache (``admission.fitting`` on the
        requests' predicted remaining tokens, spread as the pipeline's recent lengths;
        below its running sequences where they alone outgrow it, ``shed_admission``); a
        replica whose requests fit with room to spare (``_fits_at_means``) is not read (no
        prediction asked). The others are read together first
        (``ReplicaView.read_together``), and a replica's count is kept while its arrays
        are the same (``FittingMemo``)."""
        state = rnd.state
        top = state.max_num_seqs
        ended = ended_replicas(out)
        waiting = [(p, r, self._fits_at_means(p, r))
                   for p in state.order for r in p.replicas
                   if not (r.retiring or r.id in ended or not r.queued or r.id in rnd.moved_in)]
        ReplicaView.read_together([r for _, r, fits in waiting if not fits])
        shapes: dict = {}
        self._fitting.round()
        for p, r, fits in waiting:
            if fits:
                if limit_of(r, top) is not None:
                    out.append(AdmissionLimit(r.id, None))
                continue
            held, left, running = r.kv_columns()
            if p.name not in shapes:
                shapes[p.name] = spread_of(p.history.recent_lengths()) if p.history is not None else None
            shape = shapes[p.name]
            most = min(top, len(held))  # any count from here on admits all the engine runs at once
            n = self._fitting.fitting(r.id, held, left, r.kv_capacity, shape, self.config.admission_margin_sd,
                                      running, most)
            if n < running and not self.config.shed_admission:
                n = running  # the running set overflows; admit nothing more, shed nothing
            if self.config.admission_trade:
                first = n
                n = self._fitting.traded(r.id, first, most,
                                         lambda: self._traded(state, p, r, held, left, shape, first, most))
            limit = None if n >= most else max(1, n)
            if limit != limit_of(r, top):
                out.append(AdmissionLimit(r.id, limit))

    @staticmethod
    def _traded(state, p, r: ReplicaView, held, left, shape, first: int, top: int) -> int:
        """``admission.trade_count`` for replica ``r``: decode steps and recompute priced by
        the cost model of its devices' class at its width."""
        cost, tp = state.cost_of(r.devices), len(r.devices)
        return trade_count(held, left, r.kv_capacity, shape, first, top,
                           lambda b, kv: cost.decode_steps_s(p.model, tp, b, kv), cost.prefill_s(p.model, tp, 1.0))

    def _move_preempted(self, rnd, out) -> None:
        """``move_preempted``: the waiting requests of the pipeline projected to finish last
        that its engines preempted (a queued request with tokens generated: vLLM re-queues a
        preempted sequence and recomputes its KV on resuming) move to sibling replicas with
        no queue whose caches hold them by the admission rule (``admission.fitting`` on the
        KV each sequence holds and its predicted remaining tokens, the sibling's own first):
        the roomiest sibling first, in the order the queue would admit them. A request that
        waits for its next turn keeps its replica (its context is in that prefix cache),
        and one never admitted waits where the router put it."""
        if not any(r.queued for q in rnd.state.order if q.generating for r in q.replicas):
            return  # no engine holds a waiting request: nothing to move, no projection needed
        p = self._projected_last(rnd)
        if p is None or not p.generating:
            return
        ended = ended_replicas(out)
        live = [r for r in p.replicas if not (r.retiring or r.id in rnd.gone or r.id in ended)]
        srcs = sorted((r for r in live if r.queued), key=lambda r: (-r.queued, r.id))
        dsts = sorted((d for d in live if not d.queued and d.running < d.max_seqs and d.id not in rnd.moved_in),
                      key=lambda d: (d.kv_tokens / max(1.0, d.kv_capacity), d.id))
        if not srcs or not dsts:
            return
        shape = spread_of(p.history.recent_lengths()) if p.history is not None else None
        margin = self.config.admission_margin_sd
        held_by: dict = {}  # destination -> its KV columns, with what this round moved to it
        fits: dict = {}  # destination -> its held sequences' expected KV, summed once (``HeldFit``)
        for src in srcs:
            waiting = [v for v in src.requests if v.queued and v.generated > 0]
            for d in dsts:
                if not waiting:
                    break
                if d.id not in held_by:
                    held, left, running = d.kv_columns()
                    held_by[d.id] = (held, left, running)
                held, left, running = held_by[d.id]
                take = waiting[:max(0, d.max_seqs - len(held))]  # within its batch limit
                if not take:
                    continue
                fit = fits.get(d.id)
                if fit is None:
                    fit = fits[d.id] = HeldFit(held, left, d.kv_capacity, shape, margin, running)
                take_kv = [v.kv_tokens for v in take]
                take_left = [v.predicted_remaining for v in take]
                k = fit.count(take_kv, take_left) - len(held)
                if k <= 0:
                    continue
                h = np.concatenate((held, take_kv))
                rest = np.concatenate((left, take_left))
                held_by[d.id] = (h[:len(held) + k], rest[:len(held) + k], running)
                fits.pop(d.id, None)  # its held sequences changed
                out.append(Migrate(src.id, d.id, tuple(v.id for v in waiting[:k])))
                n_in, kv_in = rnd.moved_in.get(d.id, (0, 0.0))
                rnd.moved_in[d.id] = (n_in + k, kv_in + float(sum(v.kv_tokens for v in waiting[:k])))
                waiting = waiting[k:]

    @staticmethod
    def _fits_at_means(p, r: ReplicaView) -> bool:
        """The replica's cache holds what it has now, each queued request's mean prompt, and
        every sequence, running or queued, generating the pipeline's mean trajectory again:
        its limit needs no prediction. Not "every sequence at the mean final context": the
        mean is of trajectories finished so far, the short ones while a step's long ones
        still run, and those already hold more than it (on synthetic mix s2 a 32B PPO's
        replicas passed that test with 110 sequences running, and 273 of its 344
        preemptions followed admissions it let through at the engine's own limit)."""
        lens = p.lengths
        return r.kv_tokens + r.queued * lens.prompt_tokens + r.load * lens.generated_tokens <= r.kv_capacity

    def _spread_batch(self, state, p, tp: int, context: float) -> int:
        """The smallest batch at which a decoded token costs at most ``spread_cost`` x its
        cost at the engine's largest batch: replicas below it waste device-seconds."""
        cost, top = state.cost, state.max_num_seqs
        ideal = cost.decode_step_s(p.model, tp, top, top * context) / top
        b = top
        while b > 1 and cost.decode_step_s(p.model, tp, b // 2, b // 2 * context) / (b // 2) <= self.config.spread_cost * ideal:
            b //= 2
        return b

    def _wanted_replicas(self, rnd, p) -> int:
        state = rnd.state
        tp = self._bulk_tp(rnd, p)
        home = rnd.home[p.name][0]
        if not self.config.resize:
            return max(1, len(home) // tp)
        ctx = max(1.0, p.lengths.context_tokens)
        per = batch_held(state, p.model, tp, ctx)
        outstanding = p.load() if p.generating else p.spec.samples_per_step
        want = max(math.ceil(outstanding / per), len(home) // tp, 1)
        if self._borrows() and not p.generating:
            # a step's rollout starts on more than its home: as many replicas as keep each
            # near its ideal batch (later, consolidation shrinks it as the batch thins)
            spread = min(per, self._spread_batch(state, p, tp, ctx / 2))
            if self._last_left(state, p):
                spread = min(spread, self._fast_batch(state, p, tp, ctx / 2))
            elif orphans := self._orphan_replicas(rnd, p, tp):
                # a step near the critical path also takes the free devices no unfinished
                # pipeline owns, at the faster batch, as the last pipeline's would
                fast = math.ceil(outstanding / max(1, min(spread, self._fast_batch(state, p, tp, ctx / 2))))
                want = max(want, min(fast, math.ceil(outstanding / max(1, spread)) + orphans))
            want = max(want, math.ceil(outstanding / max(1, spread)))
        return want

    def _orphan_replicas(self, rnd, p, tp: int) -> int:
        """``orphan_spread``: width-``tp`` replicas the free devices no unfinished pipeline's
        home holds (``_orphaned``) make room for, where ``p``, synchronous, is projected to
        finish within ``max_slack`` of the last of the pipelines (``_projected_finish_t``):
        its step's rollout starts on them too (no owner wants them back); 0 otherwise."""
        if not (self.config.orphan_spread and self.config.idle_spread) or p.spec.mode != "sync":
            return 0
        orphans = sum(1 for d in rnd.free if self._orphaned(rnd, d)) // tp
        if not orphans:
            return 0
        return orphans if self._within_slack_of_last(rnd, p) else 0

    @staticmethod
    def _orphaned(rnd, d: int) -> bool:
        """Device ``d`` is in no unfinished pipeline's home (its owner has finished, or
        the pool's shares leave it out)."""
        owner = rnd.owner.get(d)
        return owner is None or rnd.state.pipelines[owner].done

    def _grow_fills(self, rnd, p) -> int:
        """New replicas the requests waiting for a batch slot fill (a "grow" demand, whose
        ``LaunchReplica`` takes them: ``rebalance``): each admits as many as an engine's
        batch and KV cache hold at the context its running requests hold now, as the
        engine admits them. A replica launched beyond them starts empty and is retired the
        next round: on a synthetic mix (s21) a rollout waiting for 3,051 slots grew onto its
        whole home of 32 devices and its first three new replicas admitted them all; 4,802
        of the run's 5,066 replicas were closed so, 350 with this count (docs/simulator.md,
        "Growing a rollout")."""
        live = [r for r in p.replicas if not r.retiring]
        waiting = p.pending + sum(r.queued for r in live)
        if not waiting:
            return 0
        state, tp = rnd.state, self._bulk_tp(rnd, p)
        running = sum(r.running for r in live)
        ctx = sum(r.kv_tokens for r in live) / running if running else p.lengths.context_tokens
        return math.ceil(waiting / batch_held(state, p.model, tp, max(1.0, ctx)))

    def _last_left(self, state, p) -> bool:
        """``p`` is the run's last unfinished pipeline, synchronous (an asynchronous one's
        next step could use the devices its rollout frees), and ``idle_spread`` is on."""
        return (self.config.idle_spread and self._alone(state, p)
                and p.spec.mode == "sync")

    def _fast_batch(self, state, p, tp: int, context: float) -> int:
        """Sequences a replica takes at the step's start under ``idle_spread``: those that
        keep its decoding batch at the size below which halving it shortens a decode step
        by less than ``idle_spread_gain`` (smaller batches buy little speed). A multi-turn
        trajectory decodes for only part of its time, the rest in tool calls (observed mean
        latency x turns after the first), so a replica takes that many more."""
        cost, b = state.cost, state.max_num_seqs
        keep = 1.0 - self.config.idle_spread_gain
        while b > 1 and cost.decode_step_s(p.model, tp, b // 2, b // 2 * context) <= keep * cost.decode_step_s(
                p.model, tp, b, b * context):
            b //= 2
        lens = p.lengths
        tools = lens.tool_s * max(0.0, lens.turns - 1.0)
        if tools <= 0.0:
            return b
        decoding = lens.generated_tokens * cost.decode_step_s(p.model, tp, b, b * context)
        return math.ceil(b * (decoding + tools) / max(decoding, 1e-9))

    def _spread_pick(self, rnd):
        """(pipeline, batch) for ``critical_spread``: the pipeline projected to finish last
        (``_projected_finish_t``: at its observed pace, or from its observed lengths; no
        length prediction is read), if it is generating and no batch of it waits to be
        trained, and the batch its replicas aim at (``_fast_batch`` at the context its
        running requests hold); None otherwise. Once a round."""
        if rnd.spread is not UNSET:
            return rnd.spread
        rnd.spread = None
        cfg = self.config
        if not (cfg.critical_spread and cfg.migration and self._borrows()):  # borrowing needs multiplex
            return None
        p = self._projected_last(rnd)
        if p is None:
            return None
        if not p.generating or self._rollout_cap(rnd, p) is not None:
            return None  # its rollout is not what sets the makespan now, or a batch of it waits to be trained
        if not any(r.running for r in p.replicas if not r.retiring):
            return None
        rnd.spread = (p, self._aim_batch(rnd, p, self._bulk_tp(rnd, p)))
        return rnd.spread

    def _crowd_at(self, rnd, p, width: int) -> int | None:
        """The batch at which a width-``width`` replica of ``p`` counts as crowded, where
        ``p`` is the pipeline ``critical_spread`` serves (None otherwise): twice the batch a
        spread aims at (on that width under ``spread_in_tail``; at the launch width
        without). No tail merge leaves a replica of it that crowded: a spread would undo it."""
        pick = self._spread_pick(rnd) if self.config.critical_spread else None
        if pick is None or pick[0] is not p:
            return None
        return 2 * (self._aim_batch(rnd, p, width) if self.config.spread_in_tail else pick[1])

    def _aim_batch(self, rnd, p, width: int) -> int:
        """The batch a spread of ``p`` (the pipeline ``critical_spread`` serves) aims at on
        a width-``width`` replica (``_fast_batch`` at the context its running requests
        hold), once a round per width."""
        got = rnd.aim.get(width)
        if got is None:
            ctx = running_context([r for r in p.replicas if not r.retiring])
            got = rnd.aim[width] = self._fast_batch(rnd.state, p, width, ctx)
        return got

    def _spread_critical(self, rnd, out) -> None:
        """``critical_spread``: the crowded rollout furthest from completing takes free
        devices its home has and devices whose owners can spare them until it drains, as
        new replicas that take running requests from the most loaded (``LaunchReplica``
        with ``spread``). A replica is crowded at twice the batch a spread aims at
        (``_crowd_at``), and the tail consolidation merges none of the pipeline's replicas
        into a crowded one (no spread and merge in turn); under ``spread_in_tail`` a tail
        spreads too (where ``_widen_tails`` has not re-sharded it this round)."""
        if not rnd.free or not any(
                not p.done and p.generating and any(not r.retiring for r in p.replicas) for p in rnd.state.order):
            return
        pick = self._spread_pick(rnd)
        if pick is None:
            return
        p, batch = pick
        state, cfg = rnd.state, self.config
        if p.pending or (self._in_tail(p) and not cfg.spread_in_tail):
            return  # a tail is re-sharded wider instead (``_widen_tails``)
        live = [r for r in p.replicas if not r.retiring and r.id not in rnd.gone]
        if not live or max(r.running for r in live) < 2 * batch:
            return
        load = sum(r.load for r in live)
        want = math.ceil(load / batch) - len(live)
        if want <= 0:
            return
        drain, last = max(((r.predicted_drain_s(), r) for r in live), key=lambda x: x[0])
        if last.running < 2 * batch:
            return  # the replica that ends last is not crowded: a spread would not end it sooner
        if cfg.spread_in_tail and last.running < self._crowd_at(rnd, p, last.tp):
            return  # nor at its own width (a re-shard made it wider)
        tp = self._bulk_tp(rnd, p)
        pool = [d for d in self._affinity(rnd, p, rnd.share[p.name], "rollout") if d in rnd.free]
        pool += [d for d in self._lendable(rnd, p, drain, replica=True) if d not in pool]
        groups = self._take_groups(rnd, p, pool, [d for r in live for d in r.devices], tp, [], want)
        if not groups:
            return
        ctx = running_context(live)
        step_now = state.cost_of(last.devices).decode_step_s(p.model, last.tp, last.running, last.kv_tokens)
        # a replica runs what its KV cache holds and queues the rest: its drain is its load in
        # waves of that batch
        waves_now_s = step_now * last.load / max(1, last.running)
        # each new replica at its own class (one class: the pool's cost model, and this keeps
        # every group the pricing below would): one whose class drains the average load
        # slower than the relieved replica drains its own would end after it. A 7B's 30K-token
        # contexts spread onto 24 GB devices, priced as the pool's first class (H100), queued
        # 6 of the 8 requests each took, to be moved again (heterogeneous synthetic mix 33)
        per = max(1.0, load / (len(live) + len(groups)))
        priced = [(g, state.cost_of(g)) for g in groups]
        priced = [(g, c) for g, c in priced if self._waves_s(state, p, tp, per, ctx, c) < waves_now_s]
        if not priced:
            return
        groups = [g for g, _ in priced]
        per = max(1.0, load / (len(live) + len(groups)))
        # the slower of the relieved replica and a new one on its own width (narrower than a
        # widened tail's: the requests it takes decode slower there), each at its class
        classes = {c for _, c in priced}
        waves_new_s = max(self._waves_s(state, p, w, per, ctx, c) for w in (last.tp, tp) for c in classes)
        saved = drain * (1.0 - waves_new_s / waves_now_s)
        price = max(c.context_switch_s(p.model, tp, train_state=False) + c.migration_s(p.model, tp, per * ctx)
                    for c in classes)
        if saved < cfg.min_gain * price:
            return
        for g in groups:
            out.append(LaunchReplica(p.name, g, spread=True))
            rnd.free.difference_update(g)

    @staticmethod
    def _waves_s(state, p, width: int, load: float, ctx: float, cost=None) -> float:
        """Seconds a width-``width`` replica of ``p`` takes per token of its ``load``
        requests at context ``ctx``: a decode step of the batch its KV cache holds (at most
        ``max_num_seqs``), once per wave of that batch the load makes; at ``cost`` (a
        device class's; None: the pool's first)."""
        cost = cost or state.cost
        run = max(1.0, min(load, batch_held(state, p.model, width, max(ctx, 1.0), cost)))
        return cost.decode_step_s(p.model, width, round(run), run * ctx) * load / run

    def _home_returning(self, rnd, p, now: int, want: int) -> bool:
        """``p``'s step would start its rollout on ``now`` of the ``want`` replicas it wants,
        while busy home devices for at least as many more are projected free within
        ``home_wait`` of its projected generation (``wait_for_home``)."""
        cfg = self.config
        if not (cfg.wait_for_home and cfg.lookahead) or now >= want or self._rollout_cap(rnd, p) is not None:
            return False  # (an asynchronous rollout held to part of its home takes no more)
        state = rnd.state
        tp = self._bulk_tp(rnd, p)
        horizon = cfg.home_wait * gen_estimate_s(p, state.cost, max(1, len(p.static_devices)), observed_stats(p))
        # busy when the round began (devices this round's decisions took are not coming back)
        soon = sum(1 for d in rnd.share[p.name]
                   if state.devices[d].task is not None and self._returns_in_s(rnd, d) <= horizon)
        return min(want - now, soon // tp) >= max(1, now)

    def _bulk_tp(self, rnd, p) -> int:
        """The width a rollout's replicas decode on (``bulk_width``): the narrowest of the
        spec's width and its doublings (within a node, no wider than the model's KV heads,
        which a wider replica would copy, and only widths vLLM can shard it over) whose decoded token costs within 5% of the
        cheapest, at the batch its KV cache holds at the context observed so far (the
        requests outstanding at most; ``fill_width``: a step's rollout off the critical
        path at the batch its requests give the replicas its home's free devices hold,
        since it fills them: 32 requests on 4 devices run 8 a one-device replica, where a
        4-device replica runs all 32 with a faster step and a cheaper token). A long
        context fills a narrow replica's cache with a few sequences, each decode step
        reading the weights for them alone; a wider replica holds more sequences per copy
        of the weights. Before any trajectory has finished
        (no context observed) the spec's width: the prior, the length budget, would widen
        every rollout."""
        got = rnd.bulk_tp.get(p.name)
        if got is None:
            # ``fill_width``: a step's rollout off the critical path starts on its home's free
            # devices (the spreads and loans serve the critical one's)
            fills = 0
            if self.config.fill_width and not p.generating and not self._paced_critical(rnd, p):
                fills = sum(1 for d in rnd.home[p.name][0] if d in rnd.free)
            got = rnd.bulk_tp[p.name] = self._cheapest_width(rnd, p, fills)
        return got

    def _cheapest_width(self, rnd, p, fills: int = 0) -> int:
        """``_bulk_tp``'s choice, computed once a round. ``fills``: the devices the
        rollout's replicas will fill (0: as many replicas as its requests need), so that
        each width is priced at the batch its replicas will run."""
        state = rnd.state
        base = rollout_tp(p, state.cost)
        if not (self.config.bulk_width and self.config.resize) or p.lengths.observed == 0:
            return base
        cost, m = state.cost, p.model
        ctx = max(1.0, p.lengths.context_tokens)
        n = max(1, p.load() if p.generating else p.spec.samples_per_step)
        per_token = {}
        for w in m.tp_widths(min(state.gpus_per_node, max(base, m.kv_heads))):
            if w < base:
                continue
            # the batch each replica runs: what its cache holds, or fewer where the requests
            # are spread over ``fills // w`` replicas
            b = min(batch_held(state, m, w, ctx), n / max(1, fills // w))
            per_token[w] = cost.decode_step_s(m, w, b, b * ctx) * w / b
        if not per_token:
            return base
        if self.config.alone_width and self._last_left(state, p):
            widths = sorted(per_token)
            projected = self._fastest_bulk_width(state, p, widths, n, ctx)
            if not self.config.width_trials:
                return projected
            if p.generating:
                return running_width(p.steps.get(p.gen_next - 1), projected)
            fit = [w for w in widths if w <= len(state.devices)]  # a replica the pool holds
            got, keep = launch_width(p.step_widths, p.spec.steps - p.gen_next, fit, projected)
            rnd.width_plan[p.name] = (got, keep)  # the step's StartGen records it
            return got
        cheapest = min(per_token.values())
        return min(w for w, c in per_token.items() if c <= 1.05 * cheapest)

    @staticmethod
    def _fastest_bulk_width(state, p, widths: list, n: int, ctx: float) -> int:
        """``alone_width``: the run's last synchronous pipeline (no one else will use a
        device: what a token costs in device-seconds no longer matters) launches its rollout
        at the width of ``widths`` whose replicas, over every device of the pool, end the
        bulk of its ``n`` requests soonest: each replica's share decoded in waves of the batch
        its KV cache holds at the observed context, and its prompts and observations
        prefilled. Its tail is left out (a tail is re-sharded wider anyway, ``_widen_tails``;
        priced in, the longest trajectory alone widened a 1.5B's and a 32B's whole rollouts,
        2% slower each). The narrowest within 0.1% of the fastest; none wider than the pool
        (a pool of 6 devices on nodes of 8 once launched no 8-wide replica, and stalled)."""
        cost, m, lens = state.cost, p.model, p.lengths
        best = None
        for w in widths:
            if w > len(state.devices) and best is not None:
                break  # (``widths`` ascending; the narrowest stands if none fits)
            per = n / max(1, len(state.devices) // w)
            b = max(1.0, min(batch_held(state, m, w, ctx), per))
            t = per * lens.generated_tokens / b * cost.decode_step_s(m, w, round(b), b * ctx)
            t += cost.prefill_s(m, w, per * max(0.0, ctx - lens.generated_tokens))
            if best is None or t < best[0] * (1 - 1e-3):
                best = (t, w)
        return best[1]

    def _cost_aware(self, state) -> bool:
        """Whether rollout goes on activation's devices and training on the trainer's site: a
        pool of several device classes, some of them spot or behind a link. A pool of
        on-demand classes in one data centre has nothing for activation to choose (every
        device is billed for the whole run, idle or not); there the trainer's site, its first
        class, kept training off the others and rollout off it (odd_workloads --classes seed
        60: a 7B and a 14B on two classes of RTX 4090-like devices, 91.1 s against 71.9 s
        with activation off and 80.0 s under verl-sync)."""
        return (self.config.cost_aware and len(state.classes) > 1
                and any(c.preemptible or c.link is not None for c in state.classes))

    def _borrows(self) -> bool:
        """Rollout replicas go beyond the home only where the look-ahead can tell how long
        their owners can spare the devices (greedy borrowing starved (c)'s trainers: -66%)."""
        cfg = self.config
        return cfg.borrow and cfg.multiplex and cfg.resize and cfg.lookahead

    def _rollout_cap(self, rnd, p) -> int | None:
        """Home devices an asynchronous pipeline's rollout may hold while a batch of it waits
        to be trained (``async_reserve``); None: no cap.

        Under a staleness bound the next step's rollout overlaps this step's training, and
        the two share the home. A training gang cannot grow once started, a rollout can add
        replicas at any time: so the gang's part is kept free for it, and the rollout gets
        the split of the home that balances the next step's generation against this step's
        training (both projected from the lengths observed so far; a whole number of
        replicas, at least one). While no batch waits (the step to train next is still
        generating) the rollout is what holds the training back: no cap. A step generated
        in full counts as waiting while its rewards are computed (a sandbox): the gang
        will want its part when they are in, and a rollout started in the wait would hold it."""
        if p.name in rnd.rollout_cap:
            return rnd.rollout_cap[p.name]
        cap = None
        s = p.steps.get(p.train_next)
        cfg = self.config
        if (cfg.async_reserve and cfg.resize and p.spec.mode == "async" and not p.done
                and s is not None and s.gen_done >= s.samples):
            cost, stats = rnd.state.cost, observed_stats(p)
            tp = self._bulk_tp(rnd, p)
            n = len(rnd.share[p.name])
            cap = tp
            if n > tp:
                cap = min(range(tp, n, tp), key=lambda r: (max(gen_estimate_s(p, cost, r, stats),
                                                               train_estimate_s(p, cost, n - r, stats)), r))
        rnd.rollout_cap[p.name] = cap
        return cap

    def _rollout_room(self, rnd, p) -> int:
        """Free home devices a training gang of ``p`` leaves for its rollout: what its
        rollout cap allows beyond the replicas it holds, when the rollout wants devices now
        (its next step may start, or requests wait for a replica)."""
        cap = self._rollout_cap(rnd, p)
        if cap is None:
            return 0
        wants = (self._may_start_gen(p) and not p.generating) or p.pending > 0 or any(r.queued for r in p.replicas)
        if not wants:
            return 0
        return self._under_cap(rnd, p, cap, self._bulk_tp(rnd, p))

    def _under_cap(self, rnd, p, cap: int, tp: int) -> int:
        """Home devices ``p``'s rollout may still take under ``cap``: whole replicas."""
        return max(0, (cap - self._rollout_held(rnd, p)) // tp * tp)

    @staticmethod
    def _rollout_held(rnd, p) -> int:
        """Home devices ``p``'s live rollout replicas hold."""
        mine = set(rnd.share[p.name])
        return sum(1 for r in p.replicas if not r.retiring for d in r.devices if d in mine)

    def _replica_devices(self, rnd, p, want) -> list:
        if want <= 0:
            return []
        state, free = rnd.state, rnd.free
        tp = self._bulk_tp(rnd, p)
        home = rnd.home[p.name][0]
        if self.config.resize:  # idle training-home devices may serve the rollout too
            home = self._affinity(rnd, p, rnd.share[p.name], "rollout")
        avail = holding_replica(state, p.model, [d for d in home if d in free], tp)
        cap = self._rollout_cap(rnd, p)
        if cap is not None:  # the rest of the home is its training gang's (async_reserve)
            site = trainer_site(state) if self._cost_aware(state) else ()
            if len(site) < state.gpus:
                # and off the trainer's site, where its gang trains (unless the site is the
                # whole pool): counted in devices only, the cap let the next rollout start on
                # the site's 4 H100 while a batch waited (heterogeneous S = 2, seed 1: 644.6 s,
                # 618.8 s with this alone; docs/simulator.md)
                avail = [d for d in avail if d not in site]
            avail = avail[:self._under_cap(rnd, p, cap, tp)]
        if self._cost_aware(state):
            avail = list(activate(state, p, avail, tp).devices)
        if not self.config.resize and len(avail) < want * tp:
            return []
        groups = self._node_groups(state, avail, tp, cut=False)[:want]
        if len(groups) < want and self._borrows():
            # the rest on other pipelines' spare devices, for as long as the rollout is
            # projected to run, with the home's leftovers of a node: a tp4 on the home's 8, 9
            # and the spare 10, 11 of their node before one on the home's 2, 3, 8, 9 cut
            # across two (odd_workloads seed 393: a 32B's, its steps 3% slower)
            if p.generating:
                duration = max((r.predicted_drain_s() for r in p.replicas), default=0.0)
            else:
                duration = gen_estimate_s(p, state.cost, max(1, len(p.static_devices)), observed_stats(p))
            taken = {d for g in groups for d in g}
            left = [d for d in avail if d not in taken]
            pool = left + [d for d in self._lendable(rnd, p, duration, replica=True) if d not in taken]
            groups = self._take_groups(rnd, p, pool, taken, tp, groups, want)
        if len(groups) < want:  # then the home's devices cut across nodes
            taken = {d for g in groups for d in g}
            groups += self._node_groups(state, [d for d in avail if d not in taken], tp)[:want - len(groups)]
        return groups

    def _node_groups(self, state, devices: list, tp: int, cut: bool = True) -> list:
        """``devices`` (best first) cut into ``tp``-wide groups: first those on one node (a
        width wider than a node: whole nodes), in the order their first devices come, then
        the rest cut in order. A group cut across a node boundary runs its all-reduces over
        the node NICs (``CostModel.decode_step_s``'s ``cross_node``), so it comes last: a
        rollout takes one only when it wants more replicas than its nodes hold. A 32B's tp8
        home of devices 10-41 on nodes of 8 (cut in order: four replicas, each on two nodes)
        holds three on one node each and one on what is left (10-15 and 40-41), the same
        count. ``cut`` False: the groups on one node only."""
        local: list = []
        whole: dict[int, list] = {}  # node size -> whole nodes of that size, for a width wider than it
        for node, ds in self._by_node(state, devices).items():
            size = state.node_size(node)
            if tp <= size:
                local.extend(tuple(ds[i:i + tp]) for i in range(0, len(ds) - tp + 1, tp))
            elif tp % size == 0 and len(ds) == size:
                whole.setdefault(size, []).append(tuple(ds))
        for size, nodes in whole.items():
            k = tp // size
            local.extend(sum(nodes[i:i + k], ()) for i in range(0, len(nodes) - k + 1, k))
        if not cut:
            return local
        used = {d for g in local for d in g}
        rest = [d for d in devices if d not in used]
        return local + [tuple(rest[i:i + tp]) for i in range(0, len(rest) - tp + 1, tp)]

    def _take_groups(self, rnd, p, pool: list, held, tp: int, groups: list, want: int) -> list:
        """``groups`` and more ``tp``-wide groups of ``pool``, each on one node, up to
        ``want``; on a cost-aware pool only the devices activation picks beside the ``held``
        ones (the cheapest that keep the learner fed, activation.py); only devices whose
        class holds a ``tp``-wide replica of ``p``'s model (``holding_replica``)."""
        pool = holding_replica(rnd.state, p.model, pool, tp)
        if self._cost_aware(rnd.state):
            pool = [d for d in activate(rnd.state, p, [*held, *pool], tp).devices if d not in held]
        while len(groups) < want:
            g = self._node_group(rnd, p, pool, tp)
            if not g:
                break
            groups.append(g)
            pool = [d for d in pool if d not in g]
        return groups
