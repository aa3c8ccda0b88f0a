"""The executor of host pipelines: a policy's decisions carried out by stage grants.

verl and OpenRLHF run their own rollouts and training; what the coordinator can change is
*when* and *on which devices* each of their stages runs, within what the host declared it
can do (``runtime.capabilities``). ``HostExecutor`` is ``core.ExecutorCore`` (the same
bookkeeping, the same ``SchedulerState``, the same ``jigsaw_schedule`` round as the
simulator and the live executor) whose mechanics are grants:

- a host asks before each stage (``want``): ``gen`` of step k (its rollout, reward
  included), or a training stage of step k (``old_log_prob`` ... ``weight_sync``), or, for
  a host with phase grants, ``train`` (all of a step's training stages at once);
- the policy's decisions are what grants them: ``StartGen`` + ``LaunchReplica`` open the
  step's rollout on the replicas' devices, ``RunStage`` a training stage on its gang;
- the host reports each stage's end (``done``); the rollout ends when the host reports it
  or asks for its first training stage;
- a host declaring ``replica_release`` (OpenRLHF) may give back part of its rollout grant
  before the rollout ends (``done`` with those devices: ``release_replicas``): the replicas
  on them close and the policy has their devices at once; the rest of the grant goes back
  at the rollout's end;
- a host declaring ``migration`` names its rollout servers (``HostPipeline.servers``): the
  i-th replica the policy launches for a rollout is bound to the i-th server not bound to
  another live replica of it, its request events (``request_event``) become the rows the
  policy sees (``runtime.host_requests``), and a ``Migrate`` becomes one ``HostMigration``
  command per request, which the host takes (``take_migrations``) and carries out.

A decision outside the pipeline's capabilities is refused (``refusals``, and an event
through ``on_refusal``); a host waiting on a refused ``RunStage`` gets the reason. A
``RunStage`` wider than a fixed-width host gang runs on the gang's width (the first devices
the policy chose) and is reported as adapted. Pure: no Ray, no asyncio; the coordinator
calls it from its actor (``runtime.policy_scheduler``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Callable

from jigsaw_plugin.algorithms import HOST_STAGES
from jigsaw_plugin.core.executor import ExecutorCore, PolicyViolation
from jigsaw_plugin.core.pipelines import build_pipelines
from jigsaw_plugin.core.pricing import Pricer
from jigsaw_plugin.core.snapshot import ReplicaObs, build_state
from jigsaw_plugin.costmodel import hardware_profile
from jigsaw_plugin.costmodel.predictor import default_factors
from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.runtime.capabilities import HostCapabilities, refusal
from jigsaw_plugin.runtime.host_requests import REQUEST_HOOKS, HostMigration, HostRequestBook, MigrationOutcome
from jigsaw_plugin.scheduler.decisions import LaunchReplica, Migrate, ResizeStage, RunStage, StartGen
from jigsaw_plugin.scheduler.state import DeviceTask

__all__ = ["HostPipeline", "HostExecutor", "Ticket", "ROLLOUT_STAGES", "host_workload"]

#: Stages a host runs under its rollout grant (gen and the reward of its samples).
ROLLOUT_STAGES = ("gen", "reward", "rollout")


@dataclass(frozen=True)
class HostPipeline:
    """What a host declares of its pipeline at registration (observable settings only)."""

    name: str
    model_profile: str  # a costmodel profile name (workload.KNOWN_MODELS)
    algorithm: str
    prompts_per_step: int
    samples_per_prompt: int
    max_response_len: int
    prompt_len: int
    steps: int
    devices: int  # its own devices: its static share of the pool
    capabilities: HostCapabilities
    # policy versions a trained sample may lag (the adapters' staleness option); > 0: the
    # policy plans the pipeline as asynchronous under this bound
    staleness: int = 0
    # the host's rollout server ids, as its request events name them (``replica``); required
    # (two or more) with ``capabilities.migration``: replicas are bound to them in order
    servers: tuple = ()
    # where its trainer keeps the training state (workload.TRAIN_OFFLOAD): the policy's
    # estimates of its training stages price it (the host places its own gangs)
    train_offload: str = "none"

    def __post_init__(self):
        from jigsaw_plugin.workload.spec import TRAIN_OFFLOAD

        if self.train_offload not in TRAIN_OFFLOAD:
            raise SpecError(f"pipeline {self.name}: train_offload", self.train_offload, " | ".join(TRAIN_OFFLOAD))
        servers = self.servers
        if isinstance(servers, str) or not isinstance(servers, (tuple, list)) \
                or not all(isinstance(x, str) and x for x in servers) or len(set(servers)) != len(servers):
            raise SpecError(f"pipeline {self.name}: servers", servers, "a tuple of distinct non-empty server ids")
        object.__setattr__(self, "servers", tuple(servers))
        if self.capabilities.migration and len(self.servers) < 2:
            raise SpecError(f"pipeline {self.name}: servers", list(self.servers),
                            "two or more rollout server ids (capabilities.migration=true moves requests between them)")

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["capabilities"] = self.capabilities.to_dict()
        out["servers"] = list(self.servers)
        return out

    @classmethod
    def from_dict(cls, raw: dict) -> "HostPipeline":
        names = [f.name for f in dataclasses.fields(cls)]
        optional = {f.name for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
        for key in names:
            if key not in raw and key not in optional:
                raise SpecError(f"pipeline.{key}", "<missing>", "declared by the host adapter at registration")
        kw = {k: raw[k] for k in names if k in raw}
        kw["capabilities"] = HostCapabilities.from_dict(raw["capabilities"])
        return cls(**kw)

    def workload_entry(self) -> dict:
        """The pipeline as a workload-spec entry; lengths are constants (a host's length
        distributions are not known: the policy reads only the scalar settings)."""
        return {
            "name": self.name, "model": self.model_profile, "algorithm": self.algorithm,
            "mode": "async" if self.staleness > 0 else "sync", "staleness": self.staleness,
            "prompts_per_step": self.prompts_per_step, "samples_per_prompt": self.samples_per_prompt,
            "max_response_len": self.max_response_len,
            "prompt_len": {"dist": "const", "value": self.prompt_len},
            "response_len": {"dist": "const", "value": self.max_response_len},
            "steps": self.steps, "gpus": self.devices,
            "rollout_tp": 1, "train_offload": self.train_offload,
        }


def host_workload(pool_devices: int, pipelines: list[HostPipeline]):
    """The workload spec of a pool's host pipelines (shares are checked against the pool)."""
    from jigsaw_plugin.workload.spec import parse_workload

    return parse_workload({"version": 1, "cluster": {"gpus": int(pool_devices), "gpu": "cpu",
                                                     "gpus_per_node": int(pool_devices)},
                           "pipelines": [p.workload_entry() for p in pipelines]}, where="coordinator pool")


