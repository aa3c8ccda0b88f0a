"""Width trials: the run's last synchronous pipeline tries wider rollout widths on its
steps and keeps the one whose steps ended soonest (``width_trials``).

``alone_width`` projects each width's bulk from the batch its KV cache holds (waves of a
full batch). For a multi-turn agent that projection is wrong: its trajectories spend part of
each turn in tool calls and in the prefill of their observations, so a narrow replica's
batch thins while a wide one, which queues more trajectories than it runs, refills from its
queue; the wide one also starts decoding after prefilling only what it admits (a search
agent alone on 8 H100, seed 0: projected tp1, whose steps' generation took 38.4-40.0 s,
where tp4's took 34.9-37.0 s). A user of verl tunes that width by running the job at
several; a job alone can measure it on its own steps instead: the width projected first,
then, while at least ``TRIAL_STEPS_LEFT`` steps remain, the next wider width on one step,
climbing while a wider width's step ends sooner than the best so far, and from then on the
width whose steps took least on average (a step's time: its generation and the training
after it, ``WidthTrials.observe``). Only widths at or above the
projection are tried (the projection's blind spot is the thinning, which favours wider).

Pure bookkeeping over what the policy sees (each step's generation start and its stages'
ends, from the pipeline's step views) and what it chose; ``Jigsaw._cheapest_width`` asks it,
``Jigsaw.decide`` has it read the step views every round."""

from __future__ import annotations

__all__ = ["WidthTrials", "TRIAL_STEPS_LEFT"]

#: a trial needs steps after it to use what it finds: the trial step and at least two more
TRIAL_STEPS_LEFT = 3


class WidthTrials:
    """One pipeline's steps' launch widths and how long those steps took."""

    def __init__(self):
        self.chosen: dict[int, int] = {}  # step -> the width its generation launched at
        self.seen: dict[int, list[float]] = {}  # width -> seconds of its steps (``observe``)
        self._span: dict[int, tuple[float, float]] = {}  # step -> (its start, its last end seen)
        self._pinned: set[int] = set()  # steps launched at a width other than the projection

    def observe(self, steps) -> None:
        """Follow each step with a chosen width (``steps``: step -> ``StepView``, the steps not
        yet trained), and count its time once it is trained (gone from ``steps``): from its
        generation's start to the end of its last stage seen, its generation and the
        training after it, which is what the width moves (a wider replica's generation
        can end sooner and leave fewer devices to the step's early forward passes: a 32B
        DAPO alone on 16 H100 generated 3-8% faster a step at tp8 than at tp4, and ran
        1.4% longer). The weight sync after the last stage is left out: the same at
        every width."""
        for k, s in steps.items():
            if k in self.chosen:
                ends = list(s.stage_end_t.values())
                if s.gen_end_t is not None:
                    ends.append(s.gen_end_t)
                self._span[k] = (s.gen_start_t, max(ends, default=s.gen_start_t))
        for k in [k for k in self._span if k not in steps]:
            start, end = self._span.pop(k)  # trained: a step does not come back
            self.seen.setdefault(self.chosen[k], []).append(end - start)

    def best(self) -> int | None:
        """The width whose steps took least on average (None: none seen)."""
        if not self.seen:
            return None
        return min(self.seen, key=lambda w: (sum(self.seen[w]) / len(self.seen[w]), w))

    def width_for(self, step: int, steps_left: int, widths: list[int], projected: int, launching: bool) -> int:
        """The width step ``step``'s generation launches at: the projection until it has
        been seen; then the next width above the best so far, once, while ``steps_left``
        allow a trial; otherwise the best. A step launched at another width than the
        projection keeps it for the whole step (its spreads and re-launches too); one
        launched at the projection follows it, as without trials; so does a step asked
        about only once it generates (it launched before the trials could choose: at the
        spec's width, nothing observed yet), whose time is not counted. ``widths``
        ascending; ``launching``: the step has not started generating."""
        got = self.chosen.get(step)
        if got is not None:
            return got if step in self._pinned else projected
        if not launching:
            return projected
        best = self.best()
        if best is None or projected not in self.seen:
            got = projected
        else:
            above = [w for w in widths if w > best and w >= projected]
            nxt = above[0] if above else None
            got = nxt if nxt is not None and nxt not in self.seen and steps_left >= TRIAL_STEPS_LEFT else best
        self.chosen[step] = got
        if got != projected:
            self._pinned.add(step)
        return got
