"""Build the sub-stage graph of a run from its recorded hook events.

The simulator and the real runtime (and host adapters) emit the same hooks, so the same
graph comes from either. Events are ``{"hook": name, **kwargs}`` dicts (``EventRecorder``).
A request moved by migration becomes two ``gen_turn`` segments with a ``migration`` node
between them.
"""

from __future__ import annotations

from collections import defaultdict

from jigsaw_plugin.algorithms import STAGES_BY_ALGORITHM
from jigsaw_plugin.graph._steps import add_training, node_id
from jigsaw_plugin.graph.graph import GraphError, SubStageGraph
from jigsaw_plugin.graph.substage import SubStage
from jigsaw_plugin.hookspecs import HOOK_NAMES

__all__ = ["build_from_events"]

_IGNORED = {"jigsaw_request_progress", "jigsaw_lease_granted", "jigsaw_lease_released", "jigsaw_pipeline_start",
            "jigsaw_pipeline_end", "jigsaw_step_start", "jigsaw_step_end", "jigsaw_weight_sync_start",
            "jigsaw_weight_sync_end", "jigsaw_schedule", "jigsaw_predict_duration"}


def _infer_algorithm(stages: set) -> str:
    for name, chain in STAGES_BY_ALGORITHM.items():
        if set(chain) - {"adv", "weight_sync"} == stages - {"adv", "weight_sync", "gen", "reward"}:
            return name
    raise GraphError(f"stages {sorted(stages)} match no known algorithm; register the pipeline first")


class _Traj:
    __slots__ = ("segments", "tools", "last_turn", "prompt", "tokens")

    def __init__(self):
        self.segments = []  # (turn, start, end, replica, kind) ; kind: "gen" | "migration"
        self.tools = {}  # turn -> [start, end, observation_tokens]
        self.last_turn = -1
        self.prompt = 0
        self.tokens = 0


def build_from_events(events: list[dict]) -> SubStageGraph:
    specs: dict[str, dict] = {}
    trajs: dict = defaultdict(_Traj)  # (pipeline, step, request_id) -> _Traj
    open_seg: dict = {}  # (pipeline, step, request_id, turn) -> (start, replica)
    stage_t: dict = defaultdict(dict)  # (pipeline, step) -> stage -> [start, end, devices, samples, tokens]
    switches = []
    for i, ev in enumerate(events):
        hook = ev.get("hook")
        if hook not in HOOK_NAMES:
            raise GraphError(f"event {i}: unknown hook {hook!r}")
        if hook == "jigsaw_register_pipeline":
            specs[ev["pipeline"]] = dict(ev.get("spec") or {})
        elif hook == "jigsaw_request_submitted":
            tr = trajs[(ev["pipeline"], ev["step"], ev["request_id"])]
            if ev["turn"] == 0:
                tr.prompt = ev["prompt_tokens"]
            open_seg[(ev["pipeline"], ev["step"], ev["request_id"], ev["turn"])] = (ev["t"], ev["replica"])
        elif hook == "jigsaw_request_migrated":
            key = (ev["pipeline"], ev["step"], ev["request_id"], ev["turn"])
            start, rep = open_seg.pop(key, (ev["t"], ev["src_replica"]))
            tr = trajs[key[:3]]
            tr.segments.append((ev["turn"], start, ev["t"], rep, "gen", ev["generated_tokens"]))
            tr.segments.append((ev["turn"], ev["t"], ev["t"], ev["dst_replica"], "migration", ev["generated_tokens"]))
            open_seg[key] = (ev["t"], ev["dst_replica"])
        elif hook in ("jigsaw_request_finished", "jigsaw_request_aborted"):
            key = (ev["pipeline"], ev["step"], ev["request_id"], ev["turn"])
            if hook == "jigsaw_request_aborted" and ev.get("reason") == "migrate":
                continue  # the migrated event carries it
            start, rep = open_seg.pop(key, (ev["t"], ev["replica"]))
            tr = trajs[key[:3]]
            tr.segments.append((ev["turn"], start, ev["t"], rep, "gen", ev["generated_tokens"]))
            if hook == "jigsaw_request_finished":
                tr.last_turn = max(tr.last_turn, ev["turn"])
                tr.tokens += ev["generated_tokens"]
        elif hook == "jigsaw_tool_call_start":
            trajs[(ev["pipeline"], ev["step"], ev["request_id"])].tools[ev["turn"]] = [ev["t"], None, 0]
        elif hook == "jigsaw_tool_call_end":
            tool = trajs[(ev["pipeline"], ev["step"], ev["request_id"])].tools.setdefault(ev["turn"], [ev["t"], None, 0])
            tool[1], tool[2] = ev["t"], ev["observation_tokens"]
        elif hook == "jigsaw_stage_start":
            stage_t[(ev["pipeline"], ev["step"])][ev["stage"]] = [ev["t"], None, tuple(ev["devices"]), ev["samples"],
                                                                  ev["tokens"]]
        elif hook == "jigsaw_stage_end":
            rec = stage_t[(ev["pipeline"], ev["step"])].setdefault(
                ev["stage"], [ev["t"], None, tuple(ev["devices"]), ev["samples"], ev["tokens"]])
            rec[1] = ev["t"]
        elif hook == "jigsaw_context_switch":
            switches.append(ev)
        elif hook not in _IGNORED:
            raise GraphError(f"event {i}: hook {hook!r} is not handled")
    return _assemble(specs, trajs, stage_t, switches)