@dataclass
class Ticket:
    """A host's wait for a grant: resolved with devices, or refused with a reason."""

    pipeline: str
    step: int
    stage: str
    granted: tuple | None = None
    refused: str | None = None

    @property
    def resolved(self) -> bool:
        return self.granted is not None or self.refused is not None


class HostReplica:
    """A rollout server of a host as the policy sees it. Without a request book (a host
    without ``migration``): its share of the step's samples not yet generated (the host
    reports the rollout's end, not each request). With one, bound to server ``server``: the
    requests the host reported there (``HostRequestBook.rows_on``); until every request of
    the step was submitted, its part of those still to come counts as queued there."""

    def __init__(self, rid: int, pipeline, devices: tuple, ex: "HostExecutor", server: str | None = None):
        self.id, self.pipeline, self.devices, self.tp = rid, pipeline.name, devices, len(devices)
        self._p, self._ex = pipeline, ex
        self.server = server
        self.retiring = False
        self.start_t = ex.t
        self.predicted_work = 0.0

    def _book(self):
        book = self._ex.books.get(self.pipeline)
        return book if book is not None and self.server is not None else None

    def _share(self) -> int:
        outstanding = sum(s.n - s.n_gen_done for s in self._p.steps.values() if s.gen_end_t is None)
        live = max(1, len(self._p.replicas))
        return math.ceil(outstanding / live) if outstanding else 0

    def _counts(self) -> tuple[int, int]:
        """(running, queued) requests."""
        book = self._book()
        if book is None:
            return self._share(), 0
        run, wait = book.count_on(self.server)
        open_step = next((s for s in self._p.steps.values() if s.gen_end_t is None), None)
        if open_step is not None and not (book.step == open_step.step and book.complete(open_step.n)):
            # requests the host has yet to submit may land on any of its servers: each shows
            # its part of them as queued, so the policy neither moves nor retires on rows still
            # arriving
            pending = open_step.n - (book.submitted if book.step == open_step.step else 0)
            wait += math.ceil(pending / max(1, len(self._p.replicas)))
        return run, wait

    @property
    def load(self) -> int:
        return sum(self._counts())

    @property
    def inflight(self) -> int:
        return self.load

    def observe(self, t: float) -> ReplicaObs:
        run, wait = self._counts()
        book = self._book()
        kv = float(book.context_on(self.server)) if book is not None else 0.0
        cap = float(self._ex.cost.kv_capacity_tokens(self._p.model, self.tp))
        step = self._ex.pricer.decode_step_s(self.pipeline, self.devices, max(1, run), kv)
        return ReplicaObs(run, wait, kv, cap, self._ex.cost.f.max_num_seqs, step, 0.0)

    def request_rows(self, t: float) -> list:
        book = self._book()
        return [] if book is None else book.rows_on(self.server, t)


