"""The adapter's own command-line flags (``--jigsaw.*``) and their validation.

The OpenRLHF CLI parses its arguments with argparse inside ``if __name__ == "__main__"`` and
rejects options it does not know, so this adapter takes its flags out of ``argv`` before
OpenRLHF sees it. Pure Python: no OpenRLHF, Ray or torch import here (unit-tested in the
core test environment).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from jigsaw_plugin.runtime.liveness import LOSS_MODES

__all__ = ["JigsawConfig", "MigrationSettings", "JigsawUsageError", "FLAGS", "MIGRATION_FLAGS", "POLICIES",
           "split_jigsaw_flags", "parse_jigsaw_flags", "resolve_staleness"]

PREFIX = "--jigsaw."

#: Rollout policies of this adapter. ``jigsaw``: per-request routing, long-tail migration
#: (consolidation) and switching engines of the pre-provisioned pool on and off;
#: ``least-in-flight``: per-request routing only (no migration, every engine on).
POLICIES = ("jigsaw", "least-in-flight")


class JigsawUsageError(ValueError):
    """Misuse of the adapter's command line or of its Python entry point (CLI exit code 2)."""


@dataclass(frozen=True)
class MigrationSettings:
    """The rollout controller's long-tail consolidation (policy ``jigsaw``), one typed value
    for ``rollout.py``. Field names are the flag names without the prefix; a bad value
    raises ``JigsawUsageError`` naming the flag, from the command line or from Python."""

    tail_fraction: float = 0.25  # consolidate once in-flight requests <= this share of the step's
    # 8, not 0: every CLI run has used 8 (rollout.py's 0 fallback was never reached), and a
    # request that has decoded a few tokens is past its prefill and really decoding, so
    # consolidation moves a decode tail, not requests still queued or in prefill.
    migrate_min_tokens: int = 8  # a request is moved only after it generated this many tokens
    poll_interval_s: float = 0.1  # how often the rollout controller looks at engine progress

    def __post_init__(self):
        for f in fields(self):  # the flags' own checks, so both entry points say the same
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise JigsawUsageError(f"{PREFIX}{f.name}: got {value!r}; allowed: a number")
            MIGRATION_FLAGS[f.name](f.name, str(value))


