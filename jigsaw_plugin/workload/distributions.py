"""Distributions of the workload spec: parsing, validation and vectorised sampling.

A distribution is written in the YAML as a mapping with a ``dist`` key (or a bare number,
shorthand for ``{dist: const, value: N}``)::

    {dist: lognormal, median: 450, sigma: 0.9, min: 1, max: 20480}

Every kind accepts optional ``min``/``max`` clipping. ``sample(rng, n)`` draws ``n`` values
as one float64 array using only ``rng`` (no per-sample Python loop: this is a hot path).
"""

from __future__ import annotations

import difflib
import json
import math
import numbers
from pathlib import Path

import numpy as np

from jigsaw_plugin.errors import SpecError

__all__ = [
    "DISTRIBUTIONS",
    "Distribution",
    "Const",
    "Uniform",
    "Normal",
    "Lognormal",
    "Mixture",
    "Categorical",
    "Quantiles",
    "Trace",
    "build_distribution",
]

DISTRIBUTIONS = ("const", "uniform", "normal", "lognormal", "mixture", "categorical", "quantiles", "trace")

# kind -> (required parameters, optional parameters); every kind also takes dist, min, max.
_PARAMS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "const": (("value",), ()),
    "uniform": (("low", "high"), ()),
    "normal": (("mean", "std"), ()),
    "lognormal": (("median", "sigma"), ()),
    "mixture": (("components",), ()),
    "categorical": (("values",), ("weights",)),
    "quantiles": (("q", "values"), ()),
    "trace": (("path",), ("scale",)),
}
_MC_DRAWS = 1 << 16


# --------------------------------------------------------------------------- validation helpers
# (shared with spec.py)


def _is_number(x: object) -> bool:
    if not isinstance(x, numbers.Real) or isinstance(x, (bool, np.bool_)):
        return False
    try:
        return math.isfinite(float(x))
    except OverflowError:  # an integer too big for a float (YAML reads 400 digits as an int)
        return False


def _is_int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def _check_keys(d: dict, allowed: tuple[str, ...], field: str, where: str | None) -> None:
    """Unknown keys are errors; the message lists the known keys and a close match."""
    for key in d:
        if key not in allowed:
            hint = difflib.get_close_matches(str(key), allowed, n=1)
            extra = f" (did you mean {hint[0]!r}?)" if hint else ""
            name = str(key) if str(key).strip() else repr(key)  # an empty or blank key is still named
            path = f"{field}.{name}" if field else name
            raise SpecError(path, key, f"known keys: {', '.join(allowed)}{extra}", where)


def _required(d: dict, key: str, field: str, allowed: str, where: str | None) -> object:
    if key not in d or d[key] is None:
        raise SpecError(f"{field}.{key}", "<missing>", allowed, where)
    return d[key]


def _number(x: object, field: str, where: str | None, *, positive: bool = False,
            nonneg: bool = False) -> float:
    if not _is_number(x):
        what = "a positive number" if positive else "a number >= 0" if nonneg else "a finite number"
        if isinstance(x, str) and _parses_as_float(x):
            what += f" (YAML reads {x} as text: write it as 1.0e+3 or 1000)"
        raise SpecError(field, x, what, where)
    v = float(x)
    if positive and v <= 0:
        raise SpecError(field, x, "a positive number", where)
    if nonneg and v < 0:
        raise SpecError(field, x, "a number >= 0", where)
    return v


def _parses_as_float(x: str) -> bool:
    try:
        float(x)
    except ValueError:
        return False
    return True


def _number_list(x: object, field: str, where: str | None, *, min_len: int = 1,
                 nonneg: bool = False) -> np.ndarray:
    if not isinstance(x, (list, tuple)) or len(x) < min_len:
        raise SpecError(field, x, f"a list of at least {min_len} number(s)", where)
    for i, v in enumerate(x):
        _number(v, f"{field}[{i}]", where, nonneg=nonneg)
    return np.asarray([float(v) for v in x], dtype=np.float64)


def _plain(x: float) -> int | float:
    """A float as the plainest Python number (ints stay ints in to_dict)."""
    return int(x) if float(x).is_integer() and abs(x) < 2**53 else float(x)


# --------------------------------------------------------------------------- distributions


