"""Rollout tails priced in device-seconds: a thin replica's requests merged into a sibling
with room (abort + resume), and a critical tail re-sharded onto wider replicas.

A mixin of ``Jigsaw`` (``policy.py``); see ``projections.py`` for how the mixins fit."""

from __future__ import annotations

from jigsaw_plugin.algorithms import HOST_STAGES, runs_on_gang
from jigsaw_plugin.scheduler.activation import within_link_bound
from jigsaw_plugin.scheduler.decisions import LaunchReplica, Migrate, RetireReplica
from jigsaw_plugin.scheduler.estimates import holding_replica, rollout_tp
from jigsaw_plugin.scheduler.jigsaw.round import Ends, INF, balanced_groups, tail_s

__all__ = ["TailMoves"]


class TailMoves:
    """``Jigsaw``'s tail moves: consolidation and widening, each priced before it is made."""

    def _consolidate_tails(self, rnd, out) -> None:
        """Move a tail replica's requests to a sibling and retire it, when that pays.

        Pricing a move reads the predicted drain of every live replica of the pipeline,
        which gathers and predicts all of its requests (most of a decide round's state
        build). Checks on what a live system sees come first, so that a pipeline none of
        whose tails could move is not read: a multi-turn pipeline whose open steps have
        most of their samples still generating (a replica with few requests then is one
        whose samples wait on tools or on their next turn, not a rollout tail), and a tail
        no sibling could take (batch or KV full)."""
        state = rnd.state
        if not self.config.multiplex and not any(p.next_stage for p in state.order):
            return  # freed devices would only be lent, and lending is off
        cfg = self.config
        extra = rnd.moved_in  # replica -> (requests, KV tokens) moved to it this round
        for p in state.order:
            if cfg.reprice_on_change and not p.requests_changed:
                continue  # its tails as they were when last priced, a little further on
            live = [r for r in p.replicas if not r.retiring and r.load and r.id not in rnd.gone]
            if len(live) < 2:
                continue
            last = self._last_left(state, p)
            if last and rnd.free:
                # the run's last pipeline (``idle_spread``): what a merge frees serves only its
                # own widened tails and early passes, and devices already stand idle for those,
                # so a merge would only slow the replica it merges into (a 0.5B DAPO alone on
                # 32 H100, held-out mix s17031: 32 replicas merged down to 14 in 50 s, whose
                # long contexts' KV reads then made most of each step: 204.1 s, verl-sync 190.1)
                continue
            open_steps = [s for s in p.steps.values() if s.gen_done < s.samples]
            if (p.lengths.turns > 1.0 and open_steps
                    and 2 * sum(s.gen_done for s in open_steps) < sum(s.samples for s in open_steps)):
                continue  # most of its trajectories are still generating: not a rollout tail yet
            tails = self._movable_tails(live)
            if not tails:
                continue  # no replica in its tail that could move: nothing to price (or predict)
            used: set = set()
            # predicted drains, read as the pricing needs them: a tail's own first, every
            # live replica's only once a sibling passes the re-prefill check (most tails
            # are too short to pay for any move: their siblings' drains are not read)
            # the last pipeline's freed devices serve only its own widened tails: a move
            # may not stretch its generation at all (``idle_spread``)
            ends = Ends(0.0 if last else self._slack(rnd, p),
                        extra=(0.0, 0.0) if last else self._early_stretch(rnd, p))
            widths = {r.tp for r in live}
            # the pipeline critical_spread serves: no merge makes a replica it would spread
            crowd = {w: self._crowd_at(rnd, p, w) for w in widths}
            claims = self._gang_claims(rnd) if cfg.gang_claims and self._cost_aware(state) else None
            for src in sorted(tails, key=lambda r: r.load):
                if src.id in used:
                    continue
                move = self._price_move(state, p, src, live, ends, extra, used, widths, crowd, claims)
                if move is None:
                    continue
                dst, end = move
                out.append(RetireReplica(src.id))
                out.append(Migrate(src.id, dst.id))
                rnd.gone.add(src.id)
                n_in, kv_in = extra.get(dst.id, (0, 0.0))
                extra[dst.id] = (n_in + src.load, kv_in + src.kv_tokens)
                ends.moved(src, dst, end)
                used.update((src.id, dst.id))
                rnd.free.update(src.devices)

    def _early_stretch(self, rnd, p) -> tuple:
        """With ``early_merges``: how much further than ``_slack`` a tail merge may stretch a
        synchronous pipeline's generation once its step has ``early_from`` of its
        trajectories finished and a forward pass to run early, as ``Ends.extra``: the
        devices a merge frees read them, and the chain after the tail shortens by at most
        that pass over them on the pipeline's home (less its fixed cost), so the stretch is
        held to those seconds and to ``merge_for_early`` of the tail's projected end. None
        while a pass of the pipeline runs or its home has free devices enough for one: the
        pass needs no merge to run, and a stretch would buy nothing (synthetic mix s4: its
        32B's tail merges were stretched while that pipeline's early pass already ran;
        1,451 -> 1,357 s with this, 1,354 s with ``early_merges`` off)."""
        cfg, state = self.config, rnd.state
        none = (0.0, 0.0)
        if not (cfg.early_merges and cfg.early_passes and state.early_passes and cfg.resize and p.spec.mode == "sync"):
            return none
        s = p.steps.get(p.train_next)
        if s is None or s.gen_done >= s.samples or s.gen_done < cfg.early_from * s.samples:
            return none
        stage = self._early_stage(p, s)
        if stage is None:
            return none
        need = state.cost.stage_min_gang(p.model, stage)
        home = rnd.home[p.name][0]
        if p.stage_running or sum(1 for d in home if d in rnd.free) >= need:
            return none
        width = max(need, len(home))
        saved = state.cost.forward_s(p.model, width, s.finished_tokens - s.covered.get(stage, 0))
        return max(0.0, saved - state.cost.f.train_stage_overhead_s), cfg.merge_for_early

    def _movable_tails(self, live) -> list:
        """The replicas of ``live`` in their tail (none queued, at most ``tail_requests``)
        that some sibling has batch and KV room for, by the engines' reports (siblings
        only fill up within a round)."""
        limit = self.config.tail_requests
        out = []
        for r in live:
            if r.queued:
                continue
            k = r.load
            if k > limit:
                continue
            kv = r.kv_tokens
            for d in live:
                if d is not r and d.running + k <= d.max_seqs and d.kv_tokens + kv <= 0.9 * d.kv_capacity:
                    out.append(r)
                    break
        return out

    def _gang_claims(self, rnd) -> dict:
        """Device -> seconds until a training gang is due to take it, on a heterogeneous
        pool under ``cost_aware`` (its gangs train on the trainer's site, so which devices a
        gang takes is known): each unfinished pipeline's training home on the site, now
        where a gang stage is ready, at the running stage's reported end where the next
        stage on devices after it is a gang's (past the advantage step, which runs on none).
        Devices no gang is due on are absent. Read from the stage order and the executor's
        report of the running stage: nothing is predicted. On one class a gang may take any
        part of its home (often the whole pool): claiming all of it turned away every merge
        and widening while any stage trained (heterogeneous S = 2 with ``cost_aware`` off,
        seed 0: 461.4 -> 591.3 s)."""
        if rnd.gang_claims is None:
            state, claims = rnd.state, {}
            for o in state.order if self._cost_aware(state) else ():
                if o.done:
                    continue
                if o.stage_running and o.running_stage_end_t is not None:
                    k, at = o.stage_next + 1, max(0.0, o.running_stage_end_t - state.t)
                elif o.next_stage is not None:
                    k, at = o.stage_next, 0.0
                else:
                    continue
                if not runs_on_gang(next((s for s in o.stages[k:] if s not in HOST_STAGES), None)):
                    continue
                for d in self._on_trainer_site(state, rnd.home[o.name][1]):
                    claims[d] = min(claims.get(d, INF), at)
            rnd.gang_claims = claims
        return rnd.gang_claims

    def _price_move(self, state, p, src, live, ends: Ends, extra, used, widths, crowd: int | None = None,
                    claims: dict | None = None):
        """The sibling to move ``src``'s requests to and the move's projected end, or None.
        ``ends``: the pipeline's drains this round (moves made this round set theirs);
        ``extra``: requests and KV tokens this round's moves send each replica;
        ``widths``: the tensor-parallel widths of ``live``; ``claims``: ``_gang_claims``
        (None: none), a destination on a gang's devices may not end after the gang is due.

        Every early exit below turns away only what the full pricing (each destination's
        two step times, end and cost) would turn away too: each compares a figure that
        can only understate the full one (IEEE addition and multiplication are monotone)."""
        cost, cfg = state.cost, self.config
        # the engine's own reports (its request count and KV use), not its request views,
        # whose KV sum differs from ``kv_tokens`` by well under 1%
        k, ctx = src.load, src.kv_tokens
        src_dev_s = ends.of(src) * src.tp
        # the re-prefill depends on the destination's width only: priced once per width, and
        # a tail whose freed device-seconds do not cover min_gain x the re-prefill onto any
        # width is turned away before the siblings are looked at (the loop below would
        # turn each away by the same comparison)
        gain, prefill_of, pays = cfg.min_gain, {}, False
        for w in widths:
            pre = prefill_of[w] = cost.migration_s(p.model, w, ctx)
            if not src_dev_s < gain * pre * w:
                pays = True
        if not pays:
            return None
        src_left = bound = top = src_work = None
        # the slowest a destination's step can be after the move is at least the step of
        # the tail's own batch and KV alone on its width (a step never gets faster with
        # more sequences or KV), and its longest request runs at least the tail's longest:
        # a width on which even that ends past the bound takes no destination (``hopeless``:
        # most tails at 1024 GPUs, whose siblings then need no look), and a destination
        # whose move would end past it at its own longest is turned away before its two
        # step times are priced
        step_floor: dict = {}
        hopeless: set = set()
        best = None
        for dst in live:
            if dst is src or dst.id in used:
                continue
            n_in, kv_in = extra.get(dst.id, (0, 0.0))
            n = dst.running + n_in
            if n + k > dst.max_seqs or dst.kv_tokens + kv_in + ctx > 0.9 * dst.kv_capacity:
                continue
            if crowd is not None and crowd.get(dst.tp) is not None and n + k >= crowd[dst.tp]:
                continue  # ``critical_spread`` would spread it again
            w = dst.tp
            prefill = prefill_of[w]
            # a step never gets faster with more sequences or KV (new >= old), so the move
            # costs at least its re-prefill: priced before the two step times
            if src_dev_s < cfg.min_gain * prefill * w:
                continue
            if bound is None:
                bound, top = ends.latest(live)
                src_left = src.predicted_tokens_left
            floor = step_floor.get(w)
            if floor is None:  # at the fastest class, on one node: below any destination's step
                floor = step_floor[w] = min(c.decode_step_s(p.model, w, k, ctx) for c in state.class_costs())
                if prefill + src_left * floor > bound:
                    hopeless.add(w)
                    if len(hopeless) == len(widths):
                        return best  # no destination of any width can pass (None: see above)
            if w in hopeless:
                continue
            dst_left = dst.predicted_tokens_left
            others = next((e for i, e in top if i not in (src.id, dst.id)), 0.0)
            if max(prefill + max(src_left, dst_left) * floor, others) > bound:
                continue  # would stretch the pipeline's generation beyond its slack (end >= this)
            # each step priced at the KV its requests hold halfway through their predicted
            # work, not now: early in a long step the KV grows many times over, and
            # merged replicas read twice the growth each step
            if src_work is None:
                src_work = src.predicted_work_tokens
            dst_work = dst.predicted_work_tokens
            # at the destination's own class and placement, as the executor prices its steps:
            # a 32B's tp4 cut across two nodes of A100s steps 3% slower than one node's
            # (0.01195 s against 0.01165 s), and a merge onto it priced on one node's fit
            # within a slack it overran (odd_workloads seed 393 before its launch kept to nodes)
            step, xn = state.cost_of(dst.devices).decode_step_s, state.cross_node(dst.devices)
            new = step(p.model, w, n + k, dst.kv_tokens + kv_in + ctx + (src_work + dst_work) / 2, xn)
            end = prefill + max(src_left, dst_left) * new
            if max(end, others) > bound:
                continue  # would stretch the pipeline's generation beyond its slack
            if claims and end > min((claims.get(d, INF) for d in dst.devices)):
                continue  # would hold a training gang's devices past the time it is due
            old = step(p.model, w, max(1, n), dst.kv_tokens + kv_in + dst_work / 2, xn)
            move_dev_s = (prefill + (new - old) * dst_left) * w
            if src_dev_s < cfg.min_gain * move_dev_s:
                continue
            if best is None or end < best[1]:
                best = (dst, end)
        return best

    def _widen_tails(self, rnd, out) -> None:
        """Re-shard a rollout tail onto wider tensor-parallel replicas.

        A tail decodes a few long requests at small batches, where a step is bound by reading
        the weights: splitting them over more devices cuts the per-token time, which is the
        pipeline's critical path, at a device-second price. The tail's replicas are grouped
        into ``k`` groups (1, 2, 4, ...), each absorbed by one replica of width ``w`` (as
        wide as now or wider: several wide replicas where one would decode too large a
        batch); the plan whose projected end of generation is
        earliest is taken when it beats the current one by more than ``latency_slack``
        after the weight load and the re-prefill. The new replicas go on devices the
        pipeline's home has free, devices whose owners can spare them for that long, and
        (``reshard_in_place``, where the executor can) the tail's own devices.
        """
        state = rnd.state
        for p in state.order:
            # replicas retired earlier in this round have their devices back in ``free``
            live = [r for r in p.replicas if not r.retiring and r.id not in rnd.gone]
            if not p.generating or not live or p.pending or any(r.queued for r in live):
                continue
            load = sum(r.load for r in live)
            if load == 0 or (load > self.config.widen_requests and not self._widen_while_idle(rnd, p, load)):
                continue
            if self.config.priority and self._completion_s(rnd, p) < (1 - self.config.latency_slack) * self._critical_s(rnd):
                continue  # not on the critical path: the devices are worth more elsewhere
            now_end = max(r.predicted_drain_s() for r in live)
            beat = now_end * (1 - self.config.latency_slack)
            if self._widen_floor_s(state, p, live) >= beat:
                continue  # no re-shard could end sooner: not worth gathering devices for
            pool = [d for d in rnd.home[p.name][0] if d in rnd.free]
            if self.config.borrow:
                pool += [d for d in self._lendable(rnd, p, now_end, replica=True) if d not in pool]
            if self._cost_aware(state):
                # not on a class whose link the activation rule refuses (a launch meets the
                # rule; a re-shard skipped it: at S = 1 a tp4 tail went onto the remote 4090s)
                pool = within_link_bound(state, p, pool, self._bulk_tp(rnd, p))
                if self.config.gang_claims:  # not the site's devices a gang is due on sooner
                    claims = self._gang_claims(rnd)
                    pool = [d for d in pool if claims.get(d, INF) >= beat]
            # a projection (the observed pace): without the look-ahead, free devices only (greedy
            # gangs then start narrow, and a tail holding its devices wide starved (a)'s PPO agent: 2787 s)
            critical = self.config.lookahead and self._near_critical(rnd, p)
            in_place = self.config.reshard_in_place and state.reshard_in_place and critical
            after = self._after_tail(rnd, p) if critical else None
            best = self._widen_plan(rnd, p, live, pool, in_place, beat, spread=critical, after=after)
            if best is None:
                continue
            for devs, group in best:
                out.append(LaunchReplica(p.name, devs, absorb=tuple(r.id for r in group)))
                rnd.gone.update(r.id for r in group)
                for r in group:
                    rnd.free.update(r.devices)
                rnd.free.difference_update(devs)  # after: a re-shard in place takes some of them

    def _widen_while_idle(self, rnd, p, load: int) -> bool:
        """``widen_when_idle``: ``p``'s ``load`` requests count as a tail to widen because
        no other unfinished pipeline has work ready (``_has_ready_work``), so the devices a
        wider replica takes have nothing else to run, and they are at most half a step's
        samples (a tail, not a step of few samples from its start: a 14B code pipeline's
        steps of 256 were widened whole, its rollouts held 8 devices a replica at full
        batch, and random mix m11 ran 8% longer)."""
        cfg = self.config
        return (cfg.widen_when_idle and load <= cfg.idle_widen_requests
                and 2 * load <= p.spec.prompts_per_step * p.spec.samples_per_prompt
                and not self._ready_work(rnd) - {p.name})

    def _widen_floor_s(self, state, p, live) -> float:
        """A floor under every re-shard plan's projected end: the longest predicted request
        alone at batch 1 with no KV on the fastest width a plan may use (a step never gets
        faster with more sequences or KV; the switch and re-prefill only add)."""
        widths = self._widen_widths(state, p, live)
        if not widths:
            return INF
        left = max(r.predicted_tokens_left for r in live)
        return left * min(c.decode_step_s(p.model, w, 1, 0.0) for w in widths for c in state.class_costs())

    def _widen_widths(self, state, p, live) -> list:
        """The widths a re-shard of ``live`` may use: theirs, doubled up to a node or
        ``max_widen``, those vLLM can shard ``p``'s model over."""
        widths, w = [], max(r.tp for r in live)
        while w <= min(state.gpus_per_node, self.config.max_widen):
            if p.model.fits_tp(w):
                widths.append(w)
            w *= 2
        return widths

    def _after_tail(self, rnd, p):
        """``widen_for_early``: the seconds the chain spends after a tail that ends in ``end``
        seconds with ``spare`` devices beside it, as a function ``(spare, room, end)``, or
        None where no early pass would run beside it (``_early_passes``' conditions). The
        forward pass over the step's finished trajectories runs early on the spare devices
        (all of it, or what it reads by the tail's end where that is worth a pass's fixed
        cost), and the rest after the tail on all ``room`` devices of the plan."""
        state, cfg = rnd.state, self.config
        if not (cfg.widen_for_early and cfg.early_passes and state.early_passes and p.spec.mode == "sync"):
            return None
        s = p.steps.get(p.train_next)
        if (s is None or p.stage_running or p.alongside_stage is not None or s.rewarded >= s.samples
                or s.gen_done < cfg.early_from * s.samples):
            return None
        stage = self._early_stage(p, s)
        if stage is None:
            return None
        tokens = s.finished_tokens - s.covered.get(stage, 0)
        cost = state.cost
        need = max(cost.stage_min_gang(p.model, stage), rollout_tp(p, cost))
        fixed = cost.f.train_stage_overhead_s

        def after(spare: int, room: int, end: float) -> float:
            left = tokens
            if spare >= need:
                whole = cost.forward_s(p.model, spare, tokens)
                if whole <= end:
                    left = 0
                else:
                    chunk = tokens * max(0.0, end - fixed) / max(1e-9, whole - fixed)
                    if cost.forward_s(p.model, spare, chunk) - fixed >= cfg.early_min_fixed * fixed:
                        left = tokens - chunk
            return cost.forward_s(p.model, max(room, need), left) if left > 0 else 0.0

        return after

    def _widen_plan(self, rnd, p, live, pool, in_place: bool, beat: float, spread: bool = True, after=None):
        """The fastest re-shard of ``live`` ending before ``beat`` seconds from now: a list of
        (devices, absorbed replicas), one per new replica, or None. ``after`` (``_after_tail``):
        the fastest counted to the end of the forward pass its spare devices start early."""
        state = rnd.state
        costs = state.class_costs()
        width = max(r.tp for r in live)
        # the engines' KV reports, not request views (within 0.2% of their sum; no rows built)
        ctx = {r.id: r.kv_tokens for r in live}
        best, best_key = None, None
        room = len(pool) + (sum(r.tp for r in live) if in_place else 0)
        longest = max(r.predicted_tokens_left for r in live)
        for w in self._widen_widths(state, p, live):
            # every plan of width w ends no sooner than the switch and the longest request
            # alone at batch 1 with no KV on the fastest class (the group holding it pays its
            # re-prefill too, and a step never gets faster with more sequences or KV; IEEE
            # addition and multiplication are monotone): a width that cannot beat ``beat``
            # prices no plan
            if min(c.context_switch_s(p.model, w, train_state=False) + longest * c.decode_step_s(p.model, w, 1, 0.0)
                   for c in costs) >= beat:
                continue
            k = 1
            while k <= (len(live) if spread else 1) and k * w <= room:
                if w == width and k >= len(live):
                    break  # as wide and as many: no change
                groups = balanced_groups(live, k)
                plan, taken, end = [], set(), 0.0
                spare = list(pool)
                for j, group in enumerate(groups):
                    # free devices, and the devices of replicas absorbed by this or an earlier group
                    own = [d for g in groups[:j + 1] for r in g for d in r.devices] if in_place else []
                    avail = holding_replica(state, p.model, [d for d in spare + own if d not in taken], w)
                    devs = self._node_group(rnd, p, avail, w)
                    if not devs:
                        plan = None
                        break
                    taken.update(devs)
                    spare = [d for d in spare if d not in taken]
                    n = sum(r.load for r in group)
                    c = sum(ctx[r.id] for r in group)
                    left = max(r.predicted_tokens_left for r in group)
                    cost = state.cost_of(devs)  # its class's (one node: one class)
                    switch = cost.context_switch_s(p.model, w, train_state=False)
                    end = max(end, switch + cost.migration_s(p.model, w, c) + tail_s(cost, p.model, w, n, c, left))
                    plan.append((devs, group))
                k *= 2  # 1, 2, 4, ... replicas: the plans a round prices stay few
                if not plan or end >= beat:
                    continue
                key = (end if after is None else end + after(room - len(taken), room, end), len(taken))
                if best_key is None or key < best_key:
                    best, best_key = plan, key
        return best
