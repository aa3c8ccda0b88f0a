"""The pluggy PluginManager: hookspecs, default plugins, third-party entry points.

pytest's model: jigsaw's own features are ordinary plugins (``DEFAULT_PLUGINS``), third
parties add theirs through the entry-point group ``jigsaw_plugin``, and a plugin that
implements a hook that does not exist fails at registration, not silently at run time.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import inspect
import os
from typing import Any

import pluggy

from jigsaw_plugin import hookspecs
from jigsaw_plugin.hookspecs import HOOK_NAMES, PROJECT

__all__ = [
    "DEFAULT_PLUGINS",
    "ENTRY_POINT_GROUP",
    "DISABLE_AUTOLOAD_ENV",
    "PluginRegistrationError",
    "JigsawPluginManager",
    "get_plugin_manager",
    "register",
    "call",
    "Emitter",
]

#: Import paths of the plugins every manager registers (built-in features). Extend here.
DEFAULT_PLUGINS: list[str] = ["jigsaw_plugin.predict.default_plugin"]  # the length predictor

ENTRY_POINT_GROUP = PROJECT
#: Set to a non-empty value to skip entry-point plugins (a broken one blocks every run).
DISABLE_AUTOLOAD_ENV = "JIGSAW_DISABLE_PLUGIN_AUTOLOAD"


class PluginRegistrationError(pluggy.PluginValidationError):
    """A plugin does not fit the hook contract (unknown hook, unknown argument)."""

    def __init__(self, plugin: object, plugin_name: str, message: str):
        self.plugin_name = plugin_name
        super().__init__(plugin, message)


class JigsawPluginManager(pluggy.PluginManager):
    """A PluginManager that also treats unmarked ``jigsaw_*`` functions as hook impls.

    As in pytest: a misspelt hook name on a plugin is then caught by ``check_pending``
    even when its author forgot the ``@hookimpl`` marker.
    """

    def parse_hookimpl_opts(self, plugin: object, name: str):
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None and name.startswith("jigsaw_"):
            method = getattr(plugin, name, None)
            if inspect.isroutine(method):
                return {}  # pluggy fills in the defaults
        return opts


def _label(name: str, plugin: object) -> str:
    """pluggy names unnamed plugins by ``id()``; say what the object is instead."""
    if name.isdigit():
        return f"{type(plugin).__module__}.{type(plugin).__qualname__} object"
    return name


def _unknown_hook_message(pm: pluggy.PluginManager) -> tuple[object, str, str] | None:
    """Name the first plugin implementing a hook that has no spec, with a suggestion."""
    for hook_name, caller in sorted(vars(pm.hook).items()):
        if not isinstance(caller, pluggy.HookCaller) or caller.has_spec():
            continue
        for impl in caller.get_hookimpls():
            if impl.optionalhook:
                continue
            close = difflib.get_close_matches(hook_name, HOOK_NAMES, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            label = _label(impl.plugin_name, impl.plugin)
            msg = (
                f"plugin {label!r} implements unknown hook {hook_name!r}{hint}; "
                f"valid hooks: {', '.join(HOOK_NAMES)}"
            )
            return impl.plugin, label, msg
    return None


def _check_pending(pm: pluggy.PluginManager) -> None:
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as e:
        found = _unknown_hook_message(pm)
        if found is None:
            raise
        plugin, label, msg = found
        for p, dist in pm.list_plugin_distinfo():
            if p is plugin:  # an entry-point plugin: say which package to fix or uninstall
                msg = f"{msg} [installed by {dist.project_name} {dist.version}]"
        raise PluginRegistrationError(plugin, label, msg) from e


def register(pm: pluggy.PluginManager, plugin: object, name: str | None = None) -> str | None:
    """Register ``plugin`` and check it against the contract; returns its name.

    On failure the plugin is unregistered again (the manager stays usable) and a
    :class:`PluginRegistrationError` names the plugin and the bad hook. Returns ``None``
    for a blocked name, as pluggy does.
    """
    label = _label(name or pm.get_canonical_name(plugin), plugin)
    try:
        registered = pm.register(plugin, name)
        if registered is not None:
            _check_pending(pm)
    except pluggy.PluginValidationError as e:
        # pluggy leaves a half-registered plugin behind when an impl fails verification.
        if pm.is_registered(plugin):
            pm.unregister(plugin)
        if isinstance(e, PluginRegistrationError):
            raise
        raise PluginRegistrationError(plugin, label, f"plugin {label!r}: {e}") from e
    return registered


def _load_entrypoints(pm: pluggy.PluginManager) -> None:
    # One entry point at a time, so that an error can name the entry point and its package.
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP, name=ep.name)
        except pluggy.PluginValidationError as e:
            dist = f" [installed by {ep.dist.name} {ep.dist.version}]" if ep.dist else ""
            raise PluginRegistrationError(
                e.plugin, ep.name, f"entry point {ep.name!r} ({ep.value}){dist}: {e}"
            ) from e


def get_plugin_manager(
    load_entrypoints: bool = True, default_plugins: bool | list[str] = True
) -> JigsawPluginManager:
    """Build a fresh manager: hookspecs, default plugins, then entry-point plugins.

    :param load_entrypoints: Load plugins of the entry-point group ``jigsaw_plugin``
        (skipped anyway when ``$JIGSAW_DISABLE_PLUGIN_AUTOLOAD`` is set).
    :param default_plugins: ``True`` for :data:`DEFAULT_PLUGINS`, ``False`` for none, or a
        list of import paths to register instead.
    """
    pm = JigsawPluginManager(PROJECT)
    pm.add_hookspecs(hookspecs)
    paths = DEFAULT_PLUGINS if default_plugins is True else (default_plugins or [])
    for path in paths:
        register(pm, importlib.import_module(path), name=path)
    if load_entrypoints and not os.environ.get(DISABLE_AUTOLOAD_ENV):
        _load_entrypoints(pm)
    _check_pending(pm)  # entry-point plugins are not checked by pluggy itself
    return pm


def call(pm: pluggy.PluginManager, hook_name: str, **kwargs: Any) -> Any:
    """Call a hook by name; historic hooks go through ``call_historic`` (returns ``None``)."""
    caller = getattr(pm.hook, hook_name, None)
    if caller is None or not caller.has_spec():
        raise ValueError(f"unknown hook {hook_name!r}; valid hooks: {', '.join(HOOK_NAMES)}")
    if caller.is_historic():
        caller.call_historic(kwargs=kwargs)
        return None
    return caller(**kwargs)


class Emitter:
    """``emitter.jigsaw_x(**kw)`` calls the hook via :func:`call` (historic hooks included).

    For callers that hold a hook relay and do ``getattr(hooks, name)(**kw)``: calling
    ``pm.hook.<historic hook>(...)`` directly is an error in pluggy, this is not.
    """

    def __init__(self, pm: pluggy.PluginManager):
        self.pm = pm

    def __getattr__(self, name: str):
        if not name.startswith("jigsaw_"):
            raise AttributeError(name)
        return lambda **kwargs: call(self.pm, name, **kwargs)
