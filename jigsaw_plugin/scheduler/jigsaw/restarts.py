"""Training gangs priced with the restarts preemptions foretell: a pass loses its progress
whenever a device of its gang is preempted (the update's start is its only checkpoint) and
runs again once the replacement joins, so a gang's expected time grows exponentially with
its devices' preemption rate times the pass's length (``estimates.restart_priced_s``).
The rates are what the pool has seen so far (``SchedulerState.preemptions``), never a
preemption still to come; with none seen every method here is the identity and gangs are
priced as if their devices stayed.

A mixin of ``Jigsaw`` (``policy.py``), used by ``gangs`` and ``loans``; see
``projections.py`` for how the mixins fit."""

from __future__ import annotations

from typing import NamedTuple

from jigsaw_plugin.scheduler.estimates import device_risks, restart_priced_s
from jigsaw_plugin.scheduler.jigsaw.round import INF, UNSET

__all__ = ["GangRisks", "RestartPricing"]


class GangRisks(NamedTuple):
    """What the preemptions seen so far foretell for a training gang drawn from ``order``
    (``TrainingGangs._restart_risks``): index ``w - 1`` is a gang of its first ``w``."""

    order: tuple  # candidate devices, the least preempted first (``_affinity``'s training order)
    rate: tuple  # preemptions a second over the gang's devices
    wait: tuple  # seconds a restart waits for the replacement (down times weighted by rate)


