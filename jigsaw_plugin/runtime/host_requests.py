"""A host's rollout requests as the coordinator sees them, and the migrations it sends back.

A host that declared ``migration=true`` (``runtime.capabilities``) names its rollout servers
at registration (``HostPipeline.servers``) and reports each request through the request
hooks its balancer already emits (``jigsaw_request_submitted`` / ``_progress`` /
``_finished`` / ``_aborted`` / ``_migrated``, ``replica`` = the server's id). From those
events ``HostRequestBook`` keeps one row per request of the open step: which server it is
on, tokens it is known to have generated, its budget, when it was submitted. The rows are
what a live system observes: verl's balancer sees no per-token progress, so a request's
tokens so far are those of its earlier (aborted) attempts plus any ``_progress`` report; the
policy predicts the rest (``jigsaw_predict_remaining``), never reading a final length.

The way back: the policy's ``Migrate`` becomes one :class:`HostMigration` per request,
queued for the pipeline; the host takes its commands (``CoordinatorClient.take_migrations``),
aborts the request on ``src_server`` and resumes it with its prefix on ``dst_server``, and
the outcome comes back as ``jigsaw_request_aborted(reason="migrate")`` +
``jigsaw_request_migrated`` (the row moves to the destination), or as a
:class:`MigrationOutcome` with ``status="dropped"`` (the request had already finished, or
was not where the command said). Both dataclasses are frozen and cross the process
boundary as ``to_dict`` / ``from_dict`` (``SpecError`` naming a bad field).

Pure: no Ray, no clock (times are passed in).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Mapping

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.ids import RequestId

__all__ = ["HostMigration", "MigrationOutcome", "OUTCOME_STATUSES", "HostRequest", "HostRequestBook",
           "REQUEST_HOOKS"]

#: The request hooks a migration-capable host's rows are built from.
REQUEST_HOOKS = ("jigsaw_request_submitted", "jigsaw_request_progress", "jigsaw_request_finished",
                 "jigsaw_request_aborted", "jigsaw_request_migrated")

#: ``aborted``: the host sent the abort (the request events follow); ``dropped``: it did not
#: carry the command out (the request had finished, or was not on ``src_server``).
OUTCOME_STATUSES = ("aborted", "dropped")


def _from_dict(cls, raw, where: str):
    if not isinstance(raw, Mapping):
        raise SpecError(where, raw, "a mapping of " + ", ".join(f.name for f in dataclasses.fields(cls)))
    names = {f.name: f for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in names:
            raise SpecError(f"{where}.{key}", raw[key], "one of " + ", ".join(names))
    for name, f in names.items():
        if name not in raw and f.default is dataclasses.MISSING:
            raise SpecError(f"{where}.{name}", "<missing>", f"a value ({f.type})")
    return cls(**dict(raw))


def _text(where: str, value) -> None:
    if not isinstance(value, str) or not value:
        raise SpecError(where, value, "a non-empty string")


def _seq(where: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(where, value, "an integer >= 1")


@dataclass(frozen=True)
class HostMigration:
    """Move ``request_id`` of ``pipeline`` from ``src_server`` to ``dst_server`` (abort it
    there, resume it with its prefix here). ``seq``: the pipeline's command number (from
    1); ``issued_t``: the coordinator's executor clock when the policy chose it."""

    pipeline: str
    request_id: str
    src_server: str
    dst_server: str
    seq: int
    issued_t: float

    def __post_init__(self):
        for name in ("pipeline", "request_id", "src_server", "dst_server"):
            _text(f"migration.{name}", getattr(self, name))
        if self.src_server == self.dst_server:
            raise SpecError("migration.dst_server", self.dst_server, f"a server other than src_server {self.src_server!r}")
        _seq("migration.seq", self.seq)
        if isinstance(self.issued_t, bool) or not isinstance(self.issued_t, (int, float)):
            raise SpecError("migration.issued_t", self.issued_t, "a number (seconds)")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping) -> "HostMigration":
        return _from_dict(cls, raw, "migration")


