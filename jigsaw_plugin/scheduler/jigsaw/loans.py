"""Lending a pipeline's home devices and getting them back: how long an owner can spare
them, micro-batch loans that grow running stages, and reclaims at a boundary.

A mixin of ``Jigsaw`` (``policy.py``); see ``projections.py`` for how the mixins fit."""

from __future__ import annotations

import math

from jigsaw_plugin.algorithms import HOST_STAGES, runs_on_gang
from jigsaw_plugin.scheduler.decisions import Migrate, RetireReplica
from jigsaw_plugin.scheduler.jigsaw.round import INF, MICRO_BATCHES, UNSET

__all__ = ["Loans"]


class Loans:
    """``Jigsaw``'s loans: what an owner can lend, for how long, and its reclaims."""

    def _needed_in_s(self, rnd, owner: str, replica: bool = False) -> float:
        """When the owner of a home device is projected to want it back; for a rollout
        ``replica`` (``lend_beside_stages``), an owner whose running stage would not grow
        onto its home's free devices wants them when that stage ends."""
        key = (owner, replica and self.config.lend_beside_stages)
        got = rnd.need.get(key)
        if got is not None:
            return got
        state = rnd.state
        o = state.pipelines[owner]
        if o.done:
            got = INF
        elif (self._wants_home_now(rnd, o) or o.next_stage) and not (key[1] and self._declines_home(rnd, o)):
            got = 0.0
        elif o.stage_running or o.alongside_stage is not None:
            ends = [e for e in (o.running_stage_end_t, o.alongside_end_t) if e is not None]
            got = max(0.0, min(ends) - state.t) if ends else 0.0
        elif o.generating:
            got = max((r.predicted_drain_s() for r in o.replicas), default=0.0)
            if (self.config.tool_wait and o.lengths.tool_s > 0 and self._between_turns(o) > 0
                    and not self._paced_critical(rnd, o)):
                # trajectories in tool calls come back for more turns: the rollout, and the
                # training after it, are that far off at least, whatever the replicas hold now
                # (an owner on the critical path keeps its claim: its next turns would wait
                # for a loan to end, and they set the makespan)
                got = max(got, self._tool_calls_left_s(o))
        elif self.config.reward_wait:
            got = self._reward_wait_s(o, state.t)
        else:
            got = 0.0
        rnd.need[key] = got
        return got

    def _declines_home(self, rnd, o) -> bool:
        """``o``'s only claim on its home's free devices is a running stage that may grow onto
        them alone (``grow_at_home``) and would not: growing onto them does not pay
        (``_growth_that_pays``), and it has no other work ready."""
        rs = o.running_stage
        if (rs is None or not rs.resizable or not rnd.stage_devices(o)
                or self._has_ready_work(o) or self._stage_may_grow(rnd, o) or not self.config.grow_at_home):
            return False
        home = set(rnd.share[o.name])
        own = self._on_trainer_site(rnd.state, [d for d in sorted(rnd.free) if d in home])
        return self._growth_that_pays(rnd, o, own) is None

    def _paused(self, rnd, p) -> bool:
        rs = p.running_stage
        return rs is not None and rs.resizable and not rnd.stage_devices(p)

    def _wants_home_now(self, rnd, o) -> bool:
        """``o`` has work ready that its home devices should run now: a ready stage, a stage
        paused or still able to grow, a rollout to start or requests waiting for a replica."""
        rs = o.running_stage
        if rs is not None and rs.resizable and (rs.micro_batches_left >= 2 or not rnd.stage_devices(o)):
            return True
        return self._has_ready_work(o)

    def _would_use_home(self, rnd, o) -> bool:
        """As ``_wants_home_now``, but a running stage counts only where it would take the
        devices: paused, or able to grow this round (``_stage_may_grow``)."""
        rs = o.running_stage
        if rs is not None and rs.resizable and (not rnd.stage_devices(o) or (
                rs.micro_batches_left >= 2 and self._stage_may_grow(rnd, o))):
            return True
        return self._has_ready_work(o)

    def _stage_may_grow(self, rnd, p) -> bool:
        """``p``'s running stage may grow at its boundaries onto lent devices: every stage
        with ``loans``, the critical pipeline's alone with ``critical_loans`` (onto its own
        home's free devices, every stage may: ``grow_at_home``)."""
        return self.config.loans or self._paced_critical(rnd, p)

    def _has_ready_work(self, o) -> bool:
        """A ready stage, a rollout to start or requests waiting for a replica (with
        ``reclaim_for_queue``, also more requests queued on its engines than its replicas
        run at once: a whole wave and more waits)."""
        stage = o.next_stage
        if runs_on_gang(stage):
            return True
        if (self._may_start_gen(o) and not o.generating) or o.pending > 0:
            return True
        return self.config.reclaim_for_queue and o.generating and self._queued_past_a_wave(o)

    def _ready_work(self, rnd) -> frozenset:
        """The names of the unfinished pipelines with work ready (``_has_ready_work``), read
        once a round (it reads the round's state, which the round's decisions leave as it is)."""
        if rnd.ready_work is UNSET:
            rnd.ready_work = frozenset(o.name for o in rnd.state.order if not o.done and self._has_ready_work(o))
        return rnd.ready_work

    @staticmethod
    def _queued_past_a_wave(o) -> bool:
        """``o``'s engines queue more requests than its live replicas' batch limits hold."""
        live = [r for r in o.replicas if not r.retiring]
        return sum(r.queued for r in live) > sum(r.max_seqs for r in live)

    def _lendable(self, rnd, p, duration, training: bool = False, replica: bool = False) -> list:
        """Free devices outside ``p``'s home whose owners can spare them for ``duration``;
        for a ``training`` gang of a pipeline on the job set's critical path at its observed
        pace (``lend_to_critical``), also devices of owners off it, however soon they want
        them back: such an owner has slack, the borrower sets the makespan. With
        ``lend_rollouts_to_critical`` the same for a synchronous critical pipeline's rollout
        replicas, from owners projected to finish at least ``max_slack`` before the last
        pipeline (a replica holds its devices longer than a micro-batch: an owner reclaims
        them by evicting it, its requests to a sibling). ``replica``: the borrower is a
        rollout replica, which an owner evicts when it wants the devices back (how long it
        can spare them: ``_needed_in_s``)."""
        if not self.config.multiplex:
            return []
        state = rnd.state
        mine = set(rnd.share[p.name])
        out = []
        cfg = self.config
        # rollout replicas only: an early pass, a weight sync or a paused stage's resume is
        # neither a ``training`` gang nor a replica, and an owner cannot evict it
        rollout = replica and cfg.lend_rollouts_to_critical and p.spec.mode == "sync"
        critical = (training or rollout) and cfg.lend_to_critical and self._paced_critical(rnd, p)
        if training and not critical and self._claim_s(rnd, p) < self.config.loan_margin * duration:
            return []  # the critical pipeline's gang is ready sooner and would borrow them
        for d in sorted(rnd.free):
            if d in mine:
                continue
            owner = rnd.owner.get(d)
            if owner is None:
                out.append(d)
            elif not self.config.lookahead or self._needed_in_s(rnd, owner, replica) >= self.config.loan_margin * duration:
                out.append(d)
            elif critical and not self._paced_critical(rnd, (o := state.pipelines[owner])) and (
                    training or not self._within_slack_of_last(rnd, o)):
                out.append(d)
        return out

    def _claim_s(self, rnd, p) -> float:
        """``critical_claim``: seconds until a pipeline other than ``p`` on the critical
        path at its observed pace has a training stage ready, where it is in its host-side
        stage (the advantage computation, on no device) and a training stage on devices
        follows; infinite otherwise. What it runs next is read from its stage order, and when
        the host stage ends from the executor's report of the stage running: the policy
        predicts nothing here."""
        if not (self.config.critical_claim and self.config.lookahead):
            return math.inf
        if rnd.claim is None:
            rnd.claim = (math.inf, None)
            state = rnd.state
            for c in state.order:
                if c.done or not c.stage_running or c.running_stage_end_t is None:
                    continue
                k = c.stage_next
                after = c.stages[k + 1] if k + 1 < len(c.stages) else None
                if c.stages[k] not in HOST_STAGES or not runs_on_gang(after) or not self._paced_critical(rnd, c):
                    continue
                rnd.claim = min(rnd.claim, (max(0.0, c.running_stage_end_t - state.t), c.name),
                                key=lambda x: x[0])
        wait, claimant = rnd.claim
        return math.inf if claimant == p.name else wait

    def _reclaim(self, rnd, out) -> None:
        """Owners with work ready get their lent home devices back: a borrowing stage shrinks
        at its next micro-batch boundary; a borrowed replica's requests move to a sibling."""
        state = rnd.state
        shrink: dict[str, set] = {}
        replicas: set = set()
        for o in state.order:
            if o.done or not self._wants_home_now(rnd, o):
                continue
            # an owner that would leave the devices idle lets the critical pipeline keep them
            yields = self.config.keep_critical_loans and not self._would_use_home(rnd, o)
            # ... and keeps lending them to rollout replicas until its running stage ends,
            # as ``_needed_in_s`` lent them (``lend_beside_stages``; read at its first replica)
            beside = None
            for d in rnd.share[o.name]:
                task = state.devices[d].task
                if task is None or task.pipeline == o.name:
                    continue
                if yields and self._paced_critical(rnd, state.pipelines[task.pipeline]):
                    continue
                if task.kind == "stage":
                    shrink.setdefault(task.pipeline, set()).add(d)
                elif task.kind == "replica" and task.replica is not None:
                    if beside is None:
                        beside = self.config.lend_beside_stages and self._declines_home(rnd, o)
                    if not beside:
                        replicas.add(task.replica)
        for q, devs in shrink.items():
            qv = state.pipelines[q]
            if qv.running_stage is None or not qv.running_stage.resizable:
                continue
            base = rnd.stage_devices(qv)
            new = tuple(x for x in base if x not in devs)
            stage = qv.running_stage.stage
            if len(new) < state.cost_of(new).stage_min_gang(qv.model, stage):
                new = ()  # what is left cannot hold its state: it pauses until devices free up
            else:
                # what is left, in the layout that runs soonest where that is faster than all
                # of it: the owner's devices out may leave counts no node-local shard size
                # divides, so the pass shards over every device across the node NICs (a 32B
                # update on 70 of 72 A100 in nodes of 8: 129 s a pass, 27 s on 64 of them in
                # groups of 8; held-out mix s20058), priced at their classes (a gang runs at
                # its slowest class's pace); the rest are free for others
                packed = self._packed(rnd, qv, stage, new)
                layout_s = self._class_layout_s
                if packed != new and layout_s(state, qv, stage, packed) < layout_s(state, qv, stage, new) * (1 - 1e-9):
                    new = packed  # (a tie on fewer devices, which ``_packed`` takes, is not kept)
            if new != base:
                rnd.resize(out, qv, new)
                # devices a pending resize claimed but the stage never ran on are released at
                # once (both executors): this round's gangs may take them
                rnd.free.update(d for d in base if d not in new and d not in qv.running_stage.devices)
        if self.config.migration:
            for rid in sorted(replicas):
                self._evict_replica(rnd, state.replicas.get(rid), out)

    def _evict_replica(self, rnd, src, out) -> None:
        """Move a borrowed replica's requests to a sibling with room, then retire it. The
        room counts what this round's earlier moves send the sibling (``rnd.moved_in``):
        the engines' reports do not show them yet."""
        if src is None or src.retiring or src.id in rnd.gone:
            return
        p = rnd.state.pipelines[src.pipeline]
        ctx = sum(r.kv_tokens for r in src.requests) if src.load else 0
        moved = rnd.moved_in
        for dst in sorted((r for r in p.replicas if r is not src and not r.retiring and r.id not in rnd.gone),
                          key=lambda r: r.load + moved.get(r.id, (0, 0.0))[0]):
            n_in, kv_in = moved.get(dst.id, (0, 0.0))
            if dst.load + n_in + src.load <= dst.max_seqs and dst.kv_tokens + kv_in + ctx <= 0.9 * dst.kv_capacity:
                out.append(RetireReplica(src.id))
                if src.load:
                    out.append(Migrate(src.id, dst.id))
                    moved[dst.id] = (n_in + src.load, kv_in + ctx)
                rnd.gone.add(src.id)
                return

    def _micro_batch_s(self, state, p, stage, g) -> float:
        rs = p.running_stage
        mbs = rs.micro_batches if rs is not None else MICRO_BATCHES
        return self._stage_s(state, p, stage, g) / max(1, mbs)

    def _grow_stages(self, rnd, out) -> None:
        """Running stages take the free devices left, furthest-from-completion first: their
        own home devices, then devices lent for at least a micro-batch. With ``loans`` off
        and ``critical_loans`` on, only the critical pipeline's stage grows, and onto the
        devices ``lend_to_critical`` lends it; with ``grow_at_home``, the others onto their
        own home's free devices alone, and (``grow_onto_orphans``) the pipeline projected to
        finish last onto devices whose owners have finished too."""
        state, cfg = rnd.state, self.config
        lending = cfg.multiplex and (cfg.loans or cfg.critical_loans)
        running = [p for p in state.order if p.running_stage is not None and p.running_stage.resizable
                   and p.running_stage.micro_batches_left >= 2
                   and (cfg.grow_at_home or self._stage_may_grow(rnd, p))]
        running.sort(key=lambda p: (-self._completion_s(rnd, p), p.index))
        # ``grow_onto_orphans``: the one pipeline whose stage may take finished owners' devices
        last = self._projected_last(rnd) if running and cfg.grow_onto_orphans and cfg.multiplex else None
        for p in running:
            if not rnd.free:
                return
            rs = p.running_stage
            base = rnd.stage_devices(p)
            if not base:
                continue  # paused: served as a "resume" demand
            home = set(rnd.share[p.name])
            own = [d for d in sorted(rnd.free) if d in home]
            g0 = len(base)
            lend = []
            if lending and self._stage_may_grow(rnd, p):
                lend = self._lendable(rnd, p, self._micro_batch_s(state, p, rs.stage, g0 + len(own) + 1),
                                      training=not cfg.loans)
            elif p is last:
                lend = [d for d in sorted(rnd.free) if self._orphaned(rnd, d)]
            add = self._on_trainer_site(state, own + [d for d in lend if d not in home])
            grown_set = self._growth_that_pays(rnd, p, add)
            if grown_set is not None:
                rnd.resize(out, p, grown_set)
                rnd.free.difference_update(d for d in grown_set if d not in base)

    def _growth_that_pays(self, rnd, p, add) -> tuple | None:
        """The gang ``p``'s running stage grows to at its next micro-batch boundary from
        ``add`` (devices free now), or None where none ends its remaining micro-batches
        sooner by more than the switch onto the new devices."""
        if not add:
            return None
        state, rs = rnd.state, p.running_stage
        base = rnd.stage_devices(p)
        left = rs.micro_batches_left - 1  # the one in progress keeps its width
        # priced at the gang's class (on a pool of several, the first class's profile
        # priced a 14B update running on 3 H20s of 96 GB as one 80 GB H100s cannot hold:
        # infinite, so any growth looked like a gain)
        now = left * self._class_layout_s(state, p, rs.stage, base) / rs.micro_batches
        grown_set = self._packed(rnd, p, rs.stage, tuple(base) + tuple(self._affinity(rnd, p, add, "train")),
                                 keep=base)
        add = [d for d in grown_set if d not in base]
        if not add or len(self._holding(state, p, rs.stage, grown_set)) < len(grown_set):
            return None
        switch = state.cost.context_switch_s(p.model, len(add), train_state=True)
        grown = switch + left * self._class_layout_s(state, p, rs.stage, grown_set) / rs.micro_batches
        if self._restart_risks(rnd, p, grown_set) is not None:
            # more devices, more preemptions, each of which runs the whole pass again on
            # them (odd_workloads --preempt seed 158, activation off: a 14B update grown
            # from 3 devices never preempted onto 8 preempted every 2 s never ended)
            now, grown = (self._with_restarts(rnd, p, t, len(g), *self._set_risk(rnd, g),
                                              whole=self._class_layout_s(state, p, rs.stage, g))
                          for t, g in ((now, base), (grown, grown_set)))
        if now - grown <= switch:
            return None
        return grown_set

    def _resume_devices(self, rnd, p) -> tuple:
        """The devices a paused stage resumes on, () to stay paused: its home's free ones and
        those lent for a micro-batch, narrowed to its fastest gang; where that gang is too
        few of a small class to hold the stage (``_holding``), every candidate less those
        classes. Narrowed alone, a paused 1.5B update on L40S + RTX 4090 + A100 resumed
        on one 24 GB device too small for it, was refused, and stayed paused for good."""
        rs, state = p.running_stage, rnd.state
        own = [d for d in sorted(rnd.free) if d in set(rnd.share[p.name])]
        lend = self._lendable(rnd, p, self._micro_batch_s(state, p, rs.stage, max(1, len(own))))
        devs = self._on_trainer_site(state, own + [d for d in lend if d not in own])
        if len(devs) < state.cost.stage_min_gang(p.model, rs.stage):
            return ()  # too few to hold its state: it stays paused
        devs = list(self._packed(rnd, p, rs.stage, devs))
        narrow = (self._no_slower_gang(rnd, p, rs.stage, devs, self._restart_risks(rnd, p, devs))
                  or tuple(self._affinity(rnd, p, devs, "train")))
        return (self._holding(state, p, rs.stage, narrow)
                or self._holding(state, p, rs.stage, self._affinity(rnd, p, devs, "train")))
