"""Run code around a module's first import: before its body runs, or right after.

The entry point loads in every verl process (driver, TaskRunner, each worker) from inside
``import verl``. Importing verl's trainer modules there would cost seconds per worker and
risk circular imports, so the adapter waits for verl itself to import them:

- :func:`when_imported` calls ``callback(module)`` once the module has finished importing
  (at once if it already has);
- :func:`while_importing` runs the module's body inside a context manager (for a patch that
  must be in place while the body runs, e.g. a version probe at import time).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import sys
import threading
from typing import Callable

__all__ = ["when_imported", "while_importing", "pending"]

_after: dict[str, list[Callable]] = {}
_around: dict[str, list[Callable]] = {}
_lock = threading.RLock()


class _Loader(importlib.abc.Loader):
    """Delegates to the real loader; runs the module's hooks around ``exec_module``."""

    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        name = module.__name__
        with _lock:
            around = _around.pop(name, [])
        with contextlib.ExitStack() as stack:
            for factory in around:
                stack.enter_context(factory())
            self.inner.exec_module(module)
        with _lock:
            after = _after.pop(name, [])
        for cb in after:
            cb(module)

    def __getattr__(self, name):  # get_code, get_source, is_package, ... of the real loader
        return getattr(self.inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _after and fullname not in _around:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and not isinstance(spec.loader, _Loader):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


_finder = _Finder()


def _install() -> None:
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def when_imported(name: str, callback: Callable) -> None:
    """Call ``callback(module)`` once ``name`` has been imported (now, if it already is)."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    with _lock:
        _after.setdefault(name, []).append(callback)
        _install()


def while_importing(name: str, factory: Callable) -> bool:
    """Run ``name``'s module body inside ``factory()`` (a context manager factory).

    Returns ``False`` if the module is already imported (too late to act).
    """
    if name in sys.modules:
        return False
    with _lock:
        _around.setdefault(name, []).append(factory)
        _install()
    return True


def pending() -> list[str]:
    """Modules with hooks still waiting for their import (for diagnostics)."""
    with _lock:
        return sorted(set(_after) | set(_around))
