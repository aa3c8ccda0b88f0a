"""A load balancer for verl's balancer slot that routes with the jigsaw router.

verl 0.9.1 builds its one global balancer actor in ``get_router_handle``
(``workers/rollout/router.py:360-420``). A YAML file named by
``actor_rollout_ref.rollout.router_config_path`` selects a class by FQN::

    # jigsaw_router.yaml
    router_class: jigsaw_plugin.adapters.verl.router.JigsawLoadBalancer
    pipeline: grpo-a          # optional: the pipeline its request events belong to
    coordinator: jigsaw       # optional: forward the request events to this coordinator
    namespace: jigsaw         # optional: its Ray namespace
    commands_path: /tmp/a.jsonl  # optional: append each migration command taken and its outcome

verl calls ``ray.remote(cls).remote(servers, yaml_config)``; ``LLMServerManager(...,
load_balancer_cls=JigsawLoadBalancer)`` (``llm_server.py:373-387``) works too. The class
implements verl's ``RequestLoadBalancer`` protocol (``router.py:19-130``) and keeps its
replica set, in-flight counts and sticky sessions in a jigsaw ``Router``
(``runtime/router.py``, through its public methods): the routing decision is the jigsaw
router's ``choose_replica`` (sticky, else least in flight, ties to the lowest replica index).

On top of verl's protocol it offers what jigsaw needs:

- ``migrate(request_id, dst_server)``: abort the request's current vLLM request on its
  server (``vLLMHttpServer.abort_request``, stable id from ``JigsawLLMServerClient``); the
  client's resume loop (``FullyAsyncLLMServerClient.generate``, ``llm_server.py:225-351``)
  re-acquires with prompt + generated tokens and this balancer sends it to ``dst_server``;
- ``drain(server_id)``: stop routing to a server and migrate its requests away (resize down);
  ``add_servers`` / ``remove_servers`` as verl's own;
- request events (``jigsaw_request_submitted`` / ``_finished`` / ``_aborted`` /
  ``_migrated``) recorded in an ``EventRecorder`` (``events()``), the sub-stage graph's input;
- with a ``coordinator``: the events go to its log too (the rows its policy sees of this
  job's requests), and a daemon thread long-polls the coordinator for the migrations its
  policy chose (``CoordinatorClient.take_migrations``) and carries each out with
  ``migrate`` (``carry_out``); one it cannot carry out (the request finished, or is not on
  the command's source server) is reported ``dropped``, never raised. Polling from inside
  the balancer needs no handle of this actor in the coordinator and no second actor, and
  the balancer is where the request's server and stable vLLM id are known. The thread and
  verl's calls share one lock (verl's balancer actor runs its calls on one thread; the
  poller is a second one). ``binding()`` tells the trainer the servers, coordinator and
  pipeline, from which it declares ``migration`` (docs/verl.md).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from jigsaw_plugin.events import EventRecorder
from jigsaw_plugin.manager import call, get_plugin_manager, register
from jigsaw_plugin.runtime.router import RequestRecord, Router, RouterError

__all__ = ["JigsawLoadBalancer", "ACQUIRE_FIELDS"]

#: Extra fields ``JigsawLLMServerClient`` sends with each acquire.
ACQUIRE_FIELDS = ["jigsaw_vllm_id", "jigsaw_prompt_tokens", "jigsaw_max_tokens"]


class JigsawLoadBalancer:
    """verl's balancer protocol over a jigsaw ``Router`` (one Ray actor per trainer).

    :param servers: ``{server_id: actor_handle}`` (verl passes addresses as ids).
    :param config: The router YAML as a dict (``router_class``, optional ``pipeline``).
    """

    def __init__(self, servers: dict[str, Any], config: dict | None = None, **_ignored):
        config = dict(config or {})
        self.pipeline = str(config.get("pipeline", "verl"))
        self.router = Router()
        self._index: dict[str, int] = {}  # server_id -> replica index in the router
        self._ids: dict[int, str] = {}
        self._next = 0
        self.running: dict[str, dict] = {}  # request_id -> the attempt in flight
        self._moves: dict[str, str] = {}  # request_id -> server it must resume on
        self._turns: dict[str, int] = {}
        self._prefix: dict[str, int] = {}  # request_id -> tokens of its aborted attempts this turn
        self.step = 0
        self._t0 = time.perf_counter()
        self._lock = threading.RLock()  # verl's calls and the migration poller
        self.commands: list[dict] = []  # the coordinator's migration commands and what became of each
        self.pm = get_plugin_manager(load_entrypoints=False)
        self.recorder = EventRecorder(include_progress=False)
        register(self.pm, self.recorder)
        self.commands_path = str(config["commands_path"]) if config.get("commands_path") else None
        self.coordinator = str(config["coordinator"]) if config.get("coordinator") else None
        self.client = None
        if self.coordinator:  # runs inside verl's Ray cluster: Ray is up
            from jigsaw_plugin.runtime.coordinator import CoordinatorForwarder, connect_coordinator

            self.client = connect_coordinator(name=self.coordinator, namespace=str(config.get("namespace", "jigsaw")))
            register(self.pm, CoordinatorForwarder(self.client))
        self.add_servers(servers)
        self._stop = threading.Event()
        if self.client is not None:
            threading.Thread(target=self._poll_migrations, name="jigsaw-migrations", daemon=True).start()

    # ---- verl's protocol ------------------------------------------------------------------
    def require_acquire_fields(self) -> list[str]:
        return list(ACQUIRE_FIELDS)

    def require_release_fields(self) -> list[str]:
        return ["request_id"]

    def acquire_server(self, request_id: str, jigsaw_vllm_id: str | None = None,
                       jigsaw_prompt_tokens: int = 0, jigsaw_max_tokens: int = 0, **_extra):
        with self._lock:
            return self._acquire(request_id, jigsaw_vllm_id, jigsaw_prompt_tokens, jigsaw_max_tokens)

    def _acquire(self, request_id, jigsaw_vllm_id, jigsaw_prompt_tokens, jigsaw_max_tokens):
        if not self.router.live_replicas():
            raise RuntimeError("No available servers in load balancer")  # verl's text: its clients retry on it
        move = self._moves.pop(request_id, None)
        rec = RequestRecord(request_id, [], 0, sticky=request_id)
        if move is not None and move in self._index and self._index[move] in self.router.live_replicas():
            replica = self._index[move]
        else:
            replica = self.router.choose_replica(rec)  # the jigsaw router's decision
        self.router.acquire(replica, sticky=request_id)
        server_id = self._ids[replica]
        prev = self.running.get(request_id)
        turn = self._turns.get(request_id, 0) if prev is None or not prev.get("aborted") else prev["turn"]
        self.running[request_id] = {"server": server_id, "vllm_id": jigsaw_vllm_id, "turn": turn,
                                    "prompt_tokens": int(jigsaw_prompt_tokens), "aborted": False}
        self._emit("jigsaw_request_submitted", request_id=request_id, turn=turn, replica=server_id,
                   prompt_tokens=int(jigsaw_prompt_tokens), max_tokens=int(jigsaw_max_tokens))
        return server_id, self.router.engine(replica)

    def release_server(self, server_id: str, request_id: str | None = None) -> None:
        with self._lock:
            replica = self._index.get(server_id)
            if replica is not None:  # a server removed meanwhile has nothing to release
                self.router.release_slot(replica)

    def add_servers(self, servers: dict[str, Any]) -> None:
        for sid, handle in servers.items():
            if sid in self._index:
                continue
            idx, self._next = self._next, self._next + 1
            self._index[sid], self._ids[idx] = idx, sid
            self.router.add_replica(idx, handle)

    def remove_servers(self, server_ids: list[str]) -> None:
        for sid in server_ids:
            idx = self._index.pop(sid, None)
            if idx is None:
                continue
            self._ids.pop(idx, None)
            self.router.detach_replica(idx, force=True)  # as verl's own: requests there finish unaccounted

    def get_inflight_count(self, server_id: str) -> int:
        idx = self._index.get(server_id)
        return self.router.load(idx) if idx is not None else 0

    def get_all_servers(self) -> list[str]:
        return [self._ids[i] for i in self.router.live_replicas()]

    def clear_sticky_cache(self) -> dict:
        return {"cleared_entries": self.router.clear_sticky(), "server_loads": self._loads()}

    def get_status(self) -> dict:
        loads = self._loads()
        live = set(self.router.live_replicas())
        return {"servers": loads, "total_inflight": sum(loads.values()), "active_servers": len(loads),
                "registered_handles": list(self._index),
                "retiring": [self._ids[i] for i in self.router.replicas() if i not in live]}

    def get_total_inflight(self) -> int:
        return sum(self.router.load(i) for i in self.router.replicas())

    # ---- jigsaw control -------------------------------------------------------------------
    def migrate(self, request_id: str, dst_server: str):
        """Abort ``request_id`` where it runs; its resumed attempt goes to ``dst_server``.

        Returns the abort call's Ray ref (``None`` if the request is not in flight or
        already there). Needs ids from ``JigsawLLMServerClient`` (stable per attempt).
        """
        with self._lock:
            return self._migrate(request_id, dst_server)

    def _migrate(self, request_id: str, dst_server: str):
        run = self.running.get(request_id)
        if dst_server not in self._index:
            raise RouterError(f"migrate({request_id!r}): unknown server {dst_server!r}; known: {list(self._index)}")
        if run is None or run["aborted"] or run["server"] == dst_server:
            return None
        if not run.get("vllm_id"):
            raise RouterError(f"migrate({request_id!r}): no stable vLLM id; route with JigsawLLMServerClient")
        run["aborted"], run["moving_to"] = True, dst_server
        self._moves[request_id] = dst_server
        handle = self.router.engine(self._index[run["server"]])
        return handle.abort_request.remote(run["vllm_id"])

    def drain(self, server_id: str) -> list[str]:
        """Stop routing new requests to ``server_id`` and migrate its requests away."""
        with self._lock:
            return self._drain(server_id)

    def _drain(self, server_id: str) -> list[str]:
        idx = self._index[server_id]
        self.router.mark_retiring(idx)
        moved = []
        for rid, run in list(self.running.items()):
            if run["server"] == server_id and not run["aborted"]:
                rec = RequestRecord(rid, [], 0, sticky=None)
                dst = self._ids[self.router.choose_replica(rec, exclude={idx})]
                self._migrate(rid, dst)
                moved.append(rid)
        return moved

    def undrain(self, server_id: str) -> None:
        self.router.unmark_retiring(self._index[server_id])

    def attempt_done(self, request_id: str, server_id: str, generated_tokens: int, stop_reason: str | None) -> None:
        """Told by the client when one attempt (one vLLM request) has returned."""
        with self._lock:
            self._attempt_done(request_id, server_id, generated_tokens, stop_reason)

    def _attempt_done(self, request_id: str, server_id: str, generated_tokens: int, stop_reason: str | None) -> None:
        # verl's client resumes an aborted attempt with prompt + what it generated and reports
        # each attempt's own tokens; the request hooks carry the turn's total so far
        # (hookspecs.py), so the tokens of earlier attempts are added here
        run = self.running.get(request_id)
        turn = run["turn"] if run else self._turns.get(request_id, 0)
        total = self._prefix.get(request_id, 0) + int(generated_tokens)
        if stop_reason in ("aborted", "abort"):
            self._prefix[request_id] = total
        if stop_reason in ("aborted", "abort") and run is not None and run.get("aborted"):
            dst = run.get("moving_to")
            self._emit("jigsaw_request_aborted", request_id=request_id, turn=turn, replica=server_id,
                       generated_tokens=total, reason="migrate")
            self._emit("jigsaw_request_migrated", request_id=request_id, turn=turn, src_replica=server_id,
                       dst_replica=dst, generated_tokens=total)
            return
        if stop_reason in ("aborted", "abort"):
            self._emit("jigsaw_request_aborted", request_id=request_id, turn=turn, replica=server_id,
                       generated_tokens=total, reason="preempt")
            if run is not None:
                run["aborted"] = True
            return
        self._emit("jigsaw_request_finished", request_id=request_id, turn=turn, replica=server_id,
                   generated_tokens=total)
        self.running.pop(request_id, None)
        self._prefix.pop(request_id, None)
        self._turns[request_id] = turn + 1

    def set_step(self, step: int, t0_wall: float | None = None) -> None:
        """The trainer's current step (request events carry it), and optionally its clock origin
        (``time.time()`` at its start) so that request ``t`` and stage ``t`` share one clock."""
        self.step = int(step)
        if t0_wall is not None:
            self._t0 = time.perf_counter() - (time.time() - float(t0_wall))

    def events(self) -> list[dict]:
        return list(self.recorder.events)

    # ---- the coordinator's migrations -------------------------------------------------------
    def binding(self) -> dict:
        """What the trainer declares from: this balancer's servers (in order), the
        coordinator it takes migrations from (``None``: none) and its pipeline."""
        with self._lock:
            return {"servers": [self._ids[i] for i in sorted(self._ids)], "coordinator": self.coordinator,
                    "pipeline": self.pipeline}

    def carry_out(self, command) -> str:
        """Carry out one ``HostMigration``: abort its request on ``src_server`` (its resumed
        attempt goes to ``dst_server``). Returns ``"aborted"``, or ``"dropped: <why>"`` when
        the request is no longer where the command says (it finished, or moved); a drop is
        reported to the coordinator, never raised. The record (``migration_commands``, and
        ``commands_path``) keeps the vLLM server's own answer to the abort."""
        ref = None
        with self._lock:
            run = self.running.get(command.request_id)
            why = None
            if run is None:
                why = "the request is not in flight here (it finished)"
            elif run["aborted"]:
                why = "the request is already being moved or resumed"
            elif run["server"] != command.src_server:
                why = f"the request runs on {run['server']}, not {command.src_server}"
            elif command.dst_server not in self._index:
                why = f"unknown destination server {command.dst_server}"
            elif not run.get("vllm_id"):
                why = "no stable vLLM id (route with JigsawLLMServerClient)"
            else:
                vllm_id = run["vllm_id"]
                ref = self._migrate(command.request_id, command.dst_server)
            status = "aborted" if why is None else "dropped"
            record = {**command.to_dict(), "status": status, "reason": why or "", "step": self.step,
                      "t": time.perf_counter() - self._t0}
            if why is None:
                record["vllm_id"] = vllm_id
            self.commands.append(record)
        record["server_answer"] = answer = _answer(ref)  # outside the lock: the abort wakes verl's client
        if why is None and isinstance(answer, dict) and not answer.get("aborted", False):
            # the server did not abort it (it had just finished, or the abort failed): it
            # goes on where it is, and the command is dropped with the server's reason
            why = f"the server did not abort it: {answer.get('error', answer)}"
            with self._lock:
                self._moves.pop(command.request_id, None)
                run = self.running.get(command.request_id)
                if run is not None and run.get("moving_to") == command.dst_server:
                    run["aborted"] = False
                    run.pop("moving_to", None)
            record.update(status="dropped", reason=why)
        if self.commands_path:
            import json

            with open(self.commands_path, "a") as f:
                f.write(json.dumps(record, default=repr) + "\n")
        if why is not None and self.client is not None:
            from jigsaw_plugin.runtime.host_requests import MigrationOutcome

            self.client.migration_outcome(MigrationOutcome(command.pipeline, command.request_id, command.seq,
                                                           "dropped", why))
        return status if why is None else f"dropped: {why}"

    def _poll_migrations(self) -> None:
        """The daemon thread: take the coordinator's commands for this pipeline and carry
        them out, until the coordinator is gone. Before this pipeline registers (the
        balancer is built before verl's trainer starts) the coordinator does not know it."""
        from jigsaw_plugin.runtime.coordinator_client import CoordinatorDied
        from jigsaw_plugin.runtime.lease_schedulers import LeaseError

        while not self._stop.is_set():
            try:
                commands = self.client.take_migrations(self.pipeline, wait_s=1.0)
            except LeaseError:
                self._stop.wait(0.5)  # not registered yet, or already left
                continue
            except CoordinatorDied:
                return
            except Exception as e:  # the balancer must go on routing whatever happens here
                print(f"jigsaw balancer {self.pipeline}: taking migrations failed: {e!r}", file=sys.stderr)
                self._stop.wait(1.0)
                continue
            for command in commands:
                try:
                    self.carry_out(command)
                except Exception as e:
                    print(f"jigsaw balancer {self.pipeline}: migration {command} failed: {e!r}", file=sys.stderr)

    def migration_commands(self) -> list[dict]:
        """Every command this balancer took, with ``status`` and ``reason`` (its own record)."""
        with self._lock:
            return list(self.commands)

    # ---- internals ------------------------------------------------------------------------

    def _loads(self) -> dict[str, int]:
        return {self._ids[i]: self.router.load(i) for i in self.router.live_replicas()}

    def _emit(self, hook: str, **kwargs) -> None:
        call(self.pm, hook, pipeline=self.pipeline, step=self.step, t=time.perf_counter() - self._t0, **kwargs)


def _answer(ref):
    """The vLLM server's answer to an abort (``vLLMHttpServer.abort_request``: ``{"aborted":
    ...}``), or what the handle returned where it is not a Ray ref (tests' stand-ins)."""
    if ref is None:
        return None
    try:
        import ray
    except ImportError:  # no Ray: a stand-in's plain value
        return ref
    if isinstance(ref, ray.ObjectRef):
        try:
            return ray.get(ref, timeout=60)
        except Exception as e:  # the server's failure is recorded, not raised into the balancer
            return {"error": repr(e)}
    return ref
