"""The workload spec (YAML, version 1): dataclasses, loading and validation.

See docs/workload.md for every key. Every problem raises :class:`SpecError` whose ``field``
is the full dotted path (``pipelines[1].turns.weights``); a required key that is absent is
reported with the value ``"<missing>"``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from jigsaw_plugin.costmodel.profiles import model_profile
from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.workload.distributions import (
    Const,
    Distribution,
    Lognormal,
    _check_keys,
    _is_int,
    _is_number,
    build_distribution,
)

__all__ = [
    "KNOWN_GPUS",
    "KNOWN_MODELS",
    "ALGORITHMS",
    "MODES",
    "REWARD_KINDS",
    "TRAIN_OFFLOAD",
    "ClusterSpec",
    "DeviceClassSpec",
    "LinkSpec",
    "PreemptionSpec",
    "RewardSpec",
    "PipelineSpec",
    "WorkloadSpec",
    "load_workload",
    "parse_workload",
    "default_reward_latency",
]

KNOWN_GPUS = ("h100", "h800", "h200", "h20", "a100", "cpu")
KNOWN_MODELS = (
    "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen2.5-math-7b", "qwen2.5-14b",
    "qwen2.5-32b", "qwen2.5-72b",
    "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b",
    "tiny-qwen2",
)
ALGORITHMS = ("grpo", "dapo", "ppo", "reinforce")
MODES = ("sync", "async")
REWARD_KINDS = ("rule", "sandbox", "model")

_GPU_KEYS = ("flops_tflops", "hbm_tbps", "memory_gb", "link_gbps")
_GPU_OPT = ("name", "internode_gbps", "host_gbps")
_MODEL_KEYS = ("params_b", "layers", "hidden", "kv_heads", "head_dim", "vocab")
_MODEL_OPT = ("name", "default_tp")
_TOP_KEYS = ("version", "cluster", "pipelines")
_CLUSTER_KEYS = ("gpus", "gpu", "gpus_per_node", "price_per_hour", "classes")
_CLASS_KEYS = ("name", "gpu", "count", "gpus_per_node", "price_per_hour", "link", "preemptible")
_LINK_KEYS = ("bandwidth_gbit_s", "latency_ms")
_PREEMPT_KEYS = ("rate_per_hour", "trace", "replace_s")
#: Seconds a preempted device takes to be replaced when ``preemptible.replace_s`` is omitted
#: (a spot re-acquisition and boot; RLAX's workers rejoin in about this time).
DEFAULT_REPLACE_S = 120.0
_PIPELINE_KEYS = (
    "name", "model", "algorithm", "mode", "staleness", "prompts_per_step", "samples_per_prompt",
    "max_response_len", "prompt_len", "response_len", "turns", "tool_latency_s", "observation_len",
    "reward", "steps", "gpus", "rollout_tp", "group_correlation", "train_offload",
)
#: Where a pipeline's training state lives (``pipelines[i].train_offload``; the cost model
#: prices each, docs/workload.md): ``none`` on its gang's devices; ``optimizer`` the fp32
#: master weights and Adam's moments on the host, the step run there (DeepSpeed's
#: ``offload_optimizer``: OpenRLHF's ``--ds.adam_offload``); ``full`` weights, gradients and
#: optimizer on the host, streamed to the gang for each pass (FSDP2's ``CPUOffloadPolicy``:
#: verl's ``fsdp_config.offload_policy``)
TRAIN_OFFLOAD = ("none", "optimizer", "full")
_AGENTIC_KEYS = ("turns", "tool_latency_s", "observation_len")
_REWARD_KEYS = ("kind", "latency_s")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
#: The largest count a spec may give (GPUs, steps, prompts, tokens): products of two stay in int64.
MAX_COUNT = 10**9


def default_reward_latency(kind: str) -> Distribution | None:
    """The reward latency (seconds per sample) when ``reward.latency_s`` is omitted.

    rule: 10 ms (a regex / math-verify check). sandbox: a lognormal fitted to rLLM
    DeepCoder's sandboxed test runs (PolyTrace rllm/reward_timings_*, docs/workload.md).
    model: none; a reward model's latency depends on it, so ``latency_s`` is required.
    """
    if kind == "rule":
        return Const(0.01)
    if kind == "sandbox":
        return Lognormal(1.148, 0.403, lo=0.0)
    return None


@dataclass(frozen=True)
class LinkSpec:
    """The network path from the trainer site to a device class (ECHO-2's wide-area link):
    weights reach the class at ``bandwidth_gbit_s`` after ``latency_ms``."""

    bandwidth_gbit_s: float  # gigabits per second
    latency_ms: float = 0.0

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_gbit_s * 1e9 / 8

    def transfer_s(self, nbytes: float) -> float:
        return self.latency_ms / 1e3 + nbytes / self.bytes_per_s

    def to_dict(self) -> dict:
        return {"bandwidth_gbit_s": self.bandwidth_gbit_s, "latency_ms": self.latency_ms}


@dataclass(frozen=True)
class PreemptionSpec:
    """How a class's devices are preempted: a Poisson ``rate_per_hour`` per device, or the
    times of a trace (``trace``: (seconds, device index within the class) pairs, read from
    ``trace_path``); a preempted device is replaced after ``replace_s``."""

    rate_per_hour: float | None = None
    trace: tuple[tuple[float, int], ...] | None = None
    trace_path: str | None = None
    replace_s: float = DEFAULT_REPLACE_S

    def to_dict(self) -> dict:
        d: dict = {"replace_s": self.replace_s}
        if self.rate_per_hour is not None:
            d["rate_per_hour"] = self.rate_per_hour
        if self.trace_path is not None:
            d["trace"] = self.trace_path
        return d


@dataclass(frozen=True)
class DeviceClassSpec:
    """One kind of device in the pool: a GPU profile (name or dict), how many, their node
    size, their price per device-hour (None: not given; cost is then counted in
    device-hours), the link to the trainer site (None: in the trainer's data centre) and
    how they are preempted (None: on demand, never preempted)."""

    name: str
    gpu: str | dict
    count: int
    gpus_per_node: int
    price_per_hour: float | None = None
    link: LinkSpec | None = None
    preemptible: PreemptionSpec | None = None

    def to_dict(self) -> dict:
        d: dict = {"name": self.name, "gpu": dict(self.gpu) if isinstance(self.gpu, dict) else self.gpu,
                   "count": self.count, "gpus_per_node": self.gpus_per_node}
        if self.price_per_hour is not None:
            d["price_per_hour"] = self.price_per_hour
        if self.link is not None:
            d["link"] = self.link.to_dict()
        if self.preemptible is not None:
            d["preemptible"] = self.preemptible.to_dict()
        return d


@dataclass(frozen=True)
class ClusterSpec:
    """The shared device pool. ``gpu`` is a profile name (lower case) or a dict of specs.

    ``classes`` is empty for the single-class form (``gpus``, ``gpu``, ``gpus_per_node``);
    with device classes, devices are numbered class by class in the order given, ``gpus``
    is their total and ``gpu`` / ``gpus_per_node`` are the first class's (the profile
    policies estimate with)."""

    gpus: int
    gpu: str | dict
    gpus_per_node: int
    price_per_hour: float | None = None  # single-class form only
    classes: tuple[DeviceClassSpec, ...] = ()

    def device_classes(self) -> tuple[DeviceClassSpec, ...]:
        """Every class, the single-class form as one class named after its GPU."""
        if self.classes:
            return self.classes
        name = self.gpu if isinstance(self.gpu, str) else str(self.gpu.get("name", "custom"))
        return (DeviceClassSpec(name, self.gpu, self.gpus, self.gpus_per_node, self.price_per_hour),)

    def device_nodes(self) -> tuple[int, ...]:
        """The node of each device id: each class's devices in nodes of its own
        ``gpus_per_node`` from its first device (a class need not fill its last node, nor
        start where a node of another class's size would), nodes numbered in order over the
        classes. The single-class form: device ``d`` on node ``d // gpus_per_node``."""
        nodes: list[int] = []
        first = 0
        for c in self.device_classes():
            per = max(1, c.gpus_per_node)
            nodes.extend(first + i // per for i in range(c.count))
            first += -(-c.count // per)
        return tuple(nodes)

    def node_sizes(self) -> tuple[int, ...]:
        """Each node's size as provisioned (its class's ``gpus_per_node``; a class's last
        node may hold fewer of its devices), in ``device_nodes``' numbering."""
        return tuple(max(1, c.gpus_per_node) for c in self.device_classes()
                     for _ in range(-(-c.count // max(1, c.gpus_per_node))))

    @property
    def largest_node(self) -> int:
        """The largest ``gpus_per_node`` of the pool's classes: the widest tensor-parallel
        group a node holds."""
        return max(self.node_sizes())

    def to_dict(self) -> dict:
        if self.classes:
            return {"classes": [c.to_dict() for c in self.classes]}
        d = {"gpus": self.gpus, "gpu": dict(self.gpu) if isinstance(self.gpu, dict) else self.gpu,
             "gpus_per_node": self.gpus_per_node}
        if self.price_per_hour is not None:
            d["price_per_hour"] = self.price_per_hour
        return d


@dataclass(frozen=True)
class RewardSpec:
    kind: str
    latency_s: Distribution  # seconds per sample

    def to_dict(self) -> dict:
        return {"kind": self.kind, "latency_s": self.latency_s.to_dict()}


@dataclass(frozen=True)
class PipelineSpec:
    """One RL pipeline. ``turns`` is None for a single-turn pipeline (then so are
    ``tool_latency_s`` and ``observation_len``); ``gpus`` None means an equal split of
    what the explicit shares leave; ``rollout_tp`` None means the model profile's default."""

    name: str
    model: str | dict
    algorithm: str
    mode: str
    staleness: int
    prompts_per_step: int
    samples_per_prompt: int
    max_response_len: int
    prompt_len: Distribution
    response_len: Distribution
    turns: Distribution | None
    tool_latency_s: Distribution | None
    observation_len: Distribution | None
    reward: RewardSpec
    steps: int
    gpus: int | None = None
    rollout_tp: int | None = None
    # intra-class correlation of (normal scores of) response length among the samples of
    # one prompt, in [0, 1); 0: independent samples (sampling.py, docs/workload.md)
    group_correlation: float = 0.0
    train_offload: str = "none"  # one of TRAIN_OFFLOAD

    @property
    def agentic(self) -> bool:
        return self.turns is not None

    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.samples_per_prompt

    def to_dict(self) -> dict:
        d: dict = {
            "name": self.name,
            "model": dict(self.model) if isinstance(self.model, dict) else self.model,
            "algorithm": self.algorithm,
            "mode": self.mode,
            "staleness": self.staleness,
            "prompts_per_step": self.prompts_per_step,
            "samples_per_prompt": self.samples_per_prompt,
            "max_response_len": self.max_response_len,
            "prompt_len": self.prompt_len.to_dict(),
            "response_len": self.response_len.to_dict(),
        }
        for key in _AGENTIC_KEYS:
            dist = getattr(self, key)
            if dist is not None:
                d[key] = dist.to_dict()
        d["reward"] = self.reward.to_dict()
        d["steps"] = self.steps
        if self.gpus is not None:
            d["gpus"] = self.gpus
        if self.rollout_tp is not None:
            d["rollout_tp"] = self.rollout_tp
        if self.group_correlation:
            d["group_correlation"] = self.group_correlation
        if self.train_offload != "none":
            d["train_offload"] = self.train_offload
        return d


@dataclass(frozen=True)
class WorkloadSpec:
    version: int
    cluster: ClusterSpec
    pipelines: tuple[PipelineSpec, ...]
    path: str | None = None  # the YAML file it was loaded from

    def pipeline(self, name: str) -> PipelineSpec:
        for p in self.pipelines:
            if p.name == name:
                return p
        raise KeyError(f"no pipeline {name!r}; pipelines: {', '.join(p.name for p in self.pipelines)}")

    def static_gpus(self) -> tuple[int, ...]:
        """Each pipeline's static device count under the baselines: its ``gpus``, else an
        equal split of what the explicit shares leave (remainder to the first ones)."""
        return _shares([p.gpus for p in self.pipelines], self.cluster.gpus)

    def to_dict(self) -> dict:
        """A plain dict (YAML/JSON-able); ``parse_workload(to_dict())`` gives an equal spec.
        Trace paths are written resolved (absolute)."""
        return {"version": self.version, "cluster": self.cluster.to_dict(),
                "pipelines": [p.to_dict() for p in self.pipelines]}


def _shares(explicit: list[int | None], total: int) -> tuple[int, ...]:
    rest = [i for i, g in enumerate(explicit) if g is None]
    left = total - sum(g for g in explicit if g is not None)
    out = []
    for i, g in enumerate(explicit):
        if g is None:
            k = rest.index(i)
            g = left // len(rest) + (1 if k < left % len(rest) else 0)
        out.append(g)
    return tuple(out)


# --------------------------------------------------------------------------- loading


def load_workload(path: str | Path) -> WorkloadSpec:
    """Read and validate a workload YAML file; relative trace paths resolve against its folder."""
    p = Path(path)
    where = str(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError("<file>", str(path), f"a readable UTF-8 YAML file ({getattr(e, 'strerror', None) or e})",
                        where) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        msg = " ".join(str(e).split())
        raise SpecError("<file>", msg, "valid YAML", where) from None
    return parse_workload(data, base_dir=p.resolve().parent, where=where, path=str(path))


def parse_workload(data: object, base_dir: str | Path = ".", where: str | None = None,
                   path: str | None = None) -> WorkloadSpec:
    """Validate a workload given as a dict (e.g. parsed YAML or ``WorkloadSpec.to_dict()``)."""
    if not isinstance(data, dict):
        raise SpecError("<root>", data, "a mapping with keys version, cluster, pipelines", where)
    _check_keys(data, _TOP_KEYS, "", where)
    version = _need(data, "version", "", "1", where)
    if not _is_int(version) or version != 1:
        raise SpecError("version", version, "1", where)
    cluster = _cluster(_need(data, "cluster", "", "a mapping with gpus, gpu, gpus_per_node", where), where, base_dir)
    plist = _need(data, "pipelines", "", "a non-empty list of pipelines", where)
    if not isinstance(plist, list) or not plist:
        raise SpecError("pipelines", plist, "a non-empty list of pipelines", where)
    pipelines = tuple(_pipeline(p, f"pipelines[{i}]", cluster, base_dir, where) for i, p in enumerate(plist))
    seen: dict[str, int] = {}
    for i, p in enumerate(pipelines):
        if p.name in seen:
            raise SpecError(f"pipelines[{i}].name", p.name, f"a unique name (pipelines[{seen[p.name]}] has it)",
                            where)
        seen[p.name] = i
    _check_shares(pipelines, cluster, where)
    return WorkloadSpec(1, cluster, pipelines, path if path is not None else where)


def _need(d: dict, key: str, field: str, allowed: str, where: str | None) -> object:
    if key not in d or d[key] is None:
        raise SpecError(f"{field}.{key}" if field else key, "<missing>", allowed, where)
    return d[key]


def _int(d: dict, key: str, field: str, where: str | None, *, minimum: int = 1, default: object = "<required>"):
    f = f"{field}.{key}"
    if key not in d or d[key] is None:
        if default == "<required>":
            raise SpecError(f, "<missing>", f"an integer >= {minimum} and <= {MAX_COUNT}", where)
        return default
    v = d[key]
    if not _is_int(v) or not minimum <= v <= MAX_COUNT:  # a bigger count overflows numpy's int64 later
        raise SpecError(f, v, f"an integer >= {minimum} and <= {MAX_COUNT}", where)
    return int(v)


def _choice(d: dict, key: str, field: str, options: tuple[str, ...], where: str | None, default: str | None = None):
    f = f"{field}.{key}"
    if key not in d or d[key] is None:
        if default is None:
            raise SpecError(f, "<missing>", " | ".join(options), where)
        return default
    v = d[key]
    if not isinstance(v, str) or v.lower() not in options:
        raise SpecError(f, v, " | ".join(options), where)
    return v.lower()


def _spec_dict(v: object, field: str, required: tuple[str, ...], optional: tuple[str, ...], where: str | None) -> dict:
    """A custom gpu/model dict: required keys positive numbers, optional name / counts."""
    _check_keys(v, (*required, *optional), field, where)
    out = {}
    for key in required:
        x = _need(v, key, field, "a positive number", where)
        if not _is_number(x) or x <= 0:
            raise SpecError(f"{field}.{key}", x, "a positive number", where)
        out[key] = x
    for key in optional:
        if key not in v:
            continue
        x = v[key]
        ok = isinstance(x, str) and x if key == "name" else (
            _is_int(x) and x >= 1 if key == "default_tp" else _is_number(x) and x > 0)
        if not ok:
            what = "a non-empty string" if key == "name" else "a positive integer" if key == "default_tp" \
                else "a positive number"
            raise SpecError(f"{field}.{key}", x, what, where)
        out[key] = x
    return out


def _gpu(c: dict, field: str, where: str | None) -> str | dict:
    gpu = _need(c, "gpu", field, " | ".join(KNOWN_GPUS) + " or a dict of specs", where)
    if isinstance(gpu, dict):
        return _spec_dict(gpu, f"{field}.gpu", _GPU_KEYS, _GPU_OPT, where)
    if not isinstance(gpu, str) or gpu.lower() not in KNOWN_GPUS:
        raise SpecError(f"{field}.gpu", gpu, " | ".join(KNOWN_GPUS) + " or a dict {" + ", ".join(_GPU_KEYS) + "}",
                        where)
    return gpu.lower()


def _positive(d: dict, key: str, field: str, where: str | None, *, zero_ok: bool = False, default=None):
    """An optional number > 0 (>= 0 with ``zero_ok``); ``default`` when absent."""
    if key not in d or d[key] is None:
        return default
    v = d[key]
    if not _is_number(v) or not (v >= 0 if zero_ok else v > 0) or v != v or v == float("inf"):
        raise SpecError(f"{field}.{key}", v, "a finite number >= 0" if zero_ok else "a finite number > 0", where)
    return float(v)


def _cluster(c: object, where: str | None, base_dir=".") -> ClusterSpec:
    if not isinstance(c, dict):
        raise SpecError("cluster", c, "a mapping with gpus, gpu, gpus_per_node (or classes)", where)
    _check_keys(c, _CLUSTER_KEYS, "cluster", where)
    if c.get("classes") is not None:
        return _classed_cluster(c, where, base_dir)
    gpus = _int(c, "gpus", "cluster", where)
    gpu = _gpu(c, "cluster", where)
    per_node = _int(c, "gpus_per_node", "cluster", where, default=min(8, gpus))
    price = _positive(c, "price_per_hour", "cluster", where, zero_ok=True)
    return ClusterSpec(gpus, gpu, per_node, price)


def _classed_cluster(c: dict, where: str | None, base_dir) -> ClusterSpec:
    for key in ("gpus", "gpu", "gpus_per_node", "price_per_hour"):
        if c.get(key) is not None:
            raise SpecError(f"cluster.{key}", c[key], "absent when cluster.classes is given (each class gives "
                            "its own gpu, count, gpus_per_node, price_per_hour)", where)
    raw = c["classes"]
    if not isinstance(raw, list) or not raw:
        raise SpecError("cluster.classes", raw, "a non-empty list of device classes", where)
    classes = tuple(_device_class(x, f"cluster.classes[{i}]", where, base_dir) for i, x in enumerate(raw))
    seen: dict[str, int] = {}
    for i, k in enumerate(classes):
        if k.name in seen:
            raise SpecError(f"cluster.classes[{i}].name", k.name,
                            f"a unique name (cluster.classes[{seen[k.name]}] has it)", where)
        seen[k.name] = i
    total = sum(k.count for k in classes)
    if total > MAX_COUNT:
        raise SpecError("cluster.classes", total, f"counts summing to at most {MAX_COUNT}", where)
    return ClusterSpec(total, classes[0].gpu, classes[0].gpus_per_node, None, classes)


def _device_class(x: object, field: str, where: str | None, base_dir) -> DeviceClassSpec:
    if not isinstance(x, dict):
        raise SpecError(field, x, "a mapping {name, gpu, count, gpus_per_node, price_per_hour, link, preemptible}",
                        where)
    _check_keys(x, _CLASS_KEYS, field, where)
    name = _need(x, "name", field, "a name of letters, digits, '_', '.', '-'", where)
    if not isinstance(name, str) or not _NAME.match(name):
        raise SpecError(f"{field}.name", name, "a name of letters, digits, '_', '.', '-'", where)
    gpu = _gpu(x, field, where)
    count = _int(x, "count", field, where)
    per_node = _int(x, "gpus_per_node", field, where, default=min(8, count))
    price = _positive(x, "price_per_hour", field, where, zero_ok=True)
    link = None
    if x.get("link") is not None:
        raw = x["link"]
        if not isinstance(raw, dict):
            raise SpecError(f"{field}.link", raw, "a mapping {bandwidth_gbit_s, latency_ms}", where)
        _check_keys(raw, _LINK_KEYS, f"{field}.link", where)
        bw = _positive(raw, "bandwidth_gbit_s", f"{field}.link", where)
        if bw is None:
            raise SpecError(f"{field}.link.bandwidth_gbit_s", "<missing>", "a finite number > 0", where)
        link = LinkSpec(bw, _positive(raw, "latency_ms", f"{field}.link", where, zero_ok=True, default=0.0))
    pre = None
    if x.get("preemptible") is not None:
        pre = _preemption(x["preemptible"], f"{field}.preemptible", count, where, base_dir)
    return DeviceClassSpec(name, gpu, count, per_node, price, link, pre)


def _preemption(raw: object, field: str, count: int, where: str | None, base_dir) -> PreemptionSpec:
    allowed = "a mapping {rate_per_hour: X} or {trace: FILE} (optional replace_s)"
    if not isinstance(raw, dict):
        raise SpecError(field, raw, allowed, where)
    _check_keys(raw, _PREEMPT_KEYS, field, where)
    rate = _positive(raw, "rate_per_hour", field, where, zero_ok=True)
    replace_s = _positive(raw, "replace_s", field, where, zero_ok=True, default=DEFAULT_REPLACE_S)
    path = raw.get("trace")
    if (rate is None) == (path is None):
        raise SpecError(field, raw, "exactly one of rate_per_hour and trace", where)
    if path is None:
        return PreemptionSpec(rate_per_hour=rate, replace_s=replace_s)
    if not isinstance(path, str) or not path:
        raise SpecError(f"{field}.trace", path, "a path to a CSV file of 't_s,device' lines", where)
    resolved = Path(path) if Path(path).is_absolute() else Path(base_dir) / path
    return PreemptionSpec(trace=_preemption_trace(resolved, f"{field}.trace", count, where),
                          trace_path=str(resolved.resolve()), replace_s=replace_s)


def _preemption_trace(path: Path, field: str, count: int, where: str | None) -> tuple[tuple[float, int], ...]:
    """Lines ``t_s,device`` (device: index within the class); '#' comments and a header allowed."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(field, str(path), f"a readable CSV file ({getattr(e, 'strerror', None) or e})",
                        where) from None
    out = []
    for n, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line or line.replace(" ", "").lower() == "t_s,device":
            continue
        parts = [x.strip() for x in line.split(",")]
        try:
            t, dev = float(parts[0]), int(parts[1])
            ok = len(parts) == 2 and t >= 0 and t != float("inf") and 0 <= dev < count
        except (ValueError, IndexError):
            ok = False
        if not ok:
            raise SpecError(f"{field} line {n}", line,
                            f"'t_s,device' with t_s >= 0 seconds and device an index in 0..{count - 1}", where)
        out.append((t, dev))
    return tuple(sorted(out))


def _dist(p: dict, key: str, field: str, base_dir, where, *, role: str | None = None, required: bool = True):
    if key not in p or p[key] is None:
        if required:
            raise SpecError(f"{field}.{key}", "<missing>", "a distribution {dist: ...}", where)
        return None
    return build_distribution(p[key], f"{field}.{key}", base_dir, role or key, where)


def _pipeline(p: object, field: str, cluster: ClusterSpec, base_dir, where: str | None) -> PipelineSpec:
    if not isinstance(p, dict):
        raise SpecError(field, p, "a mapping (a pipeline)", where)
    _check_keys(p, _PIPELINE_KEYS, field, where)
    name = _need(p, "name", field, "a name of letters, digits, '_', '.', '-'", where)
    if not isinstance(name, str) or not _NAME.match(name):
        raise SpecError(f"{field}.name", name, "a name of letters, digits, '_', '.', '-'", where)
    model = _need(p, "model", field, " | ".join(KNOWN_MODELS) + " or a dict of shape figures", where)
    if isinstance(model, dict):
        model = _spec_dict(model, f"{field}.model", _MODEL_KEYS, _MODEL_OPT, where)
    elif not isinstance(model, str) or model.lower() not in KNOWN_MODELS:
        raise SpecError(f"{field}.model", model,
                        " | ".join(KNOWN_MODELS) + " or a dict {" + ", ".join(_MODEL_KEYS) + "}", where)
    else:
        model = model.lower()
    algorithm = _choice(p, "algorithm", field, ALGORITHMS, where, default="grpo")
    mode = _choice(p, "mode", field, MODES, where, default="sync")
    staleness = _int(p, "staleness", field, where, minimum=0, default=0 if mode == "sync" else 1)
    if mode == "sync" and staleness != 0:
        raise SpecError(f"{field}.staleness", staleness, "0 for mode sync (use mode: async for a bound > 0)", where)
    counts = {k: _int(p, k, field, where) for k in ("prompts_per_step", "samples_per_prompt", "max_response_len",
                                                     "steps")}
    prompt_len = _dist(p, "prompt_len", field, base_dir, where)
    response_len = _dist(p, "response_len", field, base_dir, where)
    turns = _dist(p, "turns", field, base_dir, where, required=False)
    agentic = {}
    for key in ("tool_latency_s", "observation_len"):
        if turns is None:
            if p.get(key) is not None:
                raise SpecError(f"{field}.{key}", p[key], f"only with turns (an agentic pipeline); add {field}.turns",
                                where)
            agentic[key] = None
        else:
            agentic[key] = _dist(p, key, field, base_dir, where)
    reward = _reward(p.get("reward"), f"{field}.reward", base_dir, where)
    gpus = _int(p, "gpus", field, where, default=None)
    tp = _int(p, "rollout_tp", field, where, default=None)
    if gpus is not None and gpus > cluster.gpus:
        raise SpecError(f"{field}.gpus", gpus, f"at most cluster.gpus ({cluster.gpus})", where)
    if tp is not None:
        if gpus is not None and gpus % tp:
            raise SpecError(f"{field}.gpus", gpus, f"a multiple of rollout_tp ({tp})", where)
        if tp > cluster.gpus:
            raise SpecError(f"{field}.rollout_tp", tp, f"at most cluster.gpus ({cluster.gpus})", where)
        prof = model_profile(model, f"{field}.model")
        if not prof.fits_tp(tp):
            raise SpecError(f"{field}.rollout_tp", tp,
                            f"a width vLLM can shard {prof.name} over ({prof.attention_heads} attention heads, "
                            f"{prof.kv_heads} KV heads): one of {prof.tp_widths(max(tp, 8))}", where)
    rho = p.get("group_correlation")
    rho = 0.0 if rho is None else rho
    if not _is_number(rho) or not 0.0 <= rho < 1.0:
        raise SpecError(f"{field}.group_correlation", rho,
                        "a number in [0, 1): the correlation of response lengths among one prompt's samples "
                        "(0 = independent)", where)
    return PipelineSpec(
        name=name, model=model, algorithm=algorithm, mode=mode, staleness=staleness,
        prompts_per_step=counts["prompts_per_step"], samples_per_prompt=counts["samples_per_prompt"],
        max_response_len=counts["max_response_len"], prompt_len=prompt_len, response_len=response_len,
        turns=turns, tool_latency_s=agentic["tool_latency_s"], observation_len=agentic["observation_len"],
        reward=reward, steps=counts["steps"], gpus=gpus, rollout_tp=tp, group_correlation=float(rho),
        train_offload=_choice(p, "train_offload", field, TRAIN_OFFLOAD, where, default="none"),
    )


def _reward(r: object, field: str, base_dir, where: str | None) -> RewardSpec:
    if r is None:
        return RewardSpec("rule", default_reward_latency("rule"))
    if not isinstance(r, dict):
        raise SpecError(field, r, "a mapping {kind: rule | sandbox | model, latency_s: distribution}", where)
    _check_keys(r, _REWARD_KEYS, field, where)
    kind = _choice(r, "kind", field, REWARD_KINDS, where, default="rule")
    if r.get("latency_s") is None:
        lat = default_reward_latency(kind)
        if lat is None:
            raise SpecError(f"{field}.latency_s", "<missing>",
                            f"a distribution (required for kind {kind}: it depends on the reward model)", where)
    else:
        lat = build_distribution(r["latency_s"], f"{field}.latency_s", base_dir, "reward_latency_s", where)
    return RewardSpec(kind, lat)


def _check_shares(pipelines: tuple[PipelineSpec, ...], cluster: ClusterSpec, where: str | None) -> None:
    explicit = [p.gpus for p in pipelines]
    used = 0
    for i, g in enumerate(explicit):
        if g is not None:
            used += g
            if used > cluster.gpus:
                raise SpecError(f"pipelines[{i}].gpus", g,
                                f"shares summing to at most cluster.gpus ({cluster.gpus}); "
                                f"pipelines before it already take {used - g}", where)
    shares = _shares(explicit, cluster.gpus)
    for i, (g, s) in enumerate(zip(explicit, shares)):
        if g is None and s < 1:
            raise SpecError(f"pipelines[{i}].gpus", "<missing>",
                            f"an explicit share: the equal split of the {cluster.gpus - used} device(s) the "
                            f"explicit shares leave gives it none", where)
        p = pipelines[i]
        if g is None and p.rollout_tp is not None and s < p.rollout_tp:
            raise SpecError(f"pipelines[{i}].rollout_tp", p.rollout_tp,
                            f"at most its default share of {s} device(s); or give gpus explicitly", where)
