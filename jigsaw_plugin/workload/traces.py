"""PolyTrace readers: the values a ``trace`` distribution replays, by the role of its field.

PolyTrace files are JSON Lines, optionally gzip-compressed, one record per line. Two record
shapes are understood (records with ``validate: true`` are skipped, and a record that holds
nothing for a role is ignored for that role, so a folder may mix files):

* verl-style (verl/, verl-video/, rllm/packed_lengths_*): ``input`` prompt tokens, ``output``
  list of response lengths (one per sample);
* search_r1 multi-turn: ``prompt_len``, ``turns`` (each with ``completion_tokens``),
  ``tool_calls`` (each with ``latency_s`` and ``response_token_len``), ``turn_count``;
* rllm reward timings: ``reward_time_s`` for a batch of ``batch_size`` samples.

What a trace yields depends on the field it is used for (its role):

=================  ==================================================================
role               values
=================  ==================================================================
prompt_len         verl ``input``; search_r1 ``prompt_len``
response_len       verl ``output`` items; search_r1 ``turns[].completion_tokens``
turns              search_r1 ``turn_count`` (else ``len(turns)``)
tool_latency_s     search_r1 ``tool_calls[].latency_s``
observation_len    search_r1 ``tool_calls[].response_token_len``
reward_latency_s   rllm ``reward_time_s / batch_size`` (seconds per sample)
=================  ==================================================================

Loaded values are cached in-process per file and per (resolved path, role).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from pathlib import Path

import numpy as np

from jigsaw_plugin.errors import SpecError

__all__ = [
    "ROLES",
    "ROLE_FIELDS",
    "TRACE_SUFFIXES",
    "resolve_trace_path",
    "trace_files",
    "read_trace_file",
    "load_trace",
    "clear_trace_cache",
]

ROLE_FIELDS: dict[str, str] = {
    "prompt_len": "verl 'input' or search_r1 'prompt_len'",
    "response_len": "verl 'output' or search_r1 'turns[].completion_tokens'",
    "turns": "search_r1 'turn_count'",
    "tool_latency_s": "search_r1 'tool_calls[].latency_s'",
    "observation_len": "search_r1 'tool_calls[].response_token_len'",
    "reward_latency_s": "rllm 'reward_time_s' / 'batch_size'",
}
ROLES = tuple(ROLE_FIELDS)
TRACE_SUFFIXES = (".jsonl", ".jsonl.gz")

_VAR = re.compile(r"\$(?:\{([^}]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_FILE_CACHE: dict[tuple[str, int, int], dict[str, np.ndarray]] = {}
_ROLE_CACHE: dict[tuple[str, str], np.ndarray] = {}


def clear_trace_cache() -> None:
    """Forget every loaded trace (tests; long-lived processes whose files changed)."""
    _FILE_CACHE.clear()
    _ROLE_CACHE.clear()


def resolve_trace_path(path: str, base_dir: str | Path = ".", field: str = "trace.path",
                       where: str | None = None) -> Path:
    """Expand ``$VARS`` and ``~``, resolve a relative path against ``base_dir``; must exist."""
    for m in _VAR.finditer(path):
        name = m.group(1) if m.group(1) is not None else m.group(2)
        if name not in os.environ:
            raise SpecError(field, path, f"a readable path; environment variable ${name} is not set "
                                         f"(e.g. export {name}=../shared/traces/polytrace)", where)
    p = Path(os.path.expanduser(os.path.expandvars(path)))
    if not p.is_absolute():
        p = Path(base_dir) / p
    p = p.resolve()
    if not p.exists():
        raise SpecError(field, path, f"an existing directory or .jsonl/.jsonl.gz file (resolved to {p})", where)
    return p


def trace_files(path: Path, field: str = "trace.path", where: str | None = None) -> list[Path]:
    """The trace files a path names: itself, or a directory's *.jsonl(.gz) (not recursive)."""
    if path.is_dir():
        files = sorted(f for f in path.iterdir() if f.is_file() and f.name.endswith(TRACE_SUFFIXES))
        if not files:
            raise SpecError(field, str(path), "a directory holding *.jsonl or *.jsonl.gz files", where)
        return files
    if not path.name.endswith(TRACE_SUFFIXES):
        raise SpecError(field, str(path), "a directory or a .jsonl / .jsonl.gz file", where)
    return [path]


