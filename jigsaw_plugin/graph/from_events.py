"""Build the sub-stage graph of a run from its recorded hook events.

The simulator, the Ray runtime and the host adapters emit the same hooks, so the same graph
comes from any of them, and it has the shape :func:`build_from_spec` gives for the same
workload (the builders share the training side, ``_steps.add_training``). Events are
``{"hook": name, **kwargs}`` dicts (``EventRecorder``), in the order they were recorded.

Mapping:

- ``jigsaw_request_submitted`` .. ``jigsaw_request_finished`` of one (request id, turn):
  a ``gen_turn``. A turn cut by ``jigsaw_request_migrated`` becomes two segments with a
  ``migration`` node between them (on the destination; ``sizes.tokens`` = prompt +
  generated tokens re-prefilled there); one cut by ``jigsaw_request_aborted`` (preempt,
  fault, weight update) becomes two segments joined directly when it is resubmitted.
- ``jigsaw_tool_call_start`` .. ``_end``: a ``tool_call`` after its turn.
- every trajectory whose last turn finished: a ``reward``; one ``rollout_request`` groups
  a trajectory (its times span its turns). A step that has no training-side stage event
  (the run stopped before it trained) gets no training nodes.
- ``jigsaw_stage_start``/``_end`` of ``old_log_prob``, ``ref``, ``values``: one shard node
  per device of ``devices`` (as the plan has one per device of the pipeline's share), all
  with the stage's times; ``adv``, ``update_critic``, ``update_actor``: one node each;
  ``weight_sync``: from its stage events or ``jigsaw_weight_sync_start``/``_end`` (version,
  bytes). ``gen`` and ``reward`` stage events only time the step's barrier.
- ``jigsaw_context_switch``: a ``context_switch`` node, attached (an ``order`` edge) to the
  training stage it makes room for when the next stage of that pipeline uses those devices;
  a switch for rollout replicas (the next ``jigsaw_lease_granted`` on those devices is for
  ``rollout``) is a ``rollout`` node without edges: request events do not say which
  devices a replica holds.

Rollout nodes hold ``rollout_tp`` devices (from ``jigsaw_register_pipeline``'s spec, else
1, as in the plan). A synchronous step's first turns wait for the previous step's weight
sync, an asynchronous one's for the sync ``staleness + 1`` steps earlier (mode and
staleness from the registered spec); without a registered mode, for the last weight sync
that ended before the step's first request was submitted. Progress, lease, lifecycle and
step hooks are accepted; an unknown hook, a missing argument or an unknown stage is a
:class:`GraphError` naming the event.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict

from jigsaw_plugin.algorithms import FORWARD_STAGES, STAGES_BY_ALGORITHM
from jigsaw_plugin.graph._steps import add_training, node_id, reward_resource
from jigsaw_plugin.graph.graph import GraphError, SubStageGraph
from jigsaw_plugin.graph.substage import SubStage
from jigsaw_plugin.hookspecs import HOOK_NAMES, STAGES

__all__ = ["build_from_events"]

_REQUEST = ("pipeline", "step", "request_id", "turn", "t")
_REQUIRED = {
    "jigsaw_register_pipeline": ("pipeline",),
    "jigsaw_step_start": ("pipeline", "step", "t"),
    "jigsaw_stage_start": ("pipeline", "step", "stage", "devices", "t"),
    "jigsaw_stage_end": ("pipeline", "step", "stage", "devices", "t"),
    "jigsaw_request_submitted": _REQUEST + ("replica", "prompt_tokens"),
    "jigsaw_request_finished": _REQUEST + ("replica", "generated_tokens"),
    "jigsaw_request_aborted": _REQUEST + ("replica", "generated_tokens", "reason"),
    "jigsaw_request_migrated": _REQUEST + ("src_replica", "dst_replica", "generated_tokens"),
    "jigsaw_tool_call_start": _REQUEST,
    "jigsaw_tool_call_end": _REQUEST,
    "jigsaw_weight_sync_start": ("pipeline", "step", "t"),
    "jigsaw_weight_sync_end": ("pipeline", "step", "t"),
    "jigsaw_context_switch": ("devices", "to_pipeline", "duration_s", "t"),
    "jigsaw_lease_granted": ("pipeline", "devices", "purpose", "t"),
}
#: accepted and not needed for the graph
_IGNORED = frozenset({"jigsaw_request_progress", "jigsaw_lease_released", "jigsaw_pipeline_start",
                      "jigsaw_pipeline_end", "jigsaw_step_end", "jigsaw_schedule", "jigsaw_predict_duration",
                      "jigsaw_predict_remaining"})


def _is_int(v, low=0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def _is_time(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_name(v) -> bool:
    return isinstance(v, str) and bool(v)


def _is_id(v) -> bool:  # a request or replica id: hashable, orderable with its kind
    return isinstance(v, str) or _is_int(v, low=-(2**63))


#: field -> (check, what is allowed). A corrupt or hand-edited log is refused naming the
#: event and the field, before a wrong type turns into a traceback deep in the builder.
_FIELDS = {
    "pipeline": (_is_name, "a non-empty string"),
    "to_pipeline": (_is_name, "a non-empty string"),
    "from_pipeline": (lambda v: v is None or isinstance(v, str), "a string or null"),
    "stage": (_is_name, "a stage name"),
    "purpose": (_is_name, "a non-empty string"),
    "reason": (_is_name, "a non-empty string"),
    "step": (_is_int, "an integer >= 0"),
    "turn": (_is_int, "an integer >= 0"),
    "t": (_is_time, "a finite number of seconds"),
    "duration_s": (lambda v: _is_time(v) and v >= 0, "a finite number of seconds >= 0"),
    "devices": (lambda v: isinstance(v, (list, tuple)) and all(_is_int(d) for d in v), "a list of device ids >= 0"),
    "request_id": (_is_id, "a string or an integer"),
    "replica": (lambda v: v is None or _is_id(v), "a string, an integer or null"),
    "src_replica": (lambda v: v is None or _is_id(v), "a string, an integer or null"),
    "dst_replica": (lambda v: v is None or _is_id(v), "a string, an integer or null"),
    "spec": (lambda v: v is None or isinstance(v, dict), "a mapping"),
    **{k: (lambda v: v is None or _is_int(v), "an integer >= 0 or null")
       for k in ("samples", "tokens", "max_tokens", "bytes", "version")},
    **{k: (_is_int, "an integer >= 0") for k in ("prompt_tokens", "generated_tokens", "observation_tokens")},
}
#: the keys of a registered spec that the builder reads
_SPEC_FIELDS = {
    "mode": (lambda v: v in ("sync", "async"), "sync | async"),
    "staleness": (lambda v: v is None or _is_int(v), "an integer >= 0"),
    "algorithm": (lambda v: v is None or v in STAGES_BY_ALGORITHM, " | ".join(STAGES_BY_ALGORITHM)),
    "gpus": (lambda v: v is None or _is_int(v, low=1), "an integer >= 1"),
}


def _check_fields(i: int, hook: str, ev: dict) -> None:
    for key, value in ev.items():
        check = _FIELDS.get(key)
        if check is not None and not check[0](value):
            raise GraphError(f"event {i} ({hook}): {key} = {value!r}; allowed: {check[1]}")
    for key, value in (ev.get("spec") or {}).items() if hook == "jigsaw_register_pipeline" else ():
        check = _SPEC_FIELDS.get(key)
        if check is not None and not check[0](value):
            raise GraphError(f"event {i} ({hook}): spec.{key} = {value!r}; allowed: {check[1]}")


class _Seg:
    """One stretch of a turn on one replica (or a migration between two)."""

    __slots__ = ("turn", "kind", "start", "end", "replica", "prompt", "carried", "tokens", "attrs")

    def __init__(self, turn, kind, start, replica, prompt=0, carried=0):
        self.turn, self.kind, self.start, self.end, self.replica = turn, kind, start, None, replica
        self.prompt, self.carried, self.tokens, self.attrs = prompt, carried, 0, {}


class _Traj:
    __slots__ = ("segments", "tools", "prompt", "finished", "first_t")

    def __init__(self):
        self.segments: list[_Seg] = []
        self.tools = {}  # turn -> [start, end, observation_tokens]
        self.prompt = None  # turn 0's prompt tokens
        self.finished = {}  # turn -> generated tokens (the turn's total)
        self.first_t = None


class _Reader:
    def __init__(self):
        self.specs: dict[str, dict] = {}
        self.trajs: dict = defaultdict(_Traj)  # (pipeline, step, request_id) -> _Traj
        self.open: dict = {}  # (pipeline, step, request_id, turn) -> open _Seg
        self.carried: dict = {}  # key -> generated tokens kept across an abort
        self.moving: dict = {}  # key -> (t, replica, generated, prompt): aborted to migrate
        self.stages: dict = defaultdict(dict)  # (pipeline, step) -> stage -> [start, end, devices, samples, tokens]
        self.syncs: dict = {}  # (pipeline, step) -> {"start", "end", "version", "bytes"}
        self.step_of: dict = {}  # pipeline -> latest step started
        self.switches: list[dict] = []
        self.pending: dict = defaultdict(list)  # pipeline -> switches not yet attached

    def read(self, events: list[dict]) -> None:
        for i, ev in enumerate(events):
            hook = ev.get("hook") if isinstance(ev, dict) else None
            if hook not in HOOK_NAMES:
                raise GraphError(f"event {i}: unknown hook {hook!r}; known hooks: {', '.join(HOOK_NAMES)}")
            missing = [k for k in _REQUIRED.get(hook, ()) if k not in ev]
            if missing:
                raise GraphError(f"event {i} ({hook}): missing {', '.join(missing)}")
            _check_fields(i, hook, ev)
            if hook in _IGNORED:
                continue
            getattr(self, hook[len("jigsaw_"):])(i, ev)

    # ---- lifecycle ----------------------------------------------------------------------
    def register_pipeline(self, i, ev):
        self.specs[ev["pipeline"]] = dict(ev.get("spec") or {})

    def step_start(self, i, ev):
        self.step_of[ev["pipeline"]] = max(self.step_of.get(ev["pipeline"], 0), ev["step"])

    def lease_granted(self, i, ev):
        for sw in self._claim(ev["pipeline"], ev["devices"]):
            sw["resource"] = "rollout" if ev["purpose"] == "rollout" else "train"

    def context_switch(self, i, ev):
        pipe = ev["to_pipeline"]
        sw = {"i": len(self.switches), "ev": ev, "pipeline": pipe, "step": self.step_of.get(pipe, 0),
              "resource": "train", "stage": None}
        self.switches.append(sw)
        self.pending[pipe].append(sw)

    def _claim(self, pipe, devices):
        """The pending switches of ``pipe`` on any of ``devices`` (now attached)."""
        devices = set(devices)
        hit = [sw for sw in self.pending.get(pipe, ()) if devices & set(sw["ev"]["devices"])]
        if hit:
            self.pending[pipe] = [sw for sw in self.pending[pipe] if sw not in hit]
        return hit

    # ---- stages -------------------------------------------------------------------------
    def _stage(self, i, ev):
        if ev["stage"] not in STAGES:
            raise GraphError(f"event {i} ({ev['hook']}): stage {ev['stage']!r}; allowed: {', '.join(STAGES)}")
        key = (ev["pipeline"], ev["step"])
        rec = self.stages[key].setdefault(ev["stage"], [None, None, tuple(ev["devices"]), 0, 0])
        if ev.get("samples") is not None:
            rec[3] = ev["samples"]
        if ev.get("tokens") is not None:
            rec[4] = ev["tokens"]
        return key, rec

    def stage_start(self, i, ev):
        key, rec = self._stage(i, ev)
        rec[0], rec[2] = ev["t"], tuple(ev["devices"])
        self.step_of[ev["pipeline"]] = max(self.step_of.get(ev["pipeline"], 0), ev["step"])
        if ev["stage"] not in ("gen", "reward"):
            for sw in self._claim(ev["pipeline"], ev["devices"]):
                sw.update(resource="train", step=ev["step"], stage=ev["stage"])

    def stage_end(self, i, ev):
        _, rec = self._stage(i, ev)
        rec[1] = ev["t"]
        if not rec[2]:
            rec[2] = tuple(ev["devices"])

    def weight_sync_start(self, i, ev):
        rec = self.syncs.setdefault((ev["pipeline"], ev["step"]), {})
        rec.update(start=ev["t"], version=ev.get("version"), bytes=ev.get("bytes"),
                   devices=tuple(ev.get("devices") or ()))

    def weight_sync_end(self, i, ev):
        rec = self.syncs.setdefault((ev["pipeline"], ev["step"]), {})
        rec["end"] = ev["t"]
        rec.setdefault("version", ev.get("version"))

    # ---- requests -----------------------------------------------------------------------
    @staticmethod
    def _key(ev):
        return ev["pipeline"], ev["step"], ev["request_id"], ev["turn"]

    def _close(self, seg: _Seg, t, generated, why):
        seg.end = t
        gained = generated - seg.carried
        seg.tokens = gained if gained >= 0 else generated
        seg.attrs["ended"] = why

    def request_submitted(self, i, ev):
        key = self._key(ev)
        tr = self.trajs[key[:3]]
        if tr.first_t is None:
            tr.first_t = ev["t"]
        if key[3] == 0 and tr.prompt is None:
            tr.prompt = ev["prompt_tokens"]
        seg = self.open.get(key)
        if seg is not None:
            if seg.kind == "gen" and seg.attrs.get("via") == "migration" and seg.replica == ev["replica"]:
                seg.prompt = ev["prompt_tokens"]  # the destination announcing the moved request
                return
            self._close(seg, ev["t"], seg.carried, "resubmitted")
        if key in self.moving:  # aborted to migrate, no migrated event: the move is this resubmission
            t, src, generated, prompt = self.moving.pop(key)
            self._migration(tr, key, t, src, ev["replica"], generated, prompt)
            self.open[key].start = ev["t"]
            return
        seg = _Seg(key[3], "gen", ev["t"], ev["replica"], ev["prompt_tokens"], self.carried.pop(key, 0))
        tr.segments.append(seg)
        self.open[key] = seg

    def request_finished(self, i, ev):
        key = self._key(ev)
        tr = self.trajs[key[:3]]
        seg = self.open.pop(key, None)
        if seg is None:  # no submission recorded: the segment's start is unknown
            seg = _Seg(key[3], "gen", None, ev["replica"], carried=self.carried.pop(key, 0))
            tr.segments.append(seg)
        seg.replica = ev["replica"]
        self._close(seg, ev["t"], ev["generated_tokens"], "finished")
        tr.finished[key[3]] = ev["generated_tokens"]

    def request_aborted(self, i, ev):
        key = self._key(ev)
        seg = self.open.pop(key, None)
        prompt = 0
        if seg is not None:
            self._close(seg, ev["t"], ev["generated_tokens"], f"aborted: {ev['reason']}")
            prompt = seg.prompt + seg.tokens
        if ev["reason"] == "migrate":
            self.moving[key] = (ev["t"], ev["replica"], ev["generated_tokens"], prompt)
        else:
            self.carried[key] = ev["generated_tokens"]  # resubmitted later with its prefix

    def request_migrated(self, i, ev):
        key = self._key(ev)
        tr = self.trajs[key[:3]]
        if key in self.moving:  # its source segment was closed by the abort
            _, _, _, prompt = self.moving.pop(key)
        else:
            seg = self.open.pop(key, None)
            prompt = 0
            if seg is not None:
                self._close(seg, ev["t"], ev["generated_tokens"], "migrated")
                prompt = seg.prompt + seg.tokens
        self._migration(tr, key, ev["t"], ev["src_replica"], ev["dst_replica"], ev["generated_tokens"], prompt)

    def _migration(self, tr, key, t, src, dst, generated, reprefill):
        mig = _Seg(key[3], "migration", t, dst)
        mig.end, mig.tokens = t, reprefill
        mig.attrs.update(src_replica=src, dst_replica=dst, generated_tokens=generated)
        tr.segments.append(mig)
        seg = _Seg(key[3], "gen", t, dst, reprefill, generated)
        seg.attrs["via"] = "migration"
        tr.segments.append(seg)
        self.open[key] = seg

    def tool_call_start(self, i, ev):
        self.trajs[self._key(ev)[:3]].tools[ev["turn"]] = [ev["t"], None, 0]

    def tool_call_end(self, i, ev):
        tool = self.trajs[self._key(ev)[:3]].tools.setdefault(ev["turn"], [None, None, 0])
        tool[1], tool[2] = ev["t"], ev.get("observation_tokens", 0)


def build_from_events(events: list[dict], pipeline: str | None = None) -> SubStageGraph:
    """The sub-stage graph of the recorded ``events`` (every pipeline in them, or only
    ``pipeline``). See the module docstring for the mapping."""
    r = _Reader()
    r.read(events)
    g = SubStageGraph()
    by_step = defaultdict(list)
    for (pipe, step, rid), tr in r.trajs.items():
        by_step[(pipe, step)].append((rid, tr))
    keys = sorted(set(by_step) | set(r.stages), key=lambda k: (k[0], k[1]))
    ws_ids: dict = {}
    for pipe, step in keys:
        if pipeline is not None and pipe != pipeline:
            continue
        spec = r.specs.get(pipe, {})
        tp = int(spec.get("rollout_tp") or 1)
        trajs = sorted(by_step.get((pipe, step), []), key=lambda x: _natural(_index(pipe, step, x[0])))
        rewards, firsts = [], []
        for rid, tr in trajs:
            rw, first = _add_trajectory(g, pipe, step, rid, tr, tp, spec)
            if rw is not None:
                rewards.append(rw)
            if first is not None:
                firsts.append(first)
        gate = _gate(r, spec, pipe, step, ws_ids, trajs)
        if gate is not None:
            g.add_edges(((gate, f) for f in firsts), "barrier")
        ws = _add_step_training(g, r, spec, pipe, step, rewards)
        if ws is not None:
            ws_ids[(pipe, step)] = ws
    _add_switches(g, r, pipeline)
    return g


def _index(pipe, step, rid) -> str:
    """A request's index in node ids: the simulator's ``pipeline/step/sample`` -> sample."""
    text = str(rid)
    prefix = f"{pipe}/{step}/"
    return text[len(prefix):] if text.startswith(prefix) else text


def _natural(text: str):
    return (0, int(text), "") if text.isdigit() else (1, 0, text)


def _add_trajectory(g, pipe, step, rid, tr: _Traj, tp: int, spec: dict):
    """Its nodes and edges; returns (reward id or None, first gen segment id or None)."""
    req = node_id(pipe, step, f"r{_index(pipe, step, rid)}")
    segs = sorted(tr.segments, key=lambda s: s.turn)  # stable: event order within a turn
    ends = [s.end for s in segs if s.end is not None] + [t[1] for t in tr.tools.values() if t[1] is not None]
    subs, data = [], []
    g.add(SubStage(req, pipe, step, "rollout_request", "rollout", tp,
                   {"prompt_tokens": tr.prompt or 0, "tokens": sum(tr.finished.values()), "turns": len(tr.finished)},
                   tr.first_t, max(ends) if ends else None, {"request_id": rid}))
    prev, first, parts, migs = None, None, defaultdict(int), defaultdict(int)
    for i, s in enumerate(segs):
        if s.kind == "migration":
            nid = f"{req}/t{s.turn}/mig{migs[s.turn]}"
            migs[s.turn] += 1
            subs.append(SubStage(nid, pipe, step, "migration", "rollout", tp, {"tokens": s.tokens}, s.start, s.end,
                                 {"request_id": rid, "turn": s.turn, **s.attrs}))
        else:
            part = parts[s.turn]
            parts[s.turn] += 1
            nid = f"{req}/t{s.turn}" + (f".{part}" if part else "")
            attrs = {"request_id": rid, "turn": s.turn, "replica": s.replica, **s.attrs}
            attrs.pop("via", None)
            subs.append(SubStage(nid, pipe, step, "gen_turn", "rollout", tp,
                                 {"tokens": s.tokens, "prompt_tokens": s.prompt}, s.start, s.end, attrs))
        if prev is None:
            g.add_edge(req, nid, "order")
            first = nid if s.turn == 0 else None
        else:
            data.append((prev, nid))
        prev = nid
        last_of_turn = i + 1 == len(segs) or segs[i + 1].turn != s.turn
        if last_of_turn and s.turn in tr.tools:
            a, b, obs = tr.tools[s.turn]
            tool = f"{req}/tool{s.turn}"
            subs.append(SubStage(tool, pipe, step, "tool_call", "host", 0, {"tokens": obs}, a, b,
                                 {"request_id": rid, "turn": s.turn}))
            data.append((prev, tool))
            prev = tool
    reward = None
    done = bool(tr.finished) and max(tr.finished) not in tr.tools and prev is not None
    if done:  # the trajectory ended: its last turn finished and no tool call followed
        reward = f"{req}/reward"
        res, dev = reward_resource((spec.get("reward") or {}).get("kind"))
        subs.append(SubStage(reward, pipe, step, "reward", res, dev,
                             {"samples": 1, "tokens": (tr.prompt or 0) + sum(tr.finished.values()) +
                              sum(t[2] for t in tr.tools.values())}, attrs={"request_id": rid}))
        data.append((prev, reward))
    g.add_many(subs)
    g.add_edges(data, "data")
    return reward, first


def _gate(r: _Reader, spec: dict, pipe, step, ws_ids: dict, trajs):
    """The weight sync this step's first turns waited for."""
    if "mode" in spec:
        lag = 1 + (int(spec.get("staleness") or 0) if spec["mode"] == "async" else 0)
        return ws_ids.get((pipe, step - lag))
    firsts = [tr.first_t for _, tr in trajs if tr.first_t is not None]
    if not firsts:
        return None
    t0 = min(firsts)
    done = [(rec["end"], s) for (p, s), rec in r.syncs.items()
            if p == pipe and s < step and rec.get("end") is not None and rec["end"] <= t0 and (p, s) in ws_ids]
    return ws_ids[(pipe, max(done)[1])] if done else None