class Distribution:
    """A one-dimensional distribution with optional clipping to ``[lo, hi]``."""

    kind = ""

    def __init__(self, lo: float | None = None, hi: float | None = None):
        self.lo = lo
        self.hi = hi
        self._mean_cache: float | None = None

    # subclasses implement _draw (unclipped) and _params; _exact_mean where cheap
    def _draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        raise NotImplementedError

    def _params(self) -> dict:
        raise NotImplementedError

    def _exact_mean(self) -> float | None:
        """The unclipped mean, or None where it has no cheap closed form."""
        return None

    @property
    def clipped(self) -> bool:
        return self.lo is not None or self.hi is not None

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` draws as a float64 array, clipped to ``[min, max]``."""
        n = int(n)
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        x = np.asarray(self._draw(rng, n), dtype=np.float64)
        if self.clipped:
            x = np.clip(x, self.lo, self.hi)
        return x

    def mean(self) -> float:
        """The mean (closed form where unclipped; else a fixed-seed Monte Carlo estimate)."""
        if self._mean_cache is None:
            m = None if self.clipped else self._exact_mean()
            if m is None:
                m = float(self.sample(np.random.default_rng(0x5EED), _MC_DRAWS).mean())
            self._mean_cache = float(m)
        return self._mean_cache

    def to_dict(self) -> dict:
        """The spec form (``parse(to_dict())`` builds an equal distribution)."""
        d = {"dist": self.kind, **self._params()}
        if self.lo is not None:
            d["min"] = _plain(self.lo)
        if self.hi is not None:
            d["max"] = _plain(self.hi)
        return d

    def describe(self) -> dict:
        """The spec form plus the mean (for reports)."""
        return {**self.to_dict(), "mean": self.mean()}

    def _key(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Distribution) and type(other) is type(self) and other._key() == self._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items() if k != "dist")
        return f"{type(self).__name__}({args})"


class Const(Distribution):
    kind = "const"

    def __init__(self, value: float, lo=None, hi=None):
        super().__init__(lo, hi)
        self.value = float(value)

    def _draw(self, rng, n):
        return np.full(n, self.value, dtype=np.float64)

    def _exact_mean(self):
        return self.value

    def mean(self) -> float:
        return float(np.clip(self.value, self.lo, self.hi)) if self.clipped else self.value

    def _params(self):
        return {"value": _plain(self.value)}


class Uniform(Distribution):
    kind = "uniform"

    def __init__(self, low: float, high: float, lo=None, hi=None):
        super().__init__(lo, hi)
        self.low, self.high = float(low), float(high)

    def _draw(self, rng, n):
        return rng.uniform(self.low, self.high, n)

    def _exact_mean(self):
        return 0.5 * (self.low + self.high)

    def _params(self):
        return {"low": _plain(self.low), "high": _plain(self.high)}


class Normal(Distribution):
    kind = "normal"

    def __init__(self, mean: float, std: float, lo=None, hi=None):
        super().__init__(lo, hi)
        self.mu, self.std = float(mean), float(std)

    def _draw(self, rng, n):
        return rng.normal(self.mu, self.std, n)

    def _exact_mean(self):
        return self.mu

    def _params(self):
        return {"mean": _plain(self.mu), "std": _plain(self.std)}


class Lognormal(Distribution):
    """``median * exp(sigma * Z)``: ``log X ~ Normal(log median, sigma)``."""

    kind = "lognormal"

    def __init__(self, median: float, sigma: float, lo=None, hi=None):
        super().__init__(lo, hi)
        self.median, self.sigma = float(median), float(sigma)
        self._mu = math.log(self.median)

    def _draw(self, rng, n):
        return rng.lognormal(self._mu, self.sigma, n)

    def _exact_mean(self):
        return self.median * math.exp(0.5 * self.sigma**2)

    def _params(self):
        return {"median": _plain(self.median), "sigma": _plain(self.sigma)}


class Mixture(Distribution):
    """Pick a component with probability weight / sum(weights), then draw from it."""

    kind = "mixture"

    def __init__(self, weights, components, lo=None, hi=None):
        super().__init__(lo, hi)
        self.weights = np.asarray(weights, dtype=np.float64)
        self.components = tuple(components)
        self._cum = np.cumsum(self.weights / self.weights.sum())

    def _draw(self, rng, n):
        out = np.empty(n, dtype=np.float64)
        idx = np.minimum(np.searchsorted(self._cum, rng.random(n), side="right"), len(self.components) - 1)
        for j, comp in enumerate(self.components):
            mask = idx == j
            k = int(np.count_nonzero(mask))
            if k:
                out[mask] = comp.sample(rng, k)
        return out

    def _exact_mean(self):
        p = self.weights / self.weights.sum()
        return float(sum(pj * c.mean() for pj, c in zip(p, self.components)))

    def _params(self):
        return {"components": [{"weight": _plain(w), **c.to_dict()} for w, c in zip(self.weights, self.components)]}


class Categorical(Distribution):
    kind = "categorical"

    def __init__(self, values, weights=None, lo=None, hi=None):
        super().__init__(lo, hi)
        self.values = np.asarray(values, dtype=np.float64)
        self.weights = None if weights is None else np.asarray(weights, dtype=np.float64)
        w = np.ones(len(self.values)) if self.weights is None else self.weights
        self.p = w / w.sum()
        self._cum = np.cumsum(self.p)

    def _draw(self, rng, n):
        idx = np.minimum(np.searchsorted(self._cum, rng.random(n), side="right"), len(self.values) - 1)
        return self.values[idx]

    def mean(self) -> float:
        return float(np.dot(self.p, np.clip(self.values, self.lo, self.hi) if self.clipped else self.values))

    def _params(self):
        d = {"values": [_plain(v) for v in self.values]}
        if self.weights is not None:
            d["weights"] = [_plain(w) for w in self.weights]
        return d


class Quantiles(Distribution):
    """Piecewise-linear inverse CDF through the points ``(q[i], values[i])``."""

    kind = "quantiles"

    def __init__(self, q, values, lo=None, hi=None):
        super().__init__(lo, hi)
        self.q = np.asarray(q, dtype=np.float64)
        self.values = np.asarray(values, dtype=np.float64)

    def _draw(self, rng, n):
        return np.interp(rng.random(n), self.q, self.values)

    def _exact_mean(self):
        return float(np.sum(np.diff(self.q) * 0.5 * (self.values[1:] + self.values[:-1])))

    def _params(self):
        return {"q": [_plain(v) for v in self.q], "values": [_plain(v) for v in self.values]}


class Trace(Distribution):
    """Empirical draws (with replacement) from the values a PolyTrace holds for one role."""

    kind = "trace"

    def __init__(self, path: Path, role: str, values: np.ndarray, scale: float = 1.0, lo=None, hi=None):
        super().__init__(lo, hi)
        self.path = Path(path)
        self.role = role
        self.values = values
        self.scale = float(scale)

    def _draw(self, rng, n):
        x = self.values[rng.integers(0, len(self.values), n)]
        return x * self.scale if self.scale != 1.0 else x.astype(np.float64, copy=True)

    def mean(self) -> float:
        v = self.values * self.scale
        return float((np.clip(v, self.lo, self.hi) if self.clipped else v).mean())

    def _params(self):
        return {"path": str(self.path), "scale": _plain(self.scale)}

    def _key(self) -> str:
        return super()._key() + "|" + self.role

    def describe(self) -> dict:
        v = np.clip(self.values * self.scale, self.lo, self.hi) if self.clipped else self.values * self.scale
        p50, p90, p99 = np.quantile(v, [0.5, 0.9, 0.99])
        return {**self.to_dict(), "role": self.role, "n_values": int(len(v)), "mean": float(v.mean()),
                "p50": float(p50), "p90": float(p90), "p99": float(p99), "max": float(v.max())}


# --------------------------------------------------------------------------- parsing


def build_distribution(d: object, field: str, base_dir: str | Path = ".", role: str | None = None,
                       where: str | None = None) -> Distribution:
    """Validate a distribution's spec and build it.

    ``field`` is the dotted path used in errors; ``base_dir`` resolves a relative trace
    path; ``role`` (one of ``traces.ROLES``) says which trace values a ``trace`` yields;
    ``where`` names the file. Every problem raises :class:`SpecError`.
    """
    if _is_number(d):
        return Const(float(d))
    if not isinstance(d, dict):
        raise SpecError(field, d, f"a distribution: a mapping with dist: {' | '.join(DISTRIBUTIONS)}, or a number",
                        where)
    kind = _required(d, "dist", field, " | ".join(DISTRIBUTIONS), where)
    if not isinstance(kind, str) or kind not in _PARAMS:
        raise SpecError(f"{field}.dist", kind, ", ".join(DISTRIBUTIONS), where)
    req, opt = _PARAMS[kind]
    _check_keys(d, ("dist", *req, *opt, "min", "max"), field, where)
    for key in req:
        _required(d, key, field, f"{kind} needs {', '.join(req)}", where)
    lo = None if d.get("min") is None else _number(d["min"], f"{field}.min", where)
    hi = None if d.get("max") is None else _number(d["max"], f"{field}.max", where)
    if lo is not None and hi is not None and lo > hi:
        raise SpecError(f"{field}.min", d["min"], f"<= max ({d['max']})", where)
    return _BUILDERS[kind](d, field, base_dir, role, where, lo, hi)


def _const(d, field, base_dir, role, where, lo, hi):
    return Const(_number(d["value"], f"{field}.value", where), lo, hi)


def _uniform(d, field, base_dir, role, where, lo, hi):
    low = _number(d["low"], f"{field}.low", where)
    high = _number(d["high"], f"{field}.high", where)
    if low > high:
        raise SpecError(f"{field}.low", d["low"], f"<= high ({d['high']})", where)
    return Uniform(low, high, lo, hi)


def _normal(d, field, base_dir, role, where, lo, hi):
    return Normal(_number(d["mean"], f"{field}.mean", where), _number(d["std"], f"{field}.std", where, nonneg=True),
                  lo, hi)


def _lognormal(d, field, base_dir, role, where, lo, hi):
    return Lognormal(_number(d["median"], f"{field}.median", where, positive=True),
                     _number(d["sigma"], f"{field}.sigma", where, nonneg=True), lo, hi)


def _mixture(d, field, base_dir, role, where, lo, hi):
    comps = d["components"]
    f = f"{field}.components"
    if not isinstance(comps, list) or not comps:
        raise SpecError(f, comps, "a non-empty list of {weight, dist, ...} mappings", where)
    weights, dists = [], []
    for i, c in enumerate(comps):
        cf = f"{f}[{i}]"
        if not isinstance(c, dict):
            raise SpecError(cf, c, "a mapping {weight: W, dist: ..., ...}", where)
        weights.append(_number(_required(c, "weight", cf, "a number >= 0", where), f"{cf}.weight", where,
                               nonneg=True))
        dists.append(build_distribution({k: v for k, v in c.items() if k != "weight"}, cf, base_dir, role, where))
    if sum(weights) <= 0:
        raise SpecError(f"{f}[0].weight", weights[0], "weights >= 0 with a positive sum", where)
    return Mixture(weights, dists, lo, hi)


def _categorical(d, field, base_dir, role, where, lo, hi):
    values = _number_list(d["values"], f"{field}.values", where)
    weights = None
    if d.get("weights") is not None:
        weights = _number_list(d["weights"], f"{field}.weights", where, nonneg=True)
        if len(weights) != len(values):
            raise SpecError(f"{field}.weights", d["weights"], f"a list as long as values ({len(values)})", where)
        if weights.sum() <= 0:
            raise SpecError(f"{field}.weights", d["weights"], "weights >= 0 with a positive sum", where)
    return Categorical(values, weights, lo, hi)


def _quantiles(d, field, base_dir, role, where, lo, hi):
    q = _number_list(d["q"], f"{field}.q", where, min_len=2)
    values = _number_list(d["values"], f"{field}.values", where, min_len=2)
    if q[0] != 0.0 or q[-1] != 1.0 or np.any(np.diff(q) <= 0):
        raise SpecError(f"{field}.q", d["q"], "strictly increasing probabilities from 0 to 1", where)
    if len(values) != len(q):
        raise SpecError(f"{field}.values", d["values"], f"a list as long as q ({len(q)})", where)
    if np.any(np.diff(values) < 0):
        raise SpecError(f"{field}.values", d["values"], "non-decreasing values (an inverse CDF)", where)
    return Quantiles(q, values, lo, hi)


def _trace(d, field, base_dir, role, where, lo, hi):
    from jigsaw_plugin.workload import traces  # traces imports this module's helpers

    path = d["path"]
    if not isinstance(path, (str, Path)) or not str(path):
        raise SpecError(f"{field}.path", path, "a directory or .jsonl/.jsonl.gz file path", where)
    scale = 1.0 if d.get("scale") is None else _number(d["scale"], f"{field}.scale", where, positive=True)
    if role not in traces.ROLES:
        raise SpecError(f"{field}.dist", "trace",
                        f"trace only for the fields {', '.join(traces.ROLE_FIELDS)}", where)
    resolved = traces.resolve_trace_path(str(path), base_dir, f"{field}.path", where)
    values = traces.load_trace(resolved, role, f"{field}.path", where)
    return Trace(resolved, role, values, scale, lo, hi)


_BUILDERS = {
    "const": _const,
    "uniform": _uniform,
    "normal": _normal,
    "lognormal": _lognormal,
    "mixture": _mixture,
    "categorical": _categorical,
    "quantiles": _quantiles,
    "trace": _trace,
}
