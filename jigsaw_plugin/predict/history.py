"""``LengthHistory``: the finished generation lengths of one pipeline, in bounded memory.

One per pipeline, written by its executor (``record_finished`` when a turn ends), read by
predictors. What is kept, and why it is bounded:

* **Marginal**: per turn bin (turns 0..``turn_bins``-2, the last bin holds every later
  turn) and per step, the sufficient statistics of log length: weight, sum, sum of
  squares of the uncapped lengths, and the weight of capped ones (``length >= max_tokens``:
  DAPO truncation, a censored observation). Steps older than ``window_steps`` behind the
  newest are folded into one accumulator; the read-out weighs a step ``s`` by
  ``0.5 ** ((newest - s) / half_life_steps)``, so the fit follows the length drift of RL
  training. Memory: ``window_steps x turn_bins x 4`` floats.
* **Groups**: for the newest ``window_steps`` steps, the same statistics per (GRPO group,
  turn bin) in one array per step (rows grow to the largest group index seen), plus the
  raw (group, turn, length) records for ``siblings``. Older steps are dropped: siblings
  only inform requests still in flight.
* **Prompts**: per ``prompt_key`` (at most ``max_prompt_keys``, least recently recorded
  dropped), the per-turn-bin counts and log-length sum of earlier steps and of its newest
  step, so a request of step ``s`` reads the evidence from steps before ``s`` only.
* **Recent**: a ring of up to ``recent_max`` (turn, length) pairs of the newest steps
  whose generation has ended (``close_step``): the empirical shape of the length
  distribution (``model.py``, admission limits) and inspection. A step's turns enter
  together when it closes, in an order drawn at random, so that the ring holds whole
  steps or a uniform sample of one. Not the last turns to finish: those are a step's
  short ones while its long ones still run, and the stragglers of the step before (a
  search agent of 4,096 trajectories a step finishes some 10,000 turns a step: the last
  4,096 to finish held 2,961 first turns of mean 59 tokens and 38 longer than 91, of
  mean some 900, where every turn's length is drawn with mean 82; its predictions of
  running first turns came out 7x their true remaining). Before any step has closed, the
  turns finished so far.

Lengths are clipped to ``[1, max_tokens]`` before taking logs.
"""

from __future__ import annotations

import math
from array import array
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from jigsaw_plugin.errors import SpecError

__all__ = ["LengthHistory", "LogStats", "GroupTable", "PromptEvidence"]

# columns of the statistics arrays
_N, _SUM, _SUMSQ, _CAPPED = range(4)