@dataclass(frozen=True)
class MigrationOutcome:
    """What the host did with command ``seq`` of ``pipeline`` (see ``OUTCOME_STATUSES``)."""

    pipeline: str
    request_id: str
    seq: int
    status: str
    reason: str = ""

    def __post_init__(self):
        _text("migration_outcome.pipeline", self.pipeline)
        _text("migration_outcome.request_id", self.request_id)
        _seq("migration_outcome.seq", self.seq)
        if self.status not in OUTCOME_STATUSES:
            raise SpecError("migration_outcome.status", self.status, " | ".join(OUTCOME_STATUSES))
        if not isinstance(self.reason, str):
            raise SpecError("migration_outcome.reason", self.reason, "a string")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping) -> "MigrationOutcome":
        return _from_dict(cls, raw, "migration_outcome")


@dataclass
class HostRequest:
    """One request of the open step (internal to the book)."""

    request_id: str  # the host's id
    rid: RequestId  # the policy's id: (pipeline, step, sample in order of submission, turn)
    server: str  # where its current (or last) attempt runs
    prompt_tokens: int  # of its first attempt
    max_tokens: int  # its budget, as the first attempt asked
    submitted_t: float
    prefix: int = 0  # tokens of its earlier (aborted) attempts
    progress: int = 0  # tokens of the current attempt, where the host reports them
    state: str = "running"  # running | moving (command issued) | resuming (aborted, not resubmitted)
    moving_to: str | None = None
    command: int | None = None  # seq of its pending command

    @property
    def generated(self) -> int:
        return self.prefix + self.progress

    @property
    def placed_on(self) -> str:
        """The server whose replica shows it: the destination once a move is under way."""
        return self.moving_to or self.server