def _infer_algorithm(stages: set) -> str | None:
    ran = stages - {"adv", "weight_sync", "gen", "reward"}
    for name, chain in STAGES_BY_ALGORITHM.items():
        if set(chain) - {"adv", "weight_sync"} == ran:
            return name
    return None


def _add_step_training(g, r: _Reader, spec: dict, pipe, step, rewards) -> str | None:
    stages = r.stages.get((pipe, step), {})
    sync = r.syncs.get((pipe, step), {})
    if not set(stages) - {"gen", "reward"} and not sync:
        return None  # the run stopped before this step trained: no training nodes
    algorithm = spec.get("algorithm") or _infer_algorithm(set(stages))
    if algorithm is None:
        raise GraphError(f"{pipe} step {step}: stages {sorted(stages)} match no algorithm of "
                         f"{', '.join(STAGES_BY_ALGORITHM)}; record jigsaw_register_pipeline with its spec")
    fwd = next((stages[s] for s in FORWARD_STAGES if s in stages), None)
    gang = len(fwd[2]) if fwd and fwd[2] else int(spec.get("gpus") or 1)
    ref = fwd or next((v for k, v in stages.items() if k not in ("gen", "reward")), None)
    samples = ref[3] if ref and ref[3] else len(rewards)
    tokens = ref[4] if ref else 0
    times = {s: (v[0], v[1]) for s, v in stages.items()}
    if "weight_sync" not in times and sync:
        times["weight_sync"] = (sync.get("start"), sync.get("end"))
    reward_end = stages.get("reward", [None, None])[1]
    times["barrier"] = (reward_end, reward_end)
    ws = add_training(g, pipe, step, algorithm, rewards, max(1, gang), samples, tokens, times,
                      weight_bytes=sync.get("bytes"))
    if sync.get("version") is not None:
        node = g.node(ws)
        g.add(dataclasses.replace(node, attrs={**node.attrs, "version": sync["version"]}))  # same id: edges stay
    return ws


def _add_switches(g, r: _Reader, pipeline):
    for sw in r.switches:
        pipe = sw["pipeline"]
        if pipeline is not None and pipe != pipeline:
            continue
        ev = sw["ev"]
        nid = node_id(pipe, sw["step"], f"switch{sw['i']}")
        t = ev["t"]
        g.add(SubStage(nid, pipe, sw["step"], "context_switch", sw["resource"], max(1, len(ev["devices"])),
                       {"devices": len(ev["devices"])}, t, t + ev["duration_s"],
                       {"devices": list(ev["devices"]), "from_pipeline": ev.get("from_pipeline"),
                        "for_stage": sw["stage"]}))
        stage = sw["stage"]
        if stage is None:
            continue
        if stage in FORWARD_STAGES:
            d = 0
            targets = []
            while node_id(pipe, sw["step"], stage, d) in g:
                targets.append(node_id(pipe, sw["step"], stage, d))
                d += 1
        else:
            targets = [node_id(pipe, sw["step"], stage)] if node_id(pipe, sw["step"], stage) in g else []
        g.add_edges(((nid, v) for v in targets), "order")