class RestartPricing:
    """``Jigsaw``'s pricing of training gangs on devices that are preempted."""

    def _risk(self, rnd) -> dict:
        """Device -> (preemptions a second, seconds down) its class has shown so far
        (``estimates.device_risks``), once a round; empty where no device was preempted
        or with ``restart_pricing`` off."""
        if rnd.risk is UNSET:
            rnd.risk = device_risks(rnd.state) if self.config.restart_pricing else {}
        return rnd.risk

    def _restart_risks(self, rnd, p, devices) -> GangRisks | None:
        """``devices`` in ``_affinity``'s training order (the least preempted first) and,
        for a gang of the first 1, 2, ... of them, its preemptions a second in all and the
        wait for a replacement once one comes (each device's observed down time, weighted
        by its rate). None where none of ``devices`` was preempted so far and all are of one
        class: gangs are priced as if their devices stayed, on that class, placed at best.
        Devices of several classes are priced as they would be placed (``_gangs_on``), their
        preemptions or none: a gang priced as the first class, placed at best, misjudged
        what a wider gang costs where it reaches a slower class in nodes of one
        (odd_workloads --classes seed 70: a 14B update on 13 A100 and 36 RTX 4090-like
        devices grown to 45 of them, priced as 45 A100 and run in 59 s, where verl-sync's 32
        took 30 s)."""
        risk = self._risk(rnd)
        preempted = bool(risk) and any(risk.get(d, (0.0,))[0] > 0 for d in devices)
        if not preempted and len(self._classes_of(rnd.state, devices)) <= 1:
            return None
        order = tuple(self._affinity(rnd, p, devices, "train"))
        rates, waits, rate, weighted = [], [], 0.0, 0.0
        for d in order:
            r, down = risk.get(d, (0.0, 0.0))
            rate += r
            weighted += r * down
            rates.append(rate)
            waits.append(weighted / rate if rate > 0 else 0.0)
        return GangRisks(order, tuple(rates), tuple(waits))

    def _at_risk(self, rnd, p, t: float, g: int, risks: GangRisks | None) -> float:
        """A pass of ``t`` seconds on a gang of the first ``g`` of ``risks.order`` priced
        with its expected restarts (``_with_restarts``); None: ``t``. A gang wider than
        ``risks.order`` adds devices at their mean rate."""
        if risks is None:
            return t
        n = len(risks.order)
        rate, wait = risks.rate[min(g, n) - 1], risks.wait[min(g, n) - 1]
        if g > n:
            rate *= g / n
        return self._with_restarts(rnd, p, t, g, rate, wait)

    @staticmethod
    def _with_restarts(rnd, p, t: float, g: int, rate: float, wait: float, whole: float | None = None) -> float:
        """``t`` seconds of a pass on ``g`` devices preempted ``rate`` times a second in all
        (``restart_priced_s``), each restart waiting ``wait`` for the replacement, then
        reloading the training state onto the gang and running the whole pass again
        (``whole`` seconds; default ``t``), as the simulator's ``World.restart_stage`` does."""
        again = (t if whole is None else whole) + rnd.state.cost.context_switch_s(p.model, g, train_state=True)
        return restart_priced_s(t, rate, wait, again)

    def _set_risk(self, rnd, devices) -> tuple[float, float]:
        """(preemptions a second, rate-weighted seconds down) over exactly ``devices``."""
        risk = self._risk(rnd)
        rate = weighted = 0.0
        for d in devices:
            r, down = risk.get(d, (0.0, 0.0))
            rate += r
            weighted += r * down
        return rate, (weighted / rate if rate > 0 else 0.0)

    def _risky_times(self, rnd, p, stage, upto: int, risks: GangRisks) -> list:
        """The pass's expected time on 1, 2, ... ``upto`` devices (index ``w - 1``): up to
        ``len(risks.order)`` its best gang of them (``_gangs_on``), past it as placed at
        best with the devices' mean rate."""
        state = rnd.state
        out = [t for t, _ in self._gangs_on(rnd, p, stage, risks.order)][:upto]
        for w in range(len(out) + 1, upto + 1):
            out.append(self._at_risk(rnd, p, self._stage_s(state, p, stage, w), w, risks))
        return out

    def _gangs_on(self, rnd, p, stage, devices) -> list:
        """For each width ``w`` from 1 to ``len(devices)`` (index ``w - 1``): (expected time,
        gang) of the best of its candidate gangs of at most ``w`` of ``devices``, each
        priced on those very devices (their class and their nodes: the restarts' odds grow
        exponentially with the pass's length, and a width priced as placed at best
        understated an 8B update on four devices in nodes of one, a 24 GB class among them,
        about six times) and with the restarts their preemptions so far foretell. The
        candidates of a width are the first ``w`` of ``_affinity``'s training order (the
        least preempted first) and, on a pool of several classes, of each class's devices
        first: the least preempted device may be of a class too small to hold the state in
        few, where two devices of a class preempted now and then hold it (odd_workloads
        --preempt seed 36, activation off: an 8B update on an L40S and three A100s
        preempted every 18 s). Where some of ``devices`` were preempted, widths past 8 are
        priced about four to an octave (a wider width takes the best below it: at 54
        devices every width, priced in each of a round's five calls, made a run preempted
        every 2 s crawl); where none were (a pool of several classes), every width: the
        two halves of a PPO step's updates run alongside need the width that just holds
        each (odd_workloads --classes seed 78, a 72B on 36 devices: 17 and 17, where the
        grid offered 16, too few, and 20, leaving too few for the other: 791 -> 1,342 s).
        Once a round for each pipeline, stage and set of devices."""
        key = (p.name, stage, tuple(devices))
        got = rnd.risky.get(key)
        if got is not None:
            return got
        state = rnd.state
        base = self._affinity(rnd, p, devices, "train")
        grid = self._set_risk(rnd, base)[0] > 0
        orders = [base]
        for c in state.classes if len(state.classes) > 1 else ():
            mine = [d for d in base if d in c.devices]
            if 0 < len(mine) < len(base):
                orders.append(mine + [d for d in base if d not in c.devices])
        out, best = [], None
        for w in range(1, len(base) + 1):
            step = 1 << max(0, w.bit_length() - 3) if grid else 1  # 1 up to 7, then 2, 4, ...
            if w % step and w < len(base):
                out.append(best)  # between the widths priced: the best of at most ``w``
                continue
            seen = set()
            for order in orders:
                gang = tuple(order[:w])
                members = frozenset(gang)
                if members in seen:
                    continue
                seen.add(members)
                t = self._class_layout_s(state, p, stage, gang) + self._switch_in_s(state, p, gang)
                rate, wait = self._set_risk(rnd, gang)
                if rate > 0:
                    t = self._with_restarts(rnd, p, t, w, rate, wait)
                if best is None or t < best[0]:
                    best = (t, gang)
            out.append(best)
        rnd.risky[key] = out
        return out