@dataclass
class HostRequestBook:
    """One pipeline's requests of its open step and its queued commands (module docstring)."""

    pipeline: str
    servers: tuple
    samples_per_prompt: int
    rows: dict = field(default_factory=dict)  # host request id -> HostRequest
    queue: list = field(default_factory=list)  # HostMigration not yet taken by the host
    issued: dict = field(default_factory=dict)  # seq -> HostMigration (taken or not), until resolved
    step: int | None = None
    submitted: int = 0  # requests of ``step`` seen (the sample index of the next one)
    seq: int = 0
    unknown: int = 0  # events about requests the book never saw submitted (counted, not fatal)

    # ---- events -----------------------------------------------------------------------------
    def on_event(self, hook: str, kw: Mapping, t: float):
        """Apply one request event; returns ``(RequestId, total tokens)`` when a request
        finished (the history learns it), else None. Events of an older step are ignored."""
        step = int(kw.get("step", 0))
        if self.step is not None and step < self.step:
            return None
        rid = str(kw.get("request_id"))
        if hook == "jigsaw_request_submitted":
            self._submitted(rid, step, kw, t)
            return None
        row = self.rows.get(rid)
        if row is None:
            self.unknown += 1
            return None
        # ``generated_tokens`` is the turn's total so far, across attempts (hookspecs.py)
        n = int(kw.get("generated_tokens", 0))
        if hook == "jigsaw_request_progress":
            row.progress = max(row.progress, n - row.prefix)
        elif hook == "jigsaw_request_aborted":
            row.prefix = max(row.prefix, n)
            row.progress = 0
            row.state = "resuming"
        elif hook == "jigsaw_request_migrated":
            row.server, row.moving_to, row.command = str(kw.get("dst_replica")), None, None
            row.state = "resuming"
            self.resolved(rid)
        elif hook == "jigsaw_request_finished":
            del self.rows[rid]
            return row.rid, max(row.prefix, n)
        return None

    def _submitted(self, rid: str, step: int, kw: Mapping, t: float) -> None:
        if self.step is None or step > self.step:
            self.open_step(step)
        server = str(kw.get("replica"))
        row = self.rows.get(rid)
        if row is not None:  # a resumed attempt (after an abort or a migration)
            row.server, row.state, row.progress = server, "running", 0
            if row.moving_to == server:
                row.moving_to, row.command = None, None
            return
        rid_ = RequestId(self.pipeline, step, self.submitted, int(kw.get("turn", 0) or 0))
        self.submitted += 1
        self.rows[rid] = HostRequest(rid, rid_, server, int(kw.get("prompt_tokens", 0)),
                                     int(kw.get("max_tokens", 0)), t)

    def open_step(self, step: int) -> list:
        """A new step's requests begin: what was left of the old one is forgotten; returns
        the commands dropped with it (never taken, or never resolved)."""
        dropped = list(self.issued.values())
        self.rows, self.queue, self.issued = {}, [], {}
        self.step, self.submitted = int(step), 0
        return dropped

    # ---- views ------------------------------------------------------------------------------
    def complete(self, samples: int) -> bool:
        """Every request of the step was submitted (until then a server's load is not its rows alone)."""
        return self.submitted >= samples

    def rows_on(self, server: str, t: float) -> list:
        """``core.snapshot.RequestRow`` tuples of the requests shown on ``server``."""
        out = []
        for row in self.rows.values():
            if row.placed_on != server:
                continue
            budget = row.max_tokens if row.max_tokens > 0 else row.generated + 1
            out.append((row.rid, row.rid.sample // self.samples_per_prompt, None, row.prompt_tokens + row.generated,
                        row.generated, budget, max(0.0, t - row.submitted_t), row.state != "running"))
        return out

    def count_on(self, server: str) -> tuple[int, int]:
        """(running, waiting to resume) requests shown on ``server``."""
        run = wait = 0
        for row in self.rows.values():
            if row.placed_on == server:
                if row.state == "running":
                    run += 1
                else:
                    wait += 1
        return run, wait

    def context_on(self, server: str) -> int:
        return sum(r.prompt_tokens + r.generated for r in self.rows.values() if r.placed_on == server)

    # ---- commands ---------------------------------------------------------------------------
    def issue(self, policy_ids, src_server: str, dst_server: str, t: float) -> list:
        """Queue a command for each request on ``src_server`` (``policy_ids``: trajectory ids
        as strings, or empty for all of them) not already moving; returns them."""
        wanted = set(policy_ids) if policy_ids else None
        out = []
        for row in self.rows.values():
            if row.server != src_server or row.state != "running" or row.moving_to is not None:
                continue
            if wanted is not None and str(row.rid.trajectory) not in wanted:
                continue
            self.seq += 1
            cmd = HostMigration(self.pipeline, row.request_id, src_server, dst_server, self.seq, float(t))
            row.state, row.moving_to, row.command = "moving", dst_server, cmd.seq
            self.queue.append(cmd)
            self.issued[cmd.seq] = cmd
            out.append(cmd)
        return out

    def take(self) -> list:
        """The queued commands, oldest first (each is handed out once)."""
        out, self.queue = self.queue, []
        return out

    def drop_finished(self) -> list:
        """Queued commands whose request finished before the host took them: withdrawn."""
        gone = [c for c in self.queue if c.request_id not in self.rows]
        if gone:
            self.queue = [c for c in self.queue if c.request_id in self.rows]
        for c in gone:
            self.issued.pop(c.seq, None)
        return gone

    def outcome(self, out: MigrationOutcome) -> HostMigration | None:
        """The host's report on a command; a dropped one puts its request back where it is."""
        cmd = self.issued.get(out.seq)
        if cmd is None or cmd.request_id != out.request_id:
            return None
        if out.status == "dropped":
            del self.issued[out.seq]
            row = self.rows.get(out.request_id)
            if row is not None and row.command == out.seq:
                row.moving_to, row.command = None, None
                if row.state == "moving":
                    row.state = "running"
        return cmd

    def resolved(self, request_id: str) -> None:
        """The request's migration completed (its migrated event): its command is done."""
        for seq in [s for s, c in self.issued.items() if c.request_id == request_id]:
            del self.issued[seq]
