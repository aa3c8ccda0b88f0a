"""Training gangs: the look-ahead's start-now-or-wait choice and its width, placement on
nodes, stages run alongside each other, and early forward passes.

A mixin of ``Jigsaw`` (``policy.py``); see ``projections.py`` for how the mixins fit."""

from __future__ import annotations

from jigsaw_plugin.algorithms import FORWARD_STAGES, UPDATE_STAGES, early_stages, may_run_alongside, waits_for_alongside
from jigsaw_plugin.scheduler.activation import trainer_site
from jigsaw_plugin.scheduler.decisions import ResizeStage, RunStage
from jigsaw_plugin.scheduler.estimates import rollout_tp
from jigsaw_plugin.scheduler.jigsaw.round import INF, MICRO_BATCHES, STAGE_TIMES_KEPT, prefix_fastest

__all__ = ["TrainingGangs"]


class TrainingGangs:
    """``Jigsaw``'s training gangs: when a ready stage starts, on which devices."""

    def _on_trainer_site(self, state, devices: list) -> list:
        """``devices`` a training stage may take: those on the trainer's site where the pool
        is heterogeneous and ``cost_aware`` (a gang priced at its slowest class should not
        reach a spot or remote worker), all of them otherwise."""
        if not self._cost_aware(state):
            return devices
        site = trainer_site(state)
        return [d for d in devices if d in site]

    @staticmethod
    def _holding(state, p, stage: str, devices) -> tuple:
        """``devices``, if they hold ``stage``'s state on their class (the one with the least
        memory a device among them, ``state.cost_of``); else those left once the classes
        that cannot are dropped, smallest memory first; () where none hold it. The policy
        sizes gangs from the first class's profile (``state.cost.stage_min_gang``): on a
        pool of several classes with ``cost_aware`` off a 32B's update sized for 80 GB H100s
        reached 24 GB devices too few to hold it, and the executor refused the gang."""
        devices = tuple(devices)
        if len(state.classes) <= 1:
            return devices
        while devices and len(devices) < state.cost_of(devices).stage_min_gang(p.model, stage):
            held = TrainingGangs._classes_of(state, devices)
            if len(held) <= 1:
                return ()
            least = min(held, key=lambda c: c.memory_gb)
            devices = tuple(d for d in devices if d not in least.devices)
        return devices

    def _affinity(self, rnd, p, devices, kind) -> list:
        state = rnd.state
        home = set(rnd.home[p.name][0 if kind == "rollout" else 1])
        risk = self._risk(rnd) if kind == "train" else None

        def key(d):
            dev = state.devices[d]
            resident = p.name in dev.resident if kind == "rollout" else dev.train_resident == p.name
            return (d not in home, not resident, d)

        if risk:  # a gang restarts whenever one of its devices is preempted: the least preempted first
            return sorted(devices, key=lambda d: (risk.get(d, (0.0,))[0], key(d)))
        return sorted(devices, key=key)

    def _node_group(self, rnd, p, devices, w) -> tuple:
        """``w`` of ``devices`` on one node (tensor-parallel groups stay within a node),
        preferring the pipeline's home and resident devices, and on a pool of several
        device classes the node whose class decodes fastest; () when no node has ``w``. A
        width wider than a node (a spec's ``rollout_tp``, or a model no node holds) takes
        whole nodes, as its replicas at launch do."""
        state = rnd.state
        by_node = self._by_node(state, self._affinity(rnd, p, devices, "rollout"))
        if len(state.classes) > 1:  # the fastest class first (a node holds one class)
            def key(n):
                return state.cost_of(by_node[n][:1]).decode_step_s(p.model, w, 1, 0.0), -len(by_node[n])
        else:
            def key(n):
                return -len(by_node[n])
        for node in sorted(by_node, key=key):
            if len(by_node[node]) >= w:
                return tuple(by_node[node][:w])
        # wider than a node: whole nodes of one size that divides it (the largest first)
        whole: dict[int, list] = {}
        for node, ds in by_node.items():
            size = state.node_size(node)
            if w > size and w % size == 0 and len(ds) == size:
                whole.setdefault(size, []).append(ds)
        for size in sorted(whole, reverse=True):
            if len(whole[size]) >= w // size:
                return tuple(d for ds in whole[size][:w // size] for d in ds)
        return ()

    @staticmethod
    def _pass_tokens(p, stage) -> int:
        """The tokens ``stage`` of the step to train next reads: a forward pass what early
        passes did not read, an update the whole batch."""
        s = p.steps[p.train_next]
        return s.tokens - s.covered.get(stage, 0) if stage in FORWARD_STAGES else s.tokens

    def _stage_s(self, state, p, stage, g, cost=None) -> float:
        """The pass's time on ``g`` devices (infinite on fewer than hold its state), priced on
        ``cost`` (None: the pool's first class, ``state.cost``)."""
        cost = cost or state.cost
        price = cost.forward_s if stage in FORWARD_STAGES else cost.train_s
        return price(p.model, g, self._pass_tokens(p, stage))

    def _placed_s(self, state, p, stage, devices, cost=None) -> float:
        """``_stage_s`` of ``len(devices)`` as ``devices`` are placed: in the sharding layouts
        their nodes allow (hybrid sharding needs node-local groups, ``CostModel.shard_sizes``),
        where ``_stage_s`` prices the width placed at best; on ``cost`` (None: ``state.cost``)."""
        cost = cost or state.cost
        price = cost.forward_s if stage in FORWARD_STAGES else cost.train_s
        return price(p.model, len(devices), self._pass_tokens(p, stage), nodes=self._nodes(state, devices))

    def _class_layout_s(self, state, p, stage, devices) -> float:
        """``_placed_s`` at each of ``devices``' classes' cost models, the slowest answer (as
        the simulator's ``ClassPricer`` prices a gang across classes; on a pool of one class,
        its cost model)."""
        return max(self._placed_s(state, p, stage, devices, c) for c in self._costs_of(state, devices))

    @staticmethod
    def _classes_of(state, devices) -> tuple:
        """The pool's classes that hold any of ``devices`` (() on a pool of one class)."""
        if len(state.classes) <= 1:
            return ()
        return tuple(c for c in state.classes if any(d in c.devices for d in devices))

    @staticmethod
    def _costs_of(state, devices) -> tuple:
        """The cost models of ``devices``' classes (the pool's first class's on a pool of one)."""
        return tuple(c.cost for c in TrainingGangs._classes_of(state, devices)) or (state.cost,)

    def _switch_in_s(self, state, p, devices) -> float:
        """Seconds loading ``p``'s training state onto ``devices`` adds before a pass there: 0
        where every one holds it, else the slowest class's load (the executor loads it
        onto a gang any of whose devices lacks it, ``Executor._switch_s``). A gang of the
        resident devices and one more was priced 0.002 s faster than theirs alone and ran
        1.7 s slower (odd_workloads --classes seed 36: an 8B's reference pass)."""
        if all(state.devices[d].train_resident == p.name for d in devices):
            return 0.0
        return self._load_s(p, len(devices), self._costs_of(state, devices))

    @staticmethod
    def _load_s(p, g: int, costs) -> float:
        """Seconds loading ``p``'s training state onto ``g`` devices, at the slowest of the
        cost models ``costs`` (their classes')."""
        return max(c.context_switch_s(p.model, g, train_state=True) for c in costs)

    @staticmethod
    def _by_node(state, devices) -> dict:
        """``devices`` grouped by node, each group in the order given."""
        by_node: dict[int, list] = {}
        for d in devices:
            by_node.setdefault(state.devices[d].node, []).append(d)
        return by_node

    def _nodes(self, state, devices) -> tuple:
        """``devices``' count on each node they span (``CostModel.train_s``'s ``nodes``)."""
        return tuple(len(ds) for ds in self._by_node(state, devices).values())

    def _packed(self, rnd, p, stage, devices, keep=()) -> tuple:
        """Of ``devices`` (in the order given, best first), the gang that runs the pass
        soonest, fewer devices on a tie: all of them, or for each hybrid shard size ``s``,
        the multiples of ``s`` each node holds, in node-local groups (a gang that cannot form
        them shards over all its devices, across the node NICs, which fewer devices in
        groups can beat). ``keep``: devices the gang holds already and keeps (a growing
        stage); a size whose groups would drop one of them is skipped. Each gang is priced at
        its own classes (``_class_layout_s``): one that drops a slower class's devices may
        run sooner on fewer."""
        state = rnd.state
        devices = tuple(devices)
        if len(devices) <= 1 or not state.cost.f.hybrid_shard:
            return devices
        by_node = self._by_node(state, devices)
        held = set(keep)
        best_t, best = self._class_layout_s(state, p, stage, devices), devices
        top = min(max(1, state.gpus_per_node), len(devices) - 1)
        for size in range(top, state.cost.stage_min_gang(p.model, stage) - 1, -1):
            kept = set()
            for ds in by_node.values():
                kept.update(ds[:len(ds) // size * size])
            if not kept or held - kept or len(kept) == len(devices):
                continue
            sub = tuple(d for d in devices if d in kept)
            t = self._class_layout_s(state, p, stage, sub)
            if t < best_t * (1 - 1e-9) or (t <= best_t * (1 + 1e-9) and len(sub) < len(best)):
                best_t, best = t, sub
        return best

    def _take(self, rnd, p, stage, devices, g: int) -> tuple:
        """``g`` of ``devices`` placed for a layout that width allows: the first ``g``
        (sharded over the whole gang), or for each hybrid shard size, whole node-local
        groups of it, the nodes with the most of ``devices`` first; of these, the one priced
        soonest as placed (``_class_layout_s``; the larger shard on a tie). Priced as the
        width placed at best instead, the first 16 of a 32B's home, 6, 8 and 2 devices on
        three nodes, which form no groups of 8 and shard over all 16 across the NICs, took
        its update for 63 s where two whole nodes run it in 11 s (synthetic mix s31)."""
        state = rnd.state
        devices = list(devices)
        update = stage not in FORWARD_STAGES
        best = None
        for size in state.cost.shard_sizes(p.model, g, update):  # the whole gang first, larger sizes first
            gang = tuple(devices[:g]) if size >= g else self._in_groups(state, devices, g, size)
            if gang:
                t = self._class_layout_s(state, p, stage, gang)
                if best is None or t < best[0] * (1 - 1e-9):
                    best = (t, gang)
        return best[1]

    def _in_groups(self, state, devices: list, g: int, size: int) -> tuple:
        """``g`` of ``devices`` in whole node-local groups of ``size``, the nodes with the
        most of them first; () where they do not hold ``g`` so."""
        out: list = []
        for ds in sorted(self._by_node(state, devices).values(), key=len, reverse=True):
            n = min(len(ds) // size * size, g - len(out))
            out += ds[:n // size * size]
            if len(out) == g:
                return tuple(out)
        return ()

    def _early_passes(self, rnd, out) -> None:
        """Run a forward pass over a generating step's finished trajectories on devices left
        free this round (its home's, then devices lent for as long as its rollout is
        projected to run), once the rollout is down to its tail or, under
        ``early_in_reward_wait``, the step waits on its rewards (for as long as
        ``_reward_wait_s`` projects), for a pipeline on the job set's critical path at its
        observed pace; with ``early_merges``, for one off it too, on the devices of its own
        home that nothing else took this round (lent devices may be the critical one's: a
        pass there could hold them when it wants them). The stage's own pass after the tail then
        reads only the rest: the step's chain shortens by what was read early, on devices
        that would otherwise wait for the tail. The narrowest gang that reads all the
        finished tokens before the rollout is projected to end; else every free device,
        reading what it can by then (a pass still running when the batch is complete holds
        the stage back, or under ``early_rest`` goes on as its own pass on that gang), if
        that is at least ``early_min_fixed`` times the pass's fixed cost."""
        state, cfg = rnd.state, self.config
        for p in state.order:
            s = p.steps.get(p.train_next)
            if (p.done or p.stage_running or p.alongside_stage is not None or not rnd.free or s is None
                    or s.rewarded >= s.samples
                    or s.gen_done < cfg.early_from * s.samples):
                continue
            stage = self._early_stage(p, s)
            tp = rollout_tp(p, state.cost)
            if stage is None or len(rnd.free) < tp or not self._in_tail(p):
                continue
            critical = self._paced_critical(rnd, p)
            if not critical and not cfg.early_merges:
                continue  # a pipeline off the critical path would take devices the critical one could use
            in_tools = s.samples - s.gen_done > p.load()
            if in_tools and not cfg.early_in_tool_calls:
                continue  # trajectories in tool calls come back for their next turn: not a tail
            # the rollout's projected end reads its requests' predictions: only now; a step
            # generated in full waits on its rewards for about as long as its earlier steps did
            drain = max((r.predicted_drain_s() for r in p.replicas), default=0.0)
            if in_tools:  # ... and one with trajectories in tool calls waits on them too
                drain = max(drain, self._tool_calls_left_s(p))
            if cfg.early_in_reward_wait:
                drain = max(drain, self._reward_wait_s(p, state.t))
            home = set(rnd.share[p.name])
            pool = [d for d in sorted(rnd.free) if d in home]
            if critical:  # off the critical path: its own home's free devices alone
                pool += [d for d in self._lendable(rnd, p, drain) if d not in home]
            pool = self._on_trainer_site(state, pool)
            need = state.cost.stage_min_gang(p.model, stage)
            if len(pool) < max(tp, need):
                continue  # fewer devices than hold the model's weights
            tokens = s.finished_tokens - s.covered.get(stage, 0)
            price = lambda g, n: state.cost.forward_s(p.model, g, n)
            fixed = state.cost.f.train_stage_overhead_s
            ranked = self._affinity(rnd, p, pool, "train")
            # the load of the training state onto devices that lack it comes first: the
            # narrowest gang pays the most of it (odd_workloads seed 30: a 32B's early pass
            # on one A100 priced at 2.4 s ran 23.2 s, 20.8 s of it the load, and held the
            # log-prob pass 20 s past the rollout's end)
            held = next((i for i, d in enumerate(ranked) if state.devices[d].train_resident != p.name), len(ranked))
            costs = self._costs_of(state, ranked)  # every class of the pool's: one scan, not one a width
            switch = lambda g: 0.0 if g <= held else self._load_s(p, g, costs)
            # the narrowest gang that reads them all before the rollout is projected to end
            # (a pass's fixed cost is paid per device); else all free devices, reading what
            # they can by then (a pass still running when the batch is complete would hold
            # the stage back), if that is worth a pass's fixed cost
            g = next((g for g in range(need, len(pool) + 1) if price(g, tokens) + switch(g) <= drain), 0)
            chunk = tokens
            if not g:
                g = len(pool)
                room = drain - fixed - switch(g)
                chunk = int(tokens * room / max(1e-9, price(g, tokens) - fixed))
                if chunk <= 0 or price(g, chunk) - fixed < cfg.early_min_fixed * fixed:
                    continue
            devs = self._holding(state, p, stage, ranked[:g])
            if not devs:
                continue
            out.append(RunStage(p.name, p.train_next, stage, devs, colocated=False, early=True,
                                tokens=0 if chunk >= tokens else chunk))
            rnd.free.difference_update(devs)

    @staticmethod
    def _early_rest(rnd, out) -> None:
        """``early_rest``: an early pass still running once its step's batch is complete
        (every trajectory generated and rewarded) and the stage's own pass is next goes on
        as that pass from its next boundary (``ResizeStage.rest``), on the devices it holds
        then: it would otherwise finish its chunk, pay the pass's fixed cost again and hold
        the stage back meanwhile (a lone DAPO 7B on 8 H100: the pass ended 1.8 s after
        verl-sync's, which ran none). Growth rules act on it from then on as on any
        running stage."""
        for p in rnd.state.order:
            rs, stage = p.running_stage, p.early_stage
            if rs is None or stage is None or rs.rest or rs.step != p.train_next or rs.micro_batches_left <= 1:
                continue  # (in its last micro-batch it ends by itself at the boundary)
            s = p.steps.get(rs.step)
            if s is None or s.rewarded < s.samples or p.stages[p.stage_next] != stage \
                    or waits_for_alongside(stage, p.alongside_stage):
                continue
            out.append(ResizeStage(p.name, rs.step, stage, rnd.stage_devices(p), rest=True))

    def _early_stage(self, p, s) -> str | None:
        """The first forward stage (before any stage that needs the whole batch) with enough
        finished tokens its early passes have not read."""
        for stage in early_stages(p.stages):
            if s.finished_tokens - s.covered.get(stage, 0) >= self.config.early_chunk * max(1, s.finished_tokens):
                return stage
        return None

    def _gang(self, rnd, p, unnarrowed: bool = False) -> tuple:
        """The devices ``p``'s next stage starts on now, () to wait; ``unnarrowed``: every
        device the look-ahead would start it with, before the width rules narrow it."""
        state, free = rnd.state, rnd.free
        stage = p.next_stage
        home = rnd.home[p.name][1]
        home_free = [d for d in home if d in free]
        if stage == "weight_sync":
            devs = home_free or self._lendable(rnd, p, 5.0)
            return tuple(self._affinity(rnd, p, devs, "train")[:1])
        if not self.config.resize:
            return tuple(home) if len(home_free) == len(home) else ()
        room = self._rollout_room(rnd, p)
        if room:  # the rollout's part of the home stays free for it (async_reserve)
            leave = set(self._affinity(rnd, p, home_free, "rollout")[:room])
            home = [d for d in home if d not in leave]
            home_free = [d for d in home_free if d not in leave]
        loans = self.config.loans
        # with micro-batch loans a loan need only last one micro-batch: its owner reclaims it
        # at a boundary; without, it must outlast the whole stage
        g_est = max(1, len(home))
        duration = (self._micro_batch_s(state, p, stage, g_est) if loans else self._stage_s(state, p, stage, g_est))
        lent = self._lendable(rnd, p, duration, training=True)
        home, lent, home_free = (self._on_trainer_site(state, x) for x in (home, lent, home_free))
        now = home_free + [d for d in lent if d not in home_free]
        # where the first class's profile says these devices cannot hold the stage, priced on
        # the class of those that do (``_holding``; one class: ``state.cost`` alone): sized
        # from the first class's 48 GB, a 32B's update on a home of 96 GB H20s looked too big
        # for it, and two pipelines each waiting for the other's home deadlocked. Priced so
        # everywhere, the look-ahead's plans changed where the first class already held them
        # (the heterogeneous block's activation-off runs at seed 0, S = 4: 27.9 -> 22.9 samples/s)
        held = state.cost_of(self._holding(state, p, stage, now) or now)
        if not self.config.lookahead:
            need = min(state.cost.stage_min_gang(p.model, stage), held.stage_min_gang(p.model, stage))
            return tuple(now) if len(now) >= need else ()
        # look-ahead: start now with what is free (and, with loans, grow at the first
        # micro-batch boundary onto the home devices free by then), or wait for the i-th
        # busy home device and start bigger; pick the earliest projected end
        later = self._busy_home_s(rnd, home)
        # the devices its candidate gangs are drawn from, priced with the restarts their
        # preemptions so far foretell (None: none of them was preempted)
        risks = self._restart_risks(rnd, p, now + [d for d in home if d not in free])
        best = None
        for i in range(0, min(len(later), self.config.width - 1) + 1):  # ``width`` candidate plans
            wait = later[i - 1] if i else 0.0
            if wait > self.config.horizon_s:
                break
            g = len(now) + i
            if g == 0:
                continue
            whole = self._gang_s(rnd, p, stage, g, risks=risks)
            if whole == INF and held is not state.cost:
                whole = self._gang_s(rnd, p, stage, g, held, risks)
            if whole == INF:
                continue  # too few devices to hold the pass's state
            end = wait + whole
            if loans and i == 0:
                first = self._micro_batch_s(state, p, stage, g)
                joined = sum(1 for x in later if x <= first)
                rest = (MICRO_BATCHES - 1) / MICRO_BATCHES
                grown = self._at_risk(rnd, p, first + rest * self._stage_s(state, p, stage, g + joined), g + joined, risks)
                end = min(end, grown)
            # ``grow_in_plan``: with every other pipeline done, nothing else takes the home
            # devices as they free, so the growth the plan prices is the growth that happens
            if (i == 0 and not loans and later and self.config.grow_in_plan and self.config.grow_at_home
                    and self._alone(state, p)):
                end = min(end, self._grown_end_s(rnd, p, stage, g, later[:self.config.width - 1], risks))
            if best is None or end < best[0] - 1e-9:
                best = (end, i)
        if best is None or best[1] > 0:
            return ()  # waiting for busy home devices finishes sooner
        if self.config.wait_for_freed and self._freed_soon_sooner(rnd, p, stage, len(now), later, best[0]):
            return ()  # waiting for devices that free up soon, and that no one takes back, finishes sooner
        if unnarrowed:
            return tuple(self._affinity(rnd, p, now, "train"))
        gang = self._no_slower_gang(rnd, p, stage, now, risks)
        if not gang and self.config.idle_spread and self._alone(state, p):
            gang = self._fastest_gang(rnd, p, stage, now, best[0], risks)
        gang = gang or self._packed(rnd, p, stage, self._affinity(rnd, p, now, "train"))
        return gang if risks is not None else self._resident_if_sooner(rnd, p, stage, now, gang)

    def _grown_end_s(self, rnd, p, stage, g: int, later: list, risks) -> float:
        """``grow_in_plan``: when a stage started now on ``g`` devices ends, growing at each
        micro-batch boundary onto the busy home devices projected free by then (``later``:
        seconds until each frees, the ones the wait candidates weigh), each growth paying
        the load of the training state onto the devices it adds (``grow_at_home`` grows it so).
        Priced only for a pipeline running alone: beside others, the devices it was priced to
        grow onto went to a critical pipeline that borrowed them (``keep_critical_loans``:
        a running stage off the critical path does not reclaim its home), and a 0.5B's
        log-prob pass started on 1 device ran there 171 s (synthetic mix s14, +6.0%)."""
        state = rnd.state
        widths: dict = {}

        def whole(k: int) -> float:
            if k not in widths:
                widths[k] = self._gang_s(rnd, p, stage, k, risks=risks)
            return widths[k]

        t, cur = 0.0, g
        for _ in range(MICRO_BATCHES):
            t += whole(cur) / MICRO_BATCHES
            k = g + sum(1 for x in later if x <= t)
            if k > cur and whole(k) < INF:
                t += state.cost.context_switch_s(p.model, k - cur, train_state=True)
                cur = k
        return t

    def _resident_if_sooner(self, rnd, p, stage, now: list, gang: tuple) -> tuple:
        """``gang``, or where it reaches devices without ``p``'s training state, the gang of
        ``now``'s devices that hold it (``_packed``) if that ends the pass sooner: the
        executor loads the state onto a gang any of whose devices lacks it
        (``_switch_in_s``), which the widths were priced without. A 1.5B log-prob pass on
        its 2 home H20s and the pool's one spare device took 2.35 s, 0.32 s of it the
        load, where the 2 alone took 2.03 s (odd_workloads seed 143). A gang priced with
        restarts (``_gangs_on``) has the load in its price already."""
        state = rnd.state
        switch = self._switch_in_s(state, p, gang)
        if switch <= 0.0:
            return gang
        held = [d for d in now if state.devices[d].train_resident == p.name]
        if len(held) < state.cost.stage_min_gang(p.model, stage):
            return gang
        mine = self._packed(rnd, p, stage, self._affinity(rnd, p, held, "train"))
        if (self._class_layout_s(state, p, stage, mine) + self._update_reload_s(state, p, stage, mine)
                < self._class_layout_s(state, p, stage, gang) + switch + self._update_reload_s(state, p, stage, gang) - 1e-9):
            return mine
        return gang

    def _update_reload_s(self, state, p, stage, devices) -> float:
        """The load of ``p``'s training state that a forward pass on ``devices`` leaves to the
        update after it: the update needs at least its fewest devices, and where the pass
        holds fewer, the update's gang reaches devices without the state, which the executor
        loads onto the whole gang again. A 32B's log-prob pass on the 6 of 14 free A100s that
        held its state (4.3 s, against 3.0 s on all 14 plus a 1.5 s load) left its update of
        8 to load it again (2.6 s; seen on odd_workloads seed 393 under a variant of the tail
        moves not kept, docs/simulator.md). 0 for any other stage."""
        if stage not in FORWARD_STAGES:
            return 0.0
        k = p.stages.index(stage) if stage in p.stages else len(p.stages)
        need = max((state.cost.stage_min_gang(p.model, u) for u in p.stages[k + 1:] if u in UPDATE_STAGES), default=0)
        if len(devices) >= need:
            return 0.0
        return self._load_s(p, need, self._costs_of(state, devices))

    def _freed_soon_sooner(self, rnd, p, stage, g: int, home_later: list, end_now: float) -> bool:
        """``wait_for_freed``: a gang of the ``g`` devices free to ``p`` now, projected to
        end at ``end_now`` (seconds from now), would end past the job set's projected
        finish (``_paced_last``: the latest at the observed paces), so would move it, and
        later than one that waits for the first k of the busy devices outside its home whose
        owner has finished (or never had them) and starts on those, the ``g`` and the home
        devices free by then, by ``wait_gain``. The look-ahead's candidates wait for home
        devices only; these devices go to whoever is ready when they free up, and a pass
        started on a narrow home grows onto them only at its first micro-batch boundary.
        Off the critical path the rule measured chaotic (docs/simulator.md)."""
        state = rnd.state
        if state.t + end_now <= self._paced_last(rnd):
            return False  # the narrow start does not move the job set's projected finish
        home = set(rnd.home[p.name][1])
        pipelines = state.pipelines
        spare = [d for d in range(len(state.devices)) if d not in rnd.free and d not in home
                 and ((o := rnd.owner.get(d)) is None or pipelines[o].done)]
        spare = self._on_trainer_site(state, spare)
        if not spare:
            return False
        total = g + len(home_later) + len(spare)
        if self._stage_s(state, p, stage, total) >= end_now:
            return False  # no wait, however long, ends sooner: the pass on all of them does not
        soon = sorted(self._busy_for_s(state, d) for d in spare)
        for k in sorted({min(len(soon), 2 ** i) for i in range(len(soon).bit_length() + 1)}):  # 1, 2, 4, ... all
            wait = soon[k - 1]
            if wait >= end_now:
                return False
            joined = sum(1 for x in home_later if x <= wait)
            if wait + self._stage_s(state, p, stage, g + joined + k) < end_now * (1 - self.config.wait_gain):
                return True
        return False

    def _run_alongside(self, rnd, p, out) -> bool:
        """``concurrent_stages``: start ``p``'s next stage (the log-prob pass, the critic's
        update) on a gang of its own and its partner (the reference pass, the actor's
        update; ``algorithms.ALONGSIDE``) beside it, the devices the look-ahead would
        start the first with split so that the later of the two ends soonest (each at its
        fastest width within its part), when that beats the two one after the other on all
        of them by ``alongside_gain``. True if it did."""
        state, cfg = rnd.state, self.config
        stage = p.next_stage
        if not (cfg.concurrent_stages and state.concurrent_stages and cfg.resize and cfg.lookahead
                and may_run_alongside(stage, p.stages, p.stage_next)):
            return False
        pool = self._gang(rnd, p, unnarrowed=True)
        n = len(pool)
        if n < 2:
            return False
        partner = p.stages[p.stage_next + 1]
        if self._restart_risks(rnd, p, pool) is not None:
            return self._run_alongside_at_risk(rnd, p, out, pool)
        first = prefix_fastest(self._stage_times(rnd, p, stage, n)[:n])
        second = prefix_fastest(self._stage_times(rnd, p, partner, n)[:n])
        # (end, the first's time and width, the second's) for each split k | n - k
        end, t1, w1, t2, w2 = min((max(first[k - 1][0], second[n - k - 1][0]), *first[k - 1], *second[n - k - 1])
                                  for k in range(1, n))
        in_turn = first[n - 1][0] + second[n - 1][0]
        if end == INF or end > in_turn * (1 - cfg.alongside_gain):
            # nothing started this round: the pair waits for devices about to free up
            return cfg.alongside_wait and self._pair_later(rnd, p, stage, partner, n, end)
        gpn = max(1, state.gpus_per_node)
        a = (self._node_group(rnd, p, list(pool), w1) if w1 <= gpn else ()) or self._take(rnd, p, stage, pool, w1)
        rest = [d for d in pool if d not in a]
        b = (self._node_group(rnd, p, rest, w2) if w2 <= gpn else ()) or self._take(rnd, p, partner, rest, w2)
        # each gang of the pair loads the training state onto its devices that lack it,
        # where the two in turn on the pool load it once (odd_workloads seed 194: a 72B's
        # log-prob and reference passes on 5 + 8 H20 each loaded it, the second 6 s, and
        # ended 0.9 s after the two in turn would have)
        switch = self._switch_in_s
        # each as placed: the devices left to the second may form no node-local groups
        t1, t2 = max(t1, self._placed_s(state, p, stage, a)), max(t2, self._placed_s(state, p, partner, b))
        end = max(t1 + switch(state, p, a), t2 + switch(state, p, b))
        if end > (in_turn + switch(state, p, pool)) * (1 - cfg.alongside_gain):
            return False
        return self._start_alongside(rnd, p, out, stage, partner, a, b)

    def _busy_home_s(self, rnd, home) -> list:
        """Seconds until each busy device of ``home`` frees (``_busy_for_s``), soonest first:
        the waits the look-ahead's plans weigh."""
        return sorted(self._busy_for_s(rnd.state, d) for d in home if d not in rnd.free)

    def _pair_later(self, rnd, p, stage, partner, n: int, now_end: float) -> bool:
        """``alongside_wait``: whether ``p``'s pair (``stage`` and its ``partner``) should wait
        for busy devices of its home rather than start on the ``n`` it may take now: started
        once the k-th of them frees (projected by ``_busy_for_s``; k = 1, 2, 4, ... within
        ``horizon_s``; devices of finished pipelines go to whoever is ready when they free
        up, so a wait for them bought nothing: synthetic mix s21026), split at its best, it ends
        ``alongside_gain`` sooner than the pair on the ``n`` now (``now_end``) and than the
        two in turn: the first on the ``n`` now, growing onto the devices freed by its first
        micro-batch boundary, the second on all those freed by the first's end (the
        look-ahead's plans, as ``_gang`` prices them)."""
        state, cfg = rnd.state, self.config
        later = [t for t in self._busy_home_s(rnd, self._on_trainer_site(state, rnd.home[p.name][1]))
                 if t <= cfg.horizon_s]
        if not later:
            return False
        top = n + len(later)
        first = prefix_fastest(self._stage_times(rnd, p, stage, top)[:top])
        second = prefix_fastest(self._stage_times(rnd, p, partner, top)[:top])
        t1 = first[n - 1][0]
        if cfg.loans:  # the first grows at its first micro-batch boundary onto what freed by then
            mb = t1 / MICRO_BATCHES
            t1 = min(t1, mb + (MICRO_BATCHES - 1) / MICRO_BATCHES * first[n + sum(1 for x in later if x <= mb) - 1][0])
        in_turn = t1 + second[n + sum(1 for x in later if x <= t1) - 1][0]
        beat = min(in_turn, now_end) * (1 - cfg.alongside_gain)
        for k in sorted({min(len(later), 2 ** i) for i in range(len(later).bit_length() + 1)}):  # 1, 2, 4, ... all
            wait, m = later[k - 1], n + k
            if wait >= beat:
                break
            if wait + min(max(first[a - 1][0], second[m - a - 1][0]) for a in range(1, m)) < beat:
                return True
        return False

    def _run_alongside_at_risk(self, rnd, p, out, pool) -> bool:
        """``_run_alongside`` on a pool some of whose devices were preempted: for each width
        of the first stage, its best gang of the pool (``_gangs_on``: on the devices it
        would get, with its expected restarts), and the partner's best gang of those left;
        the pair whose later end is soonest. Priced on the whole pool as the split without
        risks is, the partner of a 14B PPO step (odd_workloads --preempt seed 158,
        cost-aware activation off) was priced on the 18 devices never preempted and got
        the 15 that were, each preempted every 1.8 s: its pass never finished."""
        cfg = self.config
        stage, partner = p.next_stage, p.stages[p.stage_next + 1]
        firsts = self._gangs_on(rnd, p, stage, pool)
        together = min(t for t, _ in firsts) + min(t for t, _ in self._gangs_on(rnd, p, partner, pool))
        best = None
        for t1, a in firsts[:-1]:
            if t1 == INF:
                continue
            rest = [d for d in pool if d not in a]
            t2, b = min(self._gangs_on(rnd, p, partner, rest), key=lambda x: (x[0], len(x[1])))
            if best is None or max(t1, t2) < best[0]:
                best = (max(t1, t2), a, b)
        if best is None or best[0] == INF or best[0] > together * (1 - cfg.alongside_gain):
            return False
        return self._start_alongside(rnd, p, out, stage, partner, best[1], best[2])

    def _start_alongside(self, rnd, p, out, stage, partner, a, b) -> bool:
        state = rnd.state
        a, b = self._holding(state, p, stage, a), self._holding(state, p, partner, b)
        if not a or not b:
            return False
        out.append(RunStage(p.name, p.train_next, stage, tuple(a), colocated=False, alongside=True))
        out.append(RunStage(p.name, p.train_next, partner, tuple(b), colocated=False))
        rnd.free.difference_update(a)
        rnd.free.difference_update(b)
        return True

    def _no_slower_gang(self, rnd, p, stage, devices: list, risks=None) -> tuple:
        """``fastest_width``: the narrowest gang of the fastest width below ``len(devices)``
        when every one of ``devices`` would make the pass slower (few tokens a device leave
        it bound by parameter all-gathers, over the node NICs once it outgrows a node; or,
        with ``risks``, each device more preempts it more often); () when all of them are
        the fastest."""
        if not self.config.fastest_width or len(devices) < 2:
            return ()
        if risks is not None:  # the best gang of them, on the devices it was priced on
            _, gang = min(self._gangs_on(rnd, p, stage, devices), key=lambda x: (x[0], len(x[1])))
            return gang if len(gang) < len(devices) else ()
        state = rnd.state
        full = self._stage_s(state, p, stage, len(devices))
        fastest = self._gang_s(rnd, p, stage, len(devices))
        if fastest >= full * (1 - 1e-9):
            return ()
        return self._fastest_gang(rnd, p, stage, devices, fastest)

    def _gang_s(self, rnd, p, stage, g: int, cost=None, risks=None) -> float:
        """The pass's time on ``g`` devices, or with ``fastest_width`` on the fastest
        gang they hold (any width up to ``g``: FSDP shards over any count); priced on
        ``cost`` (None: ``state.cost``) and with the restarts ``risks`` foretells
        (``_restart_risks``; None: none)."""
        if not self.config.fastest_width:
            if risks is not None:
                return self._risky_times(rnd, p, stage, g, risks)[-1]
            return self._stage_s(rnd.state, p, stage, g, cost)
        return min(self._stage_times(rnd, p, stage, g, cost, risks)[:g])

    def _stage_times(self, rnd, p, stage, upto: int, cost=None, risks=None) -> list:
        """The pass's time on 1, 2, ... devices (index ``w - 1``), at least ``upto`` of them
        (maybe more: callers slice), each width priced once for what the pass reads: the
        look-ahead and the width rules read every width below a gang's, every round the
        stage waits. Priced on ``cost`` (None: ``state.cost``); with ``risks`` (from
        ``_restart_risks``) on the first devices of ``risks.order`` and with their
        expected restarts (``_risky_times``; not kept)."""
        if risks is not None:
            return self._risky_times(rnd, p, stage, upto, risks)
        cost = cost or rnd.state.cost
        key = (cost, p.model, stage, self._pass_tokens(p, stage))
        times = self._widths_s.get(key)
        if times is None:
            if len(self._widths_s) >= STAGE_TIMES_KEPT:
                self._widths_s.clear()
            times = self._widths_s[key] = []
        while len(times) < upto:
            times.append(self._stage_s(rnd.state, p, stage, len(times) + 1, cost))
        return times

    def _fastest_gang(self, rnd, p, stage, now: list, end: float, risks=None) -> tuple:
        """The narrowest gang of fewer than ``now`` devices that ends no later than ``end``,
        on one node where it fits; () if none: for ``fastest_width`` (``end`` the fastest
        width's time) and for the run's last pipeline (``idle_spread``: ``end`` the
        look-ahead's best with all of them). A gang's time is not monotone in its
        width: few tokens a device leave a pass bound by its parameter all-gathers, which
        cross the node NICs once the gang outgrows a node (a 14B update over 64K tokens: 4.7 s
        on one 4-device node, 29 s on 16 devices over four). The narrowest gang that merely
        matches the whole width's end is for the last pipeline only: while others run, such
        a gang changes who gets which devices when, and measured chaotic (docs/simulator.md)."""
        if risks is not None:  # the narrowest of ``now``'s gangs priced with restarts that ends by then
            return next((gang for t, gang in self._gangs_on(rnd, p, stage, now)[:len(now) - 1] if t <= end + 1e-9), ())
        gpn = max(1, rnd.state.gpus_per_node)
        for g, t in enumerate(self._stage_times(rnd, p, stage, len(now) - 1)[:len(now) - 1], 1):
            if t <= end + 1e-9:
                group = self._node_group(rnd, p, now, g) if g <= gpn else ()
                gang = group or self._take(rnd, p, stage, self._affinity(rnd, p, now, "train"), g)
                # the width is priced as placed at best; where ``now`` cannot place it so
                # (its node-local groups), a wider gang may still end by ``end``
                if self._placed_s(rnd.state, p, stage, gang) <= t * (1 + 1e-9):
                    return gang
        return ()
