"""verl 0.9.x: observe every worker-group method call (the v0 trainer's choke point).

Why: the v0 trainer (``trainer.use_v1=false``, ``verl/trainer/ppo/ray_trainer.py``) has no
per-stage extension points, but every call it makes on a worker group (``compute_log_prob``,
``update_actor``, ``infer_batch``, ...) is a ``Functor`` built by the module-level
``func_generator`` of ``verl/single_controller/ray/base.py:49-67``, which each
``RayWorkerGroup`` looks up when it binds its methods (``base.py:494``, ``761``, ``776``).

What: ``func_generator`` is replaced by a wrapper that builds the same ``Functor`` and calls
each registered observer before and after it runs: ``observer(wg, method_name, phase,
args, kwargs, output)`` with phase ``"start"``/``"end"``. With no observer a call costs one
list check. Patch before any worker group exists (the entry point does, at import of
``base``). Guarded: verl 0.9.x, and ``func_generator``'s signature as read from 0.9.1.
"""

from __future__ import annotations

import inspect
import sys
from typing import Callable

from jigsaw_plugin.adapters.verl.version import check_version

__all__ = ["TARGET", "EXPECTED_PARAMS", "install", "add_observer", "remove_observer", "observers"]

TARGET = "verl.single_controller.ray.base"
EXPECTED_PARAMS = ("self", "method_name", "dispatch_fn", "collect_fn", "execute_fn", "blocking")
_observers: list[Callable] = []


def add_observer(fn: Callable) -> None:
    if fn not in _observers:
        _observers.append(fn)


def remove_observer(fn: Callable) -> None:
    if fn in _observers:
        _observers.remove(fn)


def observers() -> list[Callable]:
    return list(_observers)


def _notify(*args) -> None:
    for fn in list(_observers):
        try:
            fn(*args)
        except Exception as e:  # an observer must never break verl's call
            print(f"jigsaw-plugin: worker-group observer {fn!r} failed: {e!r}", file=sys.stderr)


def wrap(original: Callable) -> Callable:
    """A ``func_generator`` that builds ``original``'s Functor and reports around it."""

    def func_generator(self, method_name, dispatch_fn, collect_fn, execute_fn, blocking):
        inner = original(self, method_name, dispatch_fn, collect_fn, execute_fn, blocking)
        wg = self

        def __call__(this, *args, **kwargs):
            if not _observers:
                return inner(*args, **kwargs)
            _notify(wg, method_name, "start", args, kwargs, None)
            output = inner(*args, **kwargs)
            _notify(wg, method_name, "end", args, kwargs, output)
            return output

        # The class is named after the method, as verl's own Functor is (observability).
        return type(method_name, (type(inner),), {"__call__": __call__})()

    func_generator.__wrapped__ = original
    func_generator._jigsaw = True
    return func_generator


def install(module, verl_version: str | None) -> bool:
    """Replace ``module.func_generator``; ``False`` if already done. Raises if unsupported."""
    check_version(verl_version, what="jigsaw patch of func_generator")
    current = module.func_generator
    if getattr(current, "_jigsaw", False):
        return False
    params = tuple(inspect.signature(current).parameters)
    if params != EXPECTED_PARAMS:
        raise RuntimeError(
            f"jigsaw patch of {TARGET}.func_generator: expected parameters {EXPECTED_PARAMS}, "
            f"found {params}; this verl build differs from 0.9.1"
        )
    module.func_generator = wrap(current)
    return True
