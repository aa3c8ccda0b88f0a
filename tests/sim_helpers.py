"""Shared helpers for simulator tests: small workloads and a hook recorder."""

from __future__ import annotations

from collections import defaultdict

from jigsaw_plugin.workload import parse_workload


def small_workload(gpus=8, pipelines=2, prompts=8, samples=4, steps=2, agentic=(False, True),
                   modes=("sync", "sync"), staleness=(0, 0), models=("qwen2.5-1.5b", "qwen2.5-1.5b"),
                   algorithms=("grpo", "ppo"), max_len=4096, median=300, gpu="h100", train_offload=None):
    pipes = []
    for i in range(pipelines):
        p = {
            "name": f"p{i}",
            "model": models[i % len(models)],
            "algorithm": algorithms[i % len(algorithms)],
            "mode": modes[i % len(modes)],
            "staleness": staleness[i % len(staleness)],
            "prompts_per_step": prompts,
            "samples_per_prompt": samples,
            "max_response_len": max_len,
            "prompt_len": {"dist": "lognormal", "median": 150, "sigma": 0.3, "min": 16},
            "response_len": {"dist": "lognormal", "median": median, "sigma": 0.9, "min": 1},
            "steps": steps,
        }
        if train_offload is not None:
            p["train_offload"] = train_offload[i % len(train_offload)]
        if agentic[i % len(agentic)]:
            p["turns"] = {"dist": "categorical", "values": [1, 2, 3], "weights": [0.3, 0.4, 0.3]}
            p["tool_latency_s"] = {"dist": "uniform", "low": 0.05, "high": 2.0}
            p["observation_len"] = {"dist": "uniform", "low": 50, "high": 400}
        pipes.append(p)
    return parse_workload({"version": 1, "cluster": {"gpus": gpus, "gpu": gpu, "gpus_per_node": 8},
                           "pipelines": pipes})


class HookLog:
    """Stands in for ``pm.hook``: records every hook call as (name, kwargs)."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        if not name.startswith("jigsaw_"):
            raise AttributeError(name)

        def record(**kw):
            self.calls.append((name, kw))

        return record

    def by(self, name):
        return [kw for n, kw in self.calls if n == name]


def assert_each_request_once(result: dict, log: "HookLog", workload) -> None:
    """Every sample of every step counted, and every submitted request (turn) finished
    exactly once (a run with ``record_requests=True`` and ``log`` as its hooks)."""
    from collections import Counter

    for p in workload.pipelines:
        assert result["pipelines"][p.name]["samples"] == p.steps * p.samples_per_step
        finished = Counter((kw["step"], kw["request_id"], kw["turn"]) for kw in log.by("jigsaw_request_finished")
                           if kw["pipeline"] == p.name)
        assert all(v == 1 for v in finished.values()), "a request finished twice"
        submitted = {(kw["step"], kw["request_id"], kw["turn"]) for kw in log.by("jigsaw_request_submitted")
                     if kw["pipeline"] == p.name}
        assert set(finished) == submitted


def device_overlaps(trace_records) -> list:
    """Pairs of intervals that overlap on one device (should be empty)."""
    per = defaultdict(list)
    for name, _cat, devices, start, end in trace_records:
        for d in devices:
            per[d].append((start, end, name))
    bad = []
    for d, iv in per.items():
        iv.sort()
        for (s0, e0, n0), (s1, e1, n1) in zip(iv, iv[1:]):
            if s1 < e0 - 1e-6:
                bad.append((d, n0, n1, e0, s1))
    return bad


def run_with_probe(probe, name: str):
    """Run the jigsaw policy on a small two-pipeline workload (one agentic) with ``probe``
    registered as a hook plugin under ``name``; the probe sees the simulation as ``probe.sim``."""
    from jigsaw_plugin.manager import get_plugin_manager, register
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.sim import Simulation

    wl = small_workload(gpus=8, pipelines=2, prompts=8, samples=4, steps=2, agentic=(False, True), median=600)
    pm = get_plugin_manager(load_entrypoints=False)
    register(pm, probe, name)
    sim = Simulation(wl, get_policy("jigsaw"), seed=3, pm=pm)
    probe.sim = sim
    sim.run()
    return sim


def one_class_state(cost, t: float = 0.0, gpus_per_node: int | None = None, **fields):
    """A hand-built ``SchedulerState`` stand-in of a pool of one class priced by ``cost``:
    what tail pricing reads of the state (``cost``, ``t``, the class and node queries, and
    the executor's ``early_passes`` capability, off unless ``fields`` says: no merge is
    stretched for an early pass, ``early_merges``).
    ``gpus_per_node``: nodes of that many devices (None: every device set on one node)."""
    from types import SimpleNamespace

    from jigsaw_plugin.costmodel.predictor import spans_extra_nodes

    def cross_node(devices):
        return gpus_per_node is not None and spans_extra_nodes(devices, gpus_per_node)

    return SimpleNamespace(cost=cost, t=t, class_costs=lambda: (cost,), cost_of=lambda devices: cost,
                           cross_node=cross_node, classes=(), **{"early_passes": False, **fields})


def full_tail_pricing(policy, state, p, src, live, ends, extra, used, slack):
    """``Jigsaw._price_move``'s answer priced in full for every destination, with no early
    exit or pre-filter: the reference the policy's cheaper pricing must agree with
    (``state``: ``one_class_state``'s, or a ``SchedulerState``)."""
    cfg, cost = policy.config, state.cost
    k, ctx = src.load, src.kv_tokens
    bound = max(ends.values()) * (1 + slack)
    best = None
    for dst in live:
        if dst is src or dst.id in used:
            continue
        n_in, kv_in = extra.get(dst.id, (0, 0.0))  # requests and KV this round's moves send it
        n = dst.running + n_in
        if n + k > dst.max_seqs or dst.kv_tokens + kv_in + ctx > 0.9 * dst.kv_capacity:
            continue
        prefill = cost.migration_s(p.model, dst.tp, ctx)
        # steps at the KV halfway through the predicted work of what each replica holds
        grown = (src.predicted_work_tokens + dst.predicted_work_tokens) / 2
        # at the destination's class and with its all-reduces over the NICs where it straddles nodes
        step, xn = state.cost_of(dst.devices).decode_step_s, state.cross_node(dst.devices)
        new = step(p.model, dst.tp, n + k, dst.kv_tokens + kv_in + ctx + grown, xn)
        old = step(p.model, dst.tp, max(1, n), dst.kv_tokens + kv_in + dst.predicted_work_tokens / 2, xn)
        end = prefill + max(src.predicted_tokens_left, dst.predicted_tokens_left) * new
        others = max((e for i, e in ends.items() if i not in (src.id, dst.id)), default=0.0)
        if max(end, others) > bound:
            continue
        if ends[src.id] * src.tp < cfg.min_gain * (prefill + (new - old) * dst.predicted_tokens_left) * dst.tp:
            continue
        if best is None or end < best[1]:
            best = (dst, end)
    return best