def _bad(field: str, path: Path, why: str, where: str | None) -> SpecError:
    return SpecError(field, str(path), f"a readable PolyTrace JSON Lines file ({why})", where)


def _text(path: Path, field: str, where: str | None) -> str:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise _bad(field, path, f"cannot read: {e.strerror or e}", where) from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise _bad(field, path, f"broken gzip: {e}", where) from None
    elif path.name.endswith(".gz"):
        raise _bad(field, path, "named .gz but not gzip-compressed", where)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad(field, path, "not UTF-8 text", where) from None


def read_trace_file(path: Path, field: str = "trace.path", where: str | None = None) -> dict[str, np.ndarray]:
    """Every role's values in one file (cached by path, mtime and size)."""
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    hit = _FILE_CACHE.get(key)
    if hit is not None:
        return hit
    out: dict[str, list[float]] = {r: [] for r in ROLES}
    for lineno, line in enumerate(_text(path, field, where).splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise _bad(field, path, f"line {lineno}: invalid JSON: {e.msg}", where) from None
        if not isinstance(rec, dict):
            raise _bad(field, path, f"line {lineno}: not a JSON object", where)
        if rec.get("validate") is True:
            continue
        try:
            _extract(rec, out)
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise _bad(field, path, f"line {lineno}: malformed record: {e!r}", where) from None
    arrays = {}
    for role, vals in out.items():
        a = np.asarray(vals, dtype=np.float64)
        if not np.all(np.isfinite(a)):
            raise _bad(field, path, f"non-finite {role} values", where)
        a.setflags(write=False)
        arrays[role] = a
    _FILE_CACHE[key] = arrays
    return arrays


def _extract(rec: dict, out: dict[str, list[float]]) -> None:
    if "output" in rec:  # verl-style: one record per prompt
        out["response_len"].extend(float(x) for x in rec["output"])
        if "input" in rec:
            out["prompt_len"].append(float(rec["input"]))
    if isinstance(rec.get("turns"), list):  # search_r1 multi-turn trajectory
        turns = rec["turns"]
        out["response_len"].extend(float(t["completion_tokens"]) for t in turns)
        out["turns"].append(float(rec.get("turn_count", len(turns))))
        if "prompt_len" in rec:
            out["prompt_len"].append(float(rec["prompt_len"]))
        for c in rec.get("tool_calls") or ():
            out["tool_latency_s"].append(float(c["latency_s"]))
            out["observation_len"].append(float(c["response_token_len"]))
    if "reward_time_s" in rec:  # rllm reward timings: one batch per record
        bs = float(rec.get("batch_size", 1))
        if bs <= 0:
            raise ValueError(f"batch_size {bs}")
        out["reward_latency_s"].append(float(rec["reward_time_s"]) / bs)


def load_trace(path: Path, role: str, field: str = "trace.path", where: str | None = None) -> np.ndarray:
    """The values (read-only float64) that ``path`` (a resolved file or directory) holds for ``role``."""
    if role not in ROLE_FIELDS:
        raise SpecError(field, role, ", ".join(ROLES), where)
    key = (str(path), role)
    hit = _ROLE_CACHE.get(key)
    if hit is not None:
        return hit
    files = trace_files(path, field, where)
    parts = [read_trace_file(f, field, where)[role] for f in files]
    values = np.concatenate(parts) if parts else np.empty(0)
    if values.size == 0:
        raise SpecError(field, str(path), f"trace records with {ROLE_FIELDS[role]} for a {role} field "
                                          f"(none in {len(files)} file(s))", where)
    values.setflags(write=False)
    _ROLE_CACHE[key] = values
    return values