def _assemble(specs, trajs, stage_t, switches) -> SubStageGraph:
    g = SubStageGraph()
    by_step = defaultdict(list)
    for (pipe, step, rid), tr in trajs.items():
        by_step[(pipe, step)].append((rid, tr))
    syncs: dict = {}
    for (pipe, step) in sorted(set(by_step) | set(stage_t), key=lambda k: (k[0], k[1])):
        spec = specs.get(pipe, {})
        stages = stage_t.get((pipe, step), {})
        algorithm = spec.get("algorithm") or _infer_algorithm(set(stages))
        lag = 1 + (int(spec.get("staleness", 0)) if spec.get("mode") == "async" else 0)
        gate = syncs.get((pipe, step - lag))
        rewards = []
        for rid, tr in sorted(by_step.get((pipe, step), []), key=lambda x: x[0]):
            rewards.append(_add_trajectory(g, pipe, step, rid, tr, gate))
        fwd = next((stages[s] for s in ("old_log_prob", "ref", "values") if s in stages), None)
        gang = len(fwd[2]) if fwd else 1
        samples = fwd[3] if fwd else len(rewards)
        tokens = fwd[4] if fwd else 0
        times = {s: (v[0], v[1]) for s, v in stages.items()}
        syncs[(pipe, step)] = add_training(g, pipe, step, algorithm, rewards, max(1, gang), samples, tokens, times)
    for j, ev in enumerate(switches):
        g.add(SubStage(f"{ev['to_pipeline']}/switch{j}", ev["to_pipeline"], -1, "context_switch", "train",
                       max(1, len(ev["devices"])), {}, ev["t"], ev["t"] + ev["duration_s"],
                       {"devices": list(ev["devices"])}))
    return g


def _add_trajectory(g, pipe, step, rid, tr, gate) -> str:
    idx = rid.rsplit("/", 1)[-1]
    req = g.add(SubStage(node_id(pipe, step, "r", idx), pipe, step, "rollout_request", "rollout", 1,
                         {"prompt_tokens": tr.prompt, "tokens": tr.tokens}, attrs={"request_id": rid}))
    prev, seen = req.id, defaultdict(int)
    segs = sorted(tr.segments, key=lambda s: s[0])  # stable: events arrive in time order
    for i, (turn, start, end, rep, kind, gen) in enumerate(segs):
        part = seen[turn]
        seen[turn] += 1
        if kind == "migration":
            nid = node_id(pipe, step, "r", idx, "t", turn, "migrate", part)
            s = g.add(SubStage(nid, pipe, step, "migration", "rollout", 1, {"tokens": gen}, start, end,
                               {"replica": rep, "turn": turn}))
        else:
            nid = node_id(pipe, step, "r", idx, "t", turn) + (f"/part{part}" if part else "")
            s = g.add(SubStage(nid, pipe, step, "gen_turn", "rollout", 1, {"tokens": gen}, start, end,
                               {"replica": rep, "turn": turn}))
        g.add_edge(prev, s.id, "order" if prev == req.id else "data")
        if turn == 0 and part == 0 and gate is not None:
            g.add_edge(gate, s.id, "barrier")
        prev = s.id
        last_of_turn = i + 1 == len(segs) or segs[i + 1][0] != turn
        if kind == "gen" and last_of_turn and turn in tr.tools:
            a, b, obs = tr.tools[turn]
            tool = g.add(SubStage(node_id(pipe, step, "r", idx, "tool", turn), pipe, step, "tool_call", "host", 0,
                                  {"tokens": obs}, a, b))
            g.add_edge(prev, tool.id, "data")
            prev = tool.id
    rw = g.add(SubStage(node_id(pipe, step, "r", idx, "reward"), pipe, step, "reward", "host", 0, {"samples": 1}))
    g.add_edge(prev, rw.id, "data")
    return rw.id