def _readonly(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v


@dataclass(frozen=True)
class LogStats:
    """Decayed sufficient statistics of log length, one entry per turn bin."""

    weight: np.ndarray  # float64[T]: uncapped lengths
    sum_log: np.ndarray  # float64[T]
    sumsq_log: np.ndarray  # float64[T]
    capped: np.ndarray  # float64[T]: lengths that hit max_tokens (censored at log max_tokens)


@dataclass(frozen=True)
class GroupTable:
    """One step's finished turns by GRPO group (rows) and turn bin (columns); read-only."""

    step: int
    count: np.ndarray  # float64[G, T]: uncapped lengths
    sum_log: np.ndarray  # float64[G, T]
    sumsq_log: np.ndarray  # float64[G, T]
    capped: np.ndarray  # float64[G, T]

    @property
    def groups(self) -> int:
        return self.count.shape[0]


@dataclass(frozen=True)
class PromptEvidence:
    """Earlier-step lengths of prompts: per-turn-bin counts and the sum of log lengths."""

    count: np.ndarray  # float64[K, T]
    sum_log: np.ndarray  # float64[K, T]


class _PromptRecord:
    __slots__ = ("earlier_n", "earlier_sum", "step", "current_n", "current_sum")

    def __init__(self, turn_bins: int, step: int):
        self.earlier_n = [0.0] * turn_bins
        self.earlier_sum = [0.0] * turn_bins
        self.step = step
        self.current_n = [0.0] * turn_bins
        self.current_sum = [0.0] * turn_bins


class LengthHistory:
    """Finished generation lengths of one pipeline (see the module docstring)."""

    def __init__(self, max_tokens: int, *, turn_bins: int = 8, window_steps: int = 8,
                 half_life_steps: float = 4.0, max_prompt_keys: int = 65_536, recent_max: int = 4096):
        for name, value, ok, allowed in (
            ("max_tokens", max_tokens, lambda v: v >= 1, "an integer >= 1"),
            ("turn_bins", turn_bins, lambda v: v >= 1, "an integer >= 1"),
            ("window_steps", window_steps, lambda v: v >= 1, "an integer >= 1"),
            ("max_prompt_keys", max_prompt_keys, lambda v: v >= 1, "an integer >= 1"),
            ("recent_max", recent_max, lambda v: v >= 1, "an integer >= 1"),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not ok(value):
                raise SpecError(f"LengthHistory.{name}", value, allowed)
        if isinstance(half_life_steps, bool) or not isinstance(half_life_steps, (int, float)) \
                or not half_life_steps > 0 or not math.isfinite(half_life_steps):
            raise SpecError("LengthHistory.half_life_steps", half_life_steps, "a number > 0")
        self.max_tokens = int(max_tokens)
        self.turn_bins = int(turn_bins)
        self.window_steps = int(window_steps)
        self.half_life_steps = float(half_life_steps)
        self.max_prompt_keys = int(max_prompt_keys)
        self._log_cap = math.log(self.max_tokens)
        self._count = 0
        self._newest = -1
        self._marginal_by_step: dict[int, np.ndarray] = {}  # step -> float64[T, 4]
        self._past = np.zeros((self.turn_bins, 4))  # folded older steps, weighted as of _past_step
        self._past_step = 0
        self._groups: dict[int, np.ndarray] = {}  # step -> float64[G, T, 4]
        self._records: dict[int, list[tuple[int, int, int]]] = {}  # step -> (group, turn, length)
        self._prompts: OrderedDict[str, _PromptRecord] = OrderedDict()
        self._recent_turn = np.zeros(int(recent_max), dtype=np.int64)
        self._recent_len = np.zeros(int(recent_max), dtype=np.int64)
        self._ring_n = 0  # pairs written to the ring
        # step -> its (turns, lengths) until it closes: typed arrays, read as numpy without a copy
        self._open_turns: dict[int, tuple[array, array]] = {}
        self._closed: set[int] = set()  # steps closed (within the window)
        self._marginal_cache: tuple[int, LogStats] | None = None

    # ------------------------------------------------------------------ writing

    def record_finished(self, step: int, group: int, turn: int, length: int, prompt_key: str | None = None) -> None:
        """Record one finished generation turn of ``length`` tokens."""
        for name, value, low in (("step", step, 0), ("group", group, 0), ("turn", turn, 0), ("length", length, 0)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise SpecError(f"LengthHistory.record_finished.{name}", value, f"an integer >= {low}")
        if prompt_key is not None and not isinstance(prompt_key, str):
            raise SpecError("LengthHistory.record_finished.prompt_key", prompt_key, "a string or None")
        step, group, turn, length = int(step), int(group), int(turn), int(length)
        if step > self._newest:
            self._advance(step)
        if step not in self._marginal_by_step and step > self._newest - self.window_steps:
            self._open(step)  # a late first record of a step inside the window
        b = min(turn, self.turn_bins - 1)
        capped = length >= self.max_tokens
        y = math.log(min(max(length, 1), self.max_tokens))

        if step in self._marginal_by_step:
            _add(self._marginal_by_step[step][b], y, capped, 1.0)
        else:  # a late record of a step already folded away
            _add(self._past[b], y, capped, 0.5 ** ((self._past_step - step) / self.half_life_steps))

        table = self._groups.get(step)
        if table is not None:
            if group >= table.shape[0]:
                grown = np.zeros((max(2 * table.shape[0], group + 1), self.turn_bins, 4))
                grown[: table.shape[0]] = table
                self._groups[step] = table = grown
            _add(table[group, b], y, capped, 1.0)
            self._records[step].append((group, turn, length))

        if prompt_key is not None:
            self._record_prompt(prompt_key, step, b, y)

        if step in self._closed:
            self._to_ring([turn], [length])  # a late turn of a closed step
        else:
            got = self._open_turns.get(step)
            if got is None:
                got = self._open_turns[step] = (array("q"), array("q"))
            got[0].append(turn)
            got[1].append(length)
        self._count += 1

    def close_step(self, step: int) -> None:
        """Step ``step``'s generation ended (every trajectory's last turn is recorded): its
        turns enter the recent ring, in an order drawn at random from the step, at most
        ``recent_max`` of them (a uniform sample). Its executor calls this."""
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise SpecError("LengthHistory.close_step.step", step, "an integer >= 0")
        step = int(step)
        if step in self._closed:
            return
        self._closed.add(step)
        got = self._open_turns.pop(step, None)
        if not got or not len(got[0]):
            return
        turns, lengths = (np.frombuffer(a, dtype=np.int64) for a in got)
        order = np.random.default_rng(step).permutation(len(turns))[: len(self._recent_len)]
        self._to_ring(turns[order], lengths[order])

    def _to_ring(self, turns, lengths) -> None:
        cap = len(self._recent_len)
        at = (self._ring_n + np.arange(len(lengths))) % cap
        self._recent_turn[at] = turns
        self._recent_len[at] = lengths
        self._ring_n += len(lengths)

    def _advance(self, step: int) -> None:
        """A newer step: open its arrays, fold and drop what left the window."""
        self._newest = step
        self._open(step)
        oldest = step - self.window_steps + 1
        for s in [s for s in self._open_turns if s < oldest]:
            del self._open_turns[s]  # a step that never closed (its run stopped)
        self._closed = {s for s in self._closed if s >= oldest}
        for s in [s for s in self._marginal_by_step if s < oldest]:
            self._past *= 0.5 ** ((step - self._past_step) / self.half_life_steps)
            self._past_step = step
            self._past += self._marginal_by_step.pop(s) * 0.5 ** ((step - s) / self.half_life_steps)
        for s in [s for s in self._groups if s < oldest]:
            del self._groups[s], self._records[s]

    def _open(self, step: int) -> None:
        self._marginal_by_step[step] = np.zeros((self.turn_bins, 4))
        self._groups[step] = np.zeros((64, self.turn_bins, 4))
        self._records[step] = []

    def _record_prompt(self, key: str, step: int, b: int, y: float) -> None:
        rec = self._prompts.get(key)
        if rec is None:
            rec = self._prompts[key] = _PromptRecord(self.turn_bins, step)
            if len(self._prompts) > self.max_prompt_keys:
                self._prompts.popitem(last=False)
        else:
            self._prompts.move_to_end(key)
        if step > rec.step:  # a new epoch of this prompt: its last one becomes "earlier"
            rec.earlier_n = [a + c for a, c in zip(rec.earlier_n, rec.current_n)]
            rec.earlier_sum = [a + c for a, c in zip(rec.earlier_sum, rec.current_sum)]
            rec.current_n = [0.0] * self.turn_bins
            rec.current_sum = [0.0] * self.turn_bins
            rec.step = step
        n, total = (rec.earlier_n, rec.earlier_sum) if step < rec.step else (rec.current_n, rec.current_sum)
        n[b] += 1.0
        total[b] += y

    # ------------------------------------------------------------------ reading

    @property
    def count(self) -> int:
        """Turns recorded so far (predictors may key cached fits on it)."""
        return self._count

    @property
    def newest_step(self) -> int:
        """The newest step recorded (-1 before anything finished)."""
        return self._newest

    @property
    def log_max_tokens(self) -> float:
        return self._log_cap

    def marginal(self) -> LogStats:
        """The decayed per-turn-bin statistics of every finished length."""
        hit = self._marginal_cache
        if hit is not None and hit[0] == self._count:
            return hit[1]
        total = self._past * 0.5 ** ((max(self._newest, 0) - self._past_step) / self.half_life_steps)
        for s, stats in self._marginal_by_step.items():
            total = total + stats * 0.5 ** ((self._newest - s) / self.half_life_steps)
        out = LogStats(*(_readonly(np.ascontiguousarray(total[:, c])) for c in (_N, _SUM, _SUMSQ, _CAPPED)))
        self._marginal_cache = (self._count, out)
        return out

    def window(self) -> tuple[int, ...]:
        """The steps whose groups are held, oldest first."""
        return tuple(sorted(self._groups))

    def group_table(self, step: int) -> GroupTable | None:
        """Step ``step``'s finished turns by group (None when out of the window or unseen).
        The arrays are read-only views of live storage: read them in the round they were
        taken."""
        table = self._groups.get(step)
        if table is None:
            return None
        return GroupTable(step, *(_readonly(table[:, :, c]) for c in (_N, _SUM, _SUMSQ, _CAPPED)))

    def group_stats(self, step: int) -> np.ndarray | None:
        """``group_table``'s arrays as one read-only float64[G, T, 4] view of live storage
        (statistics in the order count, sum of log, sum of squares, capped), for a
        predictor that reads a few groups of it on every call; None as ``group_table``."""
        table = self._groups.get(step)
        return None if table is None else _readonly(table)

    def siblings(self, step: int, group: int) -> tuple[tuple[int, int], ...]:
        """The finished (turn, length) pairs of one GRPO group of a step in the window."""
        return tuple((t, n) for g, t, n in self._records.get(step, ()) if g == group)

    def recent(self) -> tuple[np.ndarray, np.ndarray]:
        """(turns, lengths) of the recent ring (the newest closed steps' turns, oldest
        first, copies); before any step has closed, the last ``recent_max`` turns finished."""
        cap = len(self._recent_len)
        if not self._ring_n:  # the open steps' turns in step order, the last ``cap`` of them
            parts, need = [], cap
            for s in sorted(self._open_turns, reverse=True):
                if need <= 0:
                    break
                turns, lengths = (np.frombuffer(a, dtype=np.int64) for a in self._open_turns[s])
                parts.append((turns[-need:], lengths[-need:]))
                need -= len(parts[-1][0])
            if not parts:
                return np.zeros(0, np.int64), np.zeros(0, np.int64)
            return (np.concatenate([t for t, _ in reversed(parts)]),
                    np.concatenate([n for _, n in reversed(parts)]))
        n = min(self._ring_n, cap)
        start = self._ring_n % cap if self._ring_n > n else 0
        order = (np.arange(n) + start) % cap
        return self._recent_turn[order], self._recent_len[order]

    def recent_lengths(self, turn: int | None = None) -> np.ndarray:
        """The last ``recent_max`` finished lengths (of one turn index if given), oldest first."""
        turns, lengths = self.recent()
        return lengths if turn is None else lengths[turns == turn]

    def prompt_lengths_before(self, prompt_key: str, step: int) -> PromptEvidence | None:
        """Per-turn-bin counts and log-length sums of ``prompt_key``'s turns recorded for
        steps before ``step`` (arrays of shape [1, T]); None for an unseen key."""
        if prompt_key not in self._prompts:
            return None
        return self.prompt_evidence([prompt_key], np.array([step]))

    def prompt_evidence(self, prompt_keys: list[str | None], steps: np.ndarray) -> PromptEvidence:
        """``prompt_lengths_before`` for many (key, step) pairs at once (zeros for None)."""
        count = np.zeros((len(prompt_keys), self.turn_bins))
        sums = np.zeros((len(prompt_keys), self.turn_bins))
        get = self._prompts.get
        for i, (key, s) in enumerate(zip(prompt_keys, steps.tolist())):
            rec = get(key) if key is not None else None
            if rec is None:
                continue
            count[i] = rec.earlier_n
            sums[i] = rec.earlier_sum
            if rec.step < s:  # its newest recorded step is earlier than the asking request's
                count[i] += rec.current_n
                sums[i] += rec.current_sum
        return PromptEvidence(count, sums)


def _add(row: np.ndarray, y: float, capped: bool, w: float) -> None:
    if capped:
        row[_CAPPED] += w
    else:
        row[_N] += w
        row[_SUM] += w * y
        row[_SUMSQ] += w * y * y