class HostExecutor(ExecutorCore):
    """See the module docstring. ``on_refusal(record)`` and ``on_adapted(record)`` receive
    plain dicts (pipeline, decision, reason, t) for the coordinator's event log."""

    def __init__(self, pool_devices: int, first: HostPipeline, policy, hooks=None, pm=None,
                 on_refusal: Callable[[dict], None] | None = None, clock=time.monotonic,
                 on_migration: Callable[[dict], None] | None = None):
        self._clock = clock
        self._t0 = clock()
        self.dirty = True
        self.hosts: dict[str, HostPipeline] = {first.name: first}
        # pipeline -> its requests and queued commands (hosts declaring migration only)
        self.books: dict[str, HostRequestBook] = {}
        self._book_for(first)
        # (dict) -> None: the coordinator's log of commands issued and dropped
        self.on_migration = on_migration
        self.migration_log: list[dict] = []  # the same records, for reports
        # no training-memory floor (``CostModel.min_gang``): a host places its own FSDP gangs
        # (and may offload), and the pool's devices are pretend ones of the cpu profile, whose
        # memory says nothing about the host's accelerators
        hw = hardware_profile("cpu")
        factors = dataclasses.replace(default_factors(hw), train_memory_fraction=math.inf)
        super().__init__(host_workload(pool_devices, [first]), policy, factors=factors, hooks=hooks, pm=pm)
        self.pricer = Pricer(self.pm, self.cost, self.models)  # one dict shared with the cost plugin
        self.on_refusal = on_refusal
        self.tickets: list[Ticket] = []
        self.finished: list = []  # pipelines that left the pool (their runs, for reports)
        self.refusals: list[dict] = []
        self.adapted: list[dict] = []
        self._stage_grant: dict[tuple, tuple] = {}  # (pipeline, step, stage) -> devices granted
        self._rollout: dict[str, tuple] = {}  # pipeline -> (step, devices) of its open rollout grant
        self._phase_over: set = set()  # (pipeline, step): a phase host's training phase ended
        # pipeline -> why the policy's decision opening its next rollout was refused (until a
        # server of it is launched or its rollout ends)
        self._refused_rollout: dict[str, str] = {}

    @property
    def t(self) -> float:
        return self._clock() - self._t0

    #: What this executor reports itself; the hosts report their own steps and stages.
    EMITS = ("jigsaw_lease_granted", "jigsaw_lease_released")

    def _emit(self, name: str, **kw) -> None:
        if name in self.EMITS:
            super()._emit(name, **kw)

    def _register_builtins(self) -> None:
        from jigsaw_plugin.builtin import CostModelPlugin

        super()._register_builtins()
        # the cost plugin prices from ``self.models``, which grows as pipelines join
        self.models = {p.name: p.model for p in self.order}
        plugin = self.pm.get_plugin(f"costmodel:{id(self)}")
        self.pm.unregister(plugin)
        from jigsaw_plugin.manager import register

        register(self.pm, CostModelPlugin(self.cost, self.models), f"costmodel:{id(self)}")

    # ---- membership -----------------------------------------------------------------------
    def add(self, host: HostPipeline) -> None:
        """A pipeline joins the pool: shares are recomputed and the policy set up again."""
        if host.name in self.hosts:
            raise SpecError("pipeline", host.name, "a name not yet registered in this pool")
        hosts = [*self.hosts.values(), host]
        workload = host_workload(self.gpus, hosts)
        runs = {r.name: r for r in build_pipelines(workload)}
        for p in self.order:
            p.static_devices = runs[p.name].static_devices
        new = runs[host.name]
        new.index = max((p.index for p in self.order), default=-1) + 1
        self.order.append(new)
        self.pipelines[new.name] = new
        self.models[new.name] = new.model
        self.hosts[host.name] = host
        self._book_for(host)
        self.workload = workload
        self._setup()

    def _setup(self) -> None:
        setup = self.policy.setup(build_state(self))
        self.memo = setup.memo
        self.dirty = True

    def remove(self, name: str) -> None:
        """A pipeline left (or its driver died): its devices go back, its waits end, and the
        pool's shares are those of the pipelines still in it."""
        p = self.pipelines.get(name)
        if p is None:
            return
        for rep in list(p.replicas):
            self._close(rep)
        held = tuple(d for d, task in self.task.items() if task.pipeline == name)
        self._release(held)
        for tk in self.tickets:
            if tk.pipeline == name and not tk.resolved:
                tk.refused = f"pipeline {name!r} left the pool"
        for key in [k for k in self._stage_grant if k[0] == name]:
            del self._stage_grant[key]
        self._rollout.pop(name, None)
        self.books.pop(name, None)
        self.finished.append(p)
        self.order.remove(p)
        del self.pipelines[name], self.hosts[name]
        if self.order:
            self.workload = host_workload(self.gpus, list(self.hosts.values()))
            runs = {r.name: r for r in build_pipelines(self.workload)}
            for q in self.order:
                q.static_devices = runs[q.name].static_devices
            self._setup()

    # ---- what hosts ask ----------------------------------------------------------------------
    def want(self, pipeline: str, step: int, stage: str) -> Ticket:
        """A host's stage is ready to start; the returned ticket resolves in a decide round."""
        p = self._host(pipeline)
        tk = Ticket(pipeline, int(step), stage)
        if stage in ROLLOUT_STAGES:
            held = self._rollout.get(pipeline)
            if held is not None and held[0] == tk.step:
                tk.granted = held[1]  # reward rides on its rollout's grant
                return tk
            opened = p.steps.get(tk.step)
            if opened is not None and opened.gen_end_t is not None:
                raise PolicyViolation(f"{pipeline}: asks for the rollout of step {tk.step}, which already ended")
        else:
            self._end_rollout_before(p, tk.step)
            if stage != "train" and stage not in p.stages:
                raise SpecError("stage", stage, f"{', '.join(ROLLOUT_STAGES + ('train',) + p.stages)} "
                                                f"(the stages of {pipeline}'s {p.spec.algorithm})")
            if stage == "train" and self.hosts[pipeline].capabilities.stage_grants != "phase":
                raise SpecError("stage", stage, f"a training stage of {pipeline} (it declared stage grants)")
            done = p.steps.get(tk.step)
            if stage in p.stages and done is not None and stage in done.stages_done:
                raise PolicyViolation(f"{pipeline}: stage {stage} of step {tk.step} already ran")
        self.tickets.append(tk)
        self.dirty = True
        return tk

    def done(self, pipeline: str, step: int, stage: str, tokens: int | None = None, devices=None) -> None:
        """A host's stage ended (``tokens``: what it generated or trained on, if it knows).
        ``devices`` of a rollout that are only part of what it still holds: those servers
        were released early (``release_replicas``), the rollout goes on."""
        p = self._host(pipeline)
        step = int(step)
        if stage in ROLLOUT_STAGES:
            held = self._rollout.get(pipeline)
            if devices is not None and held is not None and held[0] == step \
                    and set(devices) < set(held[1]):
                self.release_replicas(pipeline, step, devices)
                return
            self._rollout_done(p, step, tokens)
        elif stage == "train":
            self._phase_done(p, step)
        else:
            devices = self._stage_grant.pop((pipeline, step, stage), None)
            if devices is None:
                raise PolicyViolation(f"{pipeline}: stage {stage} of step {step} ended but was never granted")
            self._stage_done(p, step, stage, devices)
        self.dirty = True

    def release_replicas(self, pipeline: str, step: int, devices) -> tuple:
        """Part of a rollout grant given back before the rollout's end, server by server (a
        host with ``replica_release``): the replicas on ``devices`` close, their devices are
        free for the policy, and the rollout goes on on the rest of its grant."""
        p = self._host(pipeline)
        devices = tuple(sorted(int(d) for d in devices))
        if not self.hosts[pipeline].capabilities.replica_release:
            raise SpecError(f"{pipeline}: released rollout devices", list(devices),
                            "the whole rollout grant at its end (the host declared replica_release=false)")
        held = self._rollout.get(pipeline)
        if held is None or held[0] != int(step):
            raise SpecError(f"{pipeline}: release of rollout step", int(step),
                            f"the step whose rollout it holds ({'none' if held is None else held[0]})")
        if not set(devices) <= set(held[1]):
            raise SpecError(f"{pipeline}: released rollout devices", list(devices),
                            f"devices of its rollout grant still held: {list(held[1])}")
        closing = [r for r in p.replicas if set(r.devices) & set(devices)]
        split = [r for r in closing if not set(r.devices) <= set(devices)]
        if split:
            raise SpecError(f"{pipeline}: released rollout devices", list(devices),
                            f"every device of a server together (replica r{split[0].id} runs on "
                            f"{list(split[0].devices)})")
        for rep in closing:
            self._close(rep)
        self._rollout[pipeline] = (held[0], tuple(d for d in held[1] if d not in devices))
        self.dirty = True
        return devices

    # ---- a migration-capable host's requests ----------------------------------------------------
    def _book_for(self, host: HostPipeline) -> None:
        if host.capabilities.migration:
            self.books[host.name] = HostRequestBook(host.name, host.servers, host.samples_per_prompt)

    def request_event(self, hook: str, kw: dict) -> bool:
        """One of a host's request events (``REQUEST_HOOKS``), as it reached the coordinator;
        ignored unless its pipeline declared migration. Returns whether it changed the rows."""
        book = self.books.get(str(kw.get("pipeline")))
        if book is None or hook not in REQUEST_HOOKS:
            return False
        p = self.pipelines[book.pipeline]
        done = book.on_event(hook, kw, self.t)
        if done is not None:
            rid, length = done
            rep = next((r for r in p.replicas if r.server == str(kw.get("replica"))), None)
            self._turn_finished(p, rid, length, rep.id if rep is not None else None)
            for cmd in book.drop_finished():
                self._migration_record("jigsaw_migration_dropped", cmd, "the request finished before the host took it")
        if hook == "jigsaw_request_migrated":
            self._migration_record("jigsaw_migration_done", None, "", pipeline=book.pipeline,
                                   request_id=str(kw.get("request_id")), src_server=str(kw.get("src_replica")),
                                   dst_server=str(kw.get("dst_replica")),
                                   generated_tokens=int(kw.get("generated_tokens", 0)))
        self._close_emptied(p)
        self.dirty = True
        return True

    def rollout_servers(self, pipeline: str) -> dict:
        """{device: server id} of the pipeline's replicas bound to servers (a host with
        ``migration``): which of its servers the policy put on which granted device. The
        binding follows the policy's launch order, which need not be the grant's device order,
        so a host that places servers on devices (OpenRLHF) reads it here."""
        p = self.pipelines.get(pipeline)
        if p is None:
            return {}
        return {d: r.server for r in p.replicas if getattr(r, "server", None) for d in r.devices}

    def take_migrations(self, pipeline: str) -> list[HostMigration]:
        """The pipeline's queued migration commands, oldest first, each handed out once."""
        book = self.books.get(pipeline)
        return [] if book is None else book.take()

    def migration_outcome(self, out: MigrationOutcome) -> None:
        """The host's report on a command (``dropped``: the request stays where it is)."""
        book = self.books.get(out.pipeline)
        cmd = book.outcome(out) if book is not None else None
        if cmd is None:
            return  # a command of a step that ended, or of a pipeline that left
        if out.status == "dropped":
            self._migration_record("jigsaw_migration_dropped", cmd, out.reason or "the host did not carry it out")
        self.dirty = True

    def _migration_record(self, hook: str, cmd: HostMigration | None, reason: str, **extra) -> None:
        record = {"hook": hook, **(cmd.to_dict() if cmd is not None else {}), **extra, "t": self.t}
        if reason:
            record["reason"] = reason
        self.migration_log.append(record)
        if self.on_migration is not None:
            self.on_migration(record)

    def _close_emptied(self, p) -> None:
        """A retiring replica whose requests all left or finished closes: its devices go back."""
        for rep in [r for r in p.replicas if r.retiring]:
            if rep.load == 0:
                self._close(rep)

    def _host(self, pipeline: str):
        p = self.pipelines.get(pipeline)
        if p is None:
            raise SpecError("pipeline", pipeline, f"one of {sorted(self.pipelines)} (registered in this pool)")
        return p

    # ---- the round ---------------------------------------------------------------------------
    def round(self, max_rounds: int = 8) -> list[Ticket]:
        """Decide and apply, then resolve what the hosts wait on; returns the tickets resolved."""
        if self.dirty:
            self.decide_and_apply(max_rounds)
        resolved = []
        for tk in list(self.tickets):
            self._resolve(tk)
            reason = self._refused_rollout.get(tk.pipeline)
            if (not tk.resolved and reason is not None and tk.stage in ROLLOUT_STAGES
                    and not self.pipelines[tk.pipeline].replicas):
                # the policy's way to open this rollout is outside the host's capabilities and
                # nothing else opened it: the host hears why now rather than waiting forever
                tk.refused = f"{tk.pipeline}: the policy's rollout decision is outside the host's capabilities: {reason}"
            if tk.resolved:
                self.tickets.remove(tk)
                resolved.append(tk)
        return resolved

    def _resolve(self, tk: Ticket) -> None:
        if tk.resolved:
            return
        p = self.pipelines[tk.pipeline]
        if tk.stage in ROLLOUT_STAGES:
            live = [r for r in p.replicas if not r.retiring] or list(p.replicas)
            if p.gen_next > tk.step and tk.step in p.steps and live:
                tk.granted = tuple(sorted({d for r in live for d in r.devices}))
                self._rollout[tk.pipeline] = (tk.step, tk.granted)
                for rep in [r for r in p.replicas if r not in live]:
                    # retired before the host got its grant: the host never runs on it, so
                    # its devices go back now rather than idle until the rollout's end
                    self._close(rep)
        elif tk.stage == "train":
            first = next(((st, dev) for (n, k, st), dev in self._stage_grant.items()
                          if n == tk.pipeline and k == tk.step), None)
            if first is not None:
                tk.granted = first[1]
        else:
            devices = self._stage_grant.get((tk.pipeline, tk.step, tk.stage))
            if devices is not None:
                tk.granted = devices

    def apply(self, d) -> None:
        name = self._pipeline_of(d)
        host = self.hosts.get(name)
        if host is not None:
            live = len([r for r in self.pipelines[name].replicas if not r.retiring])
            reason = refusal(host.capabilities, d, live, rollout_granted=name in self._rollout)
            caps = host.capabilities
            if (reason and isinstance(d, RunStage) and not caps.training_resizable
                    and len(d.devices) > caps.training_width):
                # a wider gang than the host's fixed one: run it on the gang's width
                narrowed = dataclasses.replace(d, devices=tuple(d.devices[:caps.training_width]))
                self.adapted.append({"pipeline": name, "decision": repr(d), "carried_out": repr(narrowed),
                                     "t": self.t})
                d, reason = narrowed, None
            if reason:
                self._refuse(name, d, reason)
                return
        super().apply(d)

    def _pipeline_of(self, d) -> str | None:
        if isinstance(d, (StartGen, LaunchReplica, RunStage, ResizeStage)):
            return d.pipeline
        if isinstance(d, Migrate):
            rep = self.replicas.get(d.src)
            return rep.pipeline if rep is not None else None
        rep = self.replicas.get(getattr(d, "replica", None))
        return rep.pipeline if rep is not None else None

    def _refuse(self, pipeline: str, d, reason: str) -> None:
        record = {"pipeline": pipeline, "decision": repr(d), "reason": reason, "t": self.t}
        last = self.refusals[-1] if self.refusals else None
        if last is None or (last["decision"], last["reason"]) != (record["decision"], reason):
            self.refusals.append(record)  # a decision repeated round after round is logged once
            if self.on_refusal is not None:
                self.on_refusal(record)
        if isinstance(d, (StartGen, LaunchReplica)) and not self.pipelines[pipeline].replicas:
            self._refused_rollout[pipeline] = reason  # no server of its own left to open the rollout on
        if isinstance(d, RunStage):
            for tk in self.tickets:
                if (tk.pipeline, tk.step) == (pipeline, d.step) and tk.stage in (d.stage, "train"):
                    tk.refused = f"{pipeline}: the policy's {d!r} is outside the host's capabilities: {reason}"

    # ---- mechanics ----------------------------------------------------------------------------
    def _start_gen(self, d: StartGen) -> None:
        self._open_step(d)

    def _launch(self, d: LaunchReplica) -> None:
        p = self.pipelines[d.pipeline]
        devices = tuple(d.devices)
        rid = self._new_replica_id()
        self._claim(devices, DeviceTask("replica", p.name, replica=rid))
        self._switch_s(p, devices, "rollout")
        bound = {r.server for r in p.replicas}
        server = next((x for x in self.hosts[p.name].servers if x not in bound), None)
        rep = HostReplica(rid, p, devices, self, server)
        self._refused_rollout.pop(p.name, None)
        self.replicas[rid] = rep
        p.replicas.append(rep)
        self._emit("jigsaw_lease_granted", pipeline=p.name, devices=devices, purpose="rollout", t=self.t)
        if d.spread and server is not None:
            self._spread_into(p, rid)
        for src in d.absorb:  # a re-shard: the absorbed replicas' requests move here, then they retire
            old = self.replicas.get(src)
            if old is not None and old.pipeline == p.name:
                old.retiring = True
                self._migrate(Migrate(src, rid))

    def _retire(self, rep) -> None:
        rep.retiring = True
        if rep.load == 0:
            self._close(rep)

    def _close(self, rep) -> None:
        if rep.id not in self.replicas:
            return
        p = self.pipelines[rep.pipeline]
        p.replicas.remove(rep)
        del self.replicas[rep.id]
        self.trace.append((f"{rep.pipeline} rollout r{rep.id}", "rollout", rep.devices, rep.start_t, self.t))
        self.busy_s += (self.t - rep.start_t) * rep.tp
        self._release(rep.devices)
        self._emit("jigsaw_lease_released", pipeline=rep.pipeline, devices=rep.devices, t=self.t)

    def _migrate(self, d: Migrate) -> None:
        """One ``HostMigration`` per request moving (the host carries them out); a retiring
        source whose requests all move closes at once, as in the live executor, so the
        policy's plan holds: its devices are free while the aborts are under way."""
        src, dst = self.replicas.get(d.src), self.replicas.get(d.dst)
        if src is None or dst is None:
            raise PolicyViolation(f"migrate between unknown replicas {d.src} -> {d.dst}")
        if src.pipeline != dst.pipeline:
            raise PolicyViolation(f"migrate between pipelines {src.pipeline} and {dst.pipeline}")
        book = self.books.get(src.pipeline)
        if book is None or src.server is None or dst.server is None:
            raise PolicyViolation(f"no host route for {d!r}: replica r{src.id if src.server is None else dst.id} "
                                  f"of {src.pipeline} is bound to no server of the host")
        for cmd in book.issue(d.requests, src.server, dst.server, self.t):
            self.migrations += 1
            self._migration_record("jigsaw_migration_issued", cmd, "", decision=repr(d), src_replica=src.id,
                                   dst_replica=dst.id)
        if src.retiring and src.load == 0:
            self._close(src)

    def _run_stage(self, d: RunStage) -> None:
        p, s, devices = self._check_stage(d)
        s.stage_t[d.stage] = (self.t, self.t + self.price_stage(p, s, d.stage, devices, d.colocated))
        host = self.hosts[p.name]
        phase_host = host.capabilities.stage_grants == "phase"
        if d.stage in HOST_STAGES or (phase_host and (p.name, d.step) in self._phase_over):
            # the host runs it on its driver (advantages), or already ran it in its phase
            self._stage_done(p, d.step, d.stage, devices)
            return
        if devices:
            self.trace.append((f"{p.name} {d.stage} s{d.step}", d.stage, devices, self.t, self.t))
        self._stage_grant[(p.name, d.step, d.stage)] = devices

    def _stage_done(self, p, step: int, stage: str, devices: tuple) -> None:
        for i in range(len(self.trace) - 1, -1, -1):  # close the stage's trace span
            name, cat, devs, start, _ = self.trace[i]
            if name == f"{p.name} {stage} s{step}" and devs == devices:
                self.trace[i] = (name, cat, devs, start, self.t)
                self.busy_s += (self.t - start) * len(devs)
                break
        super()._stage_done(p, step, stage, devices)

    def _end_rollout_before(self, p, step: int) -> None:
        held = self._rollout.get(p.name)
        if held is not None and held[0] <= step:
            self._rollout_done(p, held[0], None)

    def _rollout_done(self, p, step: int, tokens: int | None) -> None:
        s = p.steps.get(step)
        if s is None:
            raise PolicyViolation(f"{p.name}: rollout of step {step} ended but was never started")
        if tokens is not None and s.gen_end_t is None:
            s.generated = int(tokens)
        while s.n_gen_done < s.n:
            self._trajectory_finished(p, s, s.n_gen_done)
        while s.n_rewarded < s.n:
            self._rewarded(p, s)
        for rep in list(p.replicas):  # the host sleeps its servers: their devices go back
            self._close(rep)
        book = self.books.get(p.name)
        if book is not None:  # commands never carried out end with the rollout
            for cmd in book.open_step(step + 1):
                self._migration_record("jigsaw_migration_dropped", cmd, "the rollout ended first")
        self._rollout.pop(p.name, None)
        self._refused_rollout.pop(p.name, None)

    def _phase_done(self, p, step: int) -> None:
        """A phase host's training ended: the stage it was granted for ends, and the policy's
        later stages of that step are bookkept as done when it asks for them."""
        self._phase_over.add((p.name, step))
        for (name, k, stage), devices in list(self._stage_grant.items()):
            if name == p.name and k == step:
                del self._stage_grant[(name, k, stage)]
                self._stage_done(p, k, stage, devices)