@dataclass(frozen=True)
class JigsawConfig:
    """What ``--jigsaw.*`` selects. Field names are the flag names without the prefix;
    ``migration`` holds the flags of ``MigrationSettings``."""

    enable: bool = False
    policy: str = "jigsaw"
    pipeline: str = "openrlhf"
    coordinator: str | None = None  # name of the shared coordinator actor; None: this run only
    namespace: str = "jigsaw"  # Ray namespace of the coordinator actor
    active_engines: int | None = None  # engines of the pool switched on at start (None: all)
    migration: MigrationSettings = field(default_factory=MigrationSettings)
    events: str | None = None  # JSONL file receiving every hook event of this run
    lease_timeout_s: float | None = None  # how long to wait for devices from the coordinator
    # the coordinator died or hangs: "stop" (raise CoordinatorDied) or "fallback" (warn, own devices)
    on_coordinator_loss: str = "stop"
    # policy versions a trained sample may lag: 0 is OpenRLHF's sync PPOTrainer; N > 0 its
    # PPOTrainerAsync with --train.async_queue_size N (the generator runs at most N batches
    # ahead of training). None: not given, the host flags' own bound (resolve_staleness).
    staleness: int | None = None

    def to_dict(self) -> dict:
        """The settings shipped to the trainer actors: ``migration`` stays a
        ``MigrationSettings`` (Ray pickles it by value)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _bool(name, raw):
    if raw is None:
        return True
    low = raw.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise JigsawUsageError(f"{PREFIX}{name}: got {raw!r}; allowed: true or false (or the bare flag)")


def _choice(choices):
    def parse(name, raw):
        if raw not in choices:
            raise JigsawUsageError(f"{PREFIX}{name}: got {raw!r}; allowed: {', '.join(choices)}")
        return raw
    return parse


def _name(name, raw):
    if not raw or raw.startswith("-") or any(c.isspace() for c in raw):
        raise JigsawUsageError(f"{PREFIX}{name}: got {raw!r}; allowed: a non-empty name without spaces")
    return raw


def _optional_name(name, raw):
    return None if raw.lower() == "none" else _name(name, raw)


def _number(kind, low, high=None, *, low_open=False, optional=False):
    def parse(name, raw):
        if optional and raw.lower() == "none":
            return None
        bound = f"{'>' if low_open else '>='} {low}" + (f" and <= {high}" if high is not None else "")
        try:
            value = kind(raw)
        except ValueError:
            raise JigsawUsageError(f"{PREFIX}{name}: got {raw!r}; allowed: {kind.__name__} {bound}") from None
        if (value <= low if low_open else value < low) or (high is not None and value > high) \
                or not math.isfinite(value):  # inf passes the bounds above, nan every comparison
            raise JigsawUsageError(f"{PREFIX}{name}: got {raw!r}; allowed: {kind.__name__} {bound}")
        return value
    return parse


def _path(name, raw):
    if not raw:
        raise JigsawUsageError(f"{PREFIX}{name}: got an empty path; allowed: a file path")
    return raw


#: ``MigrationSettings``' flags -> parser(name, raw string).
MIGRATION_FLAGS = {
    "tail_fraction": _number(float, 0.0, 1.0, low_open=True),
    "migrate_min_tokens": _number(int, 0),
    "poll_interval_s": _number(float, 0.0, low_open=True),
}

#: flag name -> parser(name, raw string or None for a bare flag). Only ``enable`` may be bare.
FLAGS = {
    "enable": _bool,
    "policy": _choice(POLICIES),
    "pipeline": _name,
    "coordinator": _optional_name,
    "namespace": _name,
    "active_engines": _number(int, 1, optional=True),
    **MIGRATION_FLAGS,
    "events": _path,
    "lease_timeout_s": _number(float, 0.0, low_open=True, optional=True),
    "on_coordinator_loss": _choice(LOSS_MODES),
    "staleness": _number(int, 0),
}
assert set(MIGRATION_FLAGS) == {f.name for f in fields(MigrationSettings)}
assert set(FLAGS) == {f.name for f in fields(JigsawConfig)} - {"migration"} | set(MIGRATION_FLAGS)


def split_jigsaw_flags(argv: list[str]) -> tuple[dict[str, str | None], list[str]]:
    """Separate ``--jigsaw.NAME[=VALUE]`` / ``--jigsaw.NAME VALUE`` from the host's arguments.

    Returns ``({name: raw value or None}, the other arguments in order)``. Unknown names
    and repeated flags are errors that list the allowed flags.
    """
    raw: dict[str, str | None] = {}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith(PREFIX):
            rest.append(arg)
            i += 1
            continue
        name, eq, value = arg[len(PREFIX):].partition("=")
        name = name.replace("-", "_")
        if name not in FLAGS:
            allowed = ", ".join(PREFIX + n for n in FLAGS)
            raise JigsawUsageError(f"unknown flag {arg.partition('=')[0]!r}; allowed: {allowed}")
        if name in raw:
            raise JigsawUsageError(f"{PREFIX}{name} given twice")
        if not eq:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if name == "enable" and (nxt is None or nxt.startswith("--")):
                value = None  # bare boolean flag
            elif nxt is None or nxt.startswith("--"):
                raise JigsawUsageError(f"{PREFIX}{name} needs a value")
            else:
                value = nxt
                i += 1
        raw[name] = value
        i += 1
    return raw, rest


def parse_jigsaw_flags(argv: list[str]) -> tuple[JigsawConfig, list[str]]:
    """``(JigsawConfig, OpenRLHF's arguments)`` from a command line (without the program name)."""
    raw, rest = split_jigsaw_flags(argv)
    values = {name: FLAGS[name](name, value) if not (name == "enable" and value is None) else True
              for name, value in raw.items()}
    migration = MigrationSettings(**{name: values.pop(name) for name in MIGRATION_FLAGS if name in values})
    config = JigsawConfig(**values, migration=migration)
    if not config.enable and len(raw) > ("enable" in raw):
        others = ", ".join(PREFIX + n for n in raw if n != "enable")
        raise JigsawUsageError(f"{others} given without {PREFIX}enable; add {PREFIX}enable to use jigsaw")
    if config.enable:  # checked against OpenRLHF's flags; the queue set when the bound needs it
        _, rest = resolve_staleness(config.staleness, rest)
    return config, rest


ASYNC_FLAG = "--train.async_enable"
QUEUE_FLAG = "--train.async_queue_size"


def _host_flag(argv: list[str], flag: str) -> tuple[bool, str | None]:
    """(given?, its value) of one of OpenRLHF's flags in ``argv`` (``--f V`` or ``--f=V``)."""
    for i, arg in enumerate(argv):
        if arg == flag:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            return True, None if nxt is None or nxt.startswith("--") else nxt
        if arg.startswith(flag + "="):
            return True, arg[len(flag) + 1:]
    return False, None


def resolve_staleness(staleness: int | None, host_argv: list[str]) -> tuple[int, list[str]]:
    """The staleness bound of this OpenRLHF run and OpenRLHF's arguments that honour it.

    OpenRLHF 0.11.2's sync ``PPOTrainer`` is on-policy (0). Its ``PPOTrainerAsync``
    (``--train.async_enable``) bounds the lag by its queue: the generator takes one of
    ``--train.async_queue_size`` slots per batch and the trainer frees it when it takes the
    batch (``ppo_trainer_async.py:110,228``), so a batch is generated at most N versions
    before it is trained. ``staleness`` N sets the queue to N (added when absent); ``None``
    reads the bound off OpenRLHF's flags. A bound the host mode cannot honour is an error.
    """
    is_async, _ = _host_flag(host_argv, ASYNC_FLAG)
    has_queue, raw_queue = _host_flag(host_argv, QUEUE_FLAG)
    queue = None
    if has_queue:
        try:
            queue = int(raw_queue)
        except (TypeError, ValueError):
            raise JigsawUsageError(f"{QUEUE_FLAG}: got {raw_queue!r}; allowed: an integer >= 1") from None
    if not is_async:
        if staleness:
            raise JigsawUsageError(
                f"{PREFIX}staleness: got {staleness}; allowed: 0 without {ASYNC_FLAG} (OpenRLHF's sync PPOTrainer "
                f"trains on-policy); a bound > 0 runs with {ASYNC_FLAG} (PPOTrainerAsync; {PREFIX}staleness N sets "
                f"{QUEUE_FLAG} N)")
        return 0, host_argv
    if staleness is None:
        return (queue if queue is not None else 1), host_argv  # OpenRLHF's default queue is 1
    if staleness == 0:
        raise JigsawUsageError(
            f"{PREFIX}staleness: got 0; allowed: an integer >= 1 with {ASYNC_FLAG} (PPOTrainerAsync generates at "
            f"least one batch ahead of training); 0 runs without {ASYNC_FLAG}")
    if queue is not None and queue != staleness:
        raise JigsawUsageError(
            f"{PREFIX}staleness: got {staleness}; allowed: {queue} (the bound {QUEUE_FLAG} {queue} sets), or drop "
            f"{QUEUE_FLAG} and {PREFIX}staleness sets it")
    return staleness, host_argv if queue is not None else [*host_argv, QUEUE_FLAG, str(staleness)]
