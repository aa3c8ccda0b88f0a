"""Plugin manager: default plugins, entry points, loud registration errors."""

from __future__ import annotations

import sys
import textwrap

import pluggy
import pytest

from jigsaw_plugin import manager
from jigsaw_plugin.hookspecs import hookimpl
from jigsaw_plugin.manager import (
    Emitter,
    PluginRegistrationError,
    call,
    get_plugin_manager,
    register,
)


@pytest.fixture
def pm():
    return get_plugin_manager(load_entrypoints=False, default_plugins=False)


class Misspelt:
    @hookimpl
    def jigsaw_stage_strat(self, pipeline):  # sic
        pass


def test_misspelt_hook_fails_loudly(pm):
    with pytest.raises(PluginRegistrationError) as info:
        register(pm, Misspelt())
    msg = str(info.value)
    assert "jigsaw_stage_strat" in msg
    assert "did you mean 'jigsaw_stage_start'" in msg
    assert "Misspelt" in msg  # names the plugin, not an id()
    assert "jigsaw_weight_sync_end" in msg  # lists the valid hooks
    assert isinstance(info.value, pluggy.PluginValidationError)


def test_failed_registration_leaves_manager_clean(pm):
    plugin = Misspelt()
    with pytest.raises(PluginRegistrationError):
        register(pm, plugin)
    assert not pm.is_registered(plugin)
    pm.check_pending()  # nothing pending is left behind
    register(pm, object())  # and the manager still takes plugins


def test_unmarked_jigsaw_function_is_checked_too(pm):
    # pytest's rule: a jigsaw_* function is an impl even without the marker, so a typo
    # cannot go unnoticed because the marker was forgotten as well.
    class NoMarker:
        def jigsaw_step_strat(self, pipeline):
            pass

    with pytest.raises(PluginRegistrationError, match="jigsaw_step_strat"):
        register(pm, NoMarker())


def test_unmarked_impl_is_called(pm):
    seen = []

    class NoMarker:
        def jigsaw_step_start(self, pipeline, step):
            seen.append((pipeline, step))

    register(pm, NoMarker())
    pm.hook.jigsaw_step_start(pipeline="p", step=3, t=1.0)
    assert seen == [("p", 3)]


def test_unknown_argument_fails_loudly(pm):
    class BadArg:
        @hookimpl
        def jigsaw_step_start(self, pipeline, stepp):
            pass

    plugin = BadArg()
    with pytest.raises(PluginRegistrationError) as info:
        register(pm, plugin, name="badarg")
    assert "badarg" in str(info.value)
    assert "stepp" in str(info.value) and "jigsaw_step_start" in str(info.value)
    assert not pm.is_registered(plugin)


def test_half_registered_plugin_is_removed(pm):
    # pluggy registers impls one by one; a later bad one must not leave earlier ones.
    calls = []

    class HalfBad:
        @hookimpl
        def jigsaw_pipeline_end(self, pipeline):  # sorted before the bad one below
            calls.append(pipeline)

        @hookimpl
        def jigsaw_step_start(self, nope):
            pass

    with pytest.raises(PluginRegistrationError):
        register(pm, HalfBad())
    pm.hook.jigsaw_pipeline_end(pipeline="p", t=0.0)
    assert calls == []


def test_optional_unknown_hook_is_allowed(pm):
    class Optional:
        @hookimpl(optionalhook=True)
        def jigsaw_future_hook(self):
            pass

    assert register(pm, Optional(), name="opt") == "opt"


def test_register_returns_name(pm):
    assert register(pm, object(), name="x") == "x"
    assert pm.get_plugin("x") is not None


def _write_module(dirpath, name, source):
    (dirpath / f"{name}.py").write_text(textwrap.dedent(source))


def test_default_plugins_are_registered(tmp_path, monkeypatch):
    modname = f"jigsaw_default_{tmp_path.name}"
    _write_module(tmp_path, modname, "def jigsaw_schedule(state):\n    return ['default']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, modname, raising=False)
    monkeypatch.setattr(manager, "DEFAULT_PLUGINS", [modname])

    pm = get_plugin_manager(load_entrypoints=False)
    assert pm.get_plugin(modname) is not None
    assert pm.hook.jigsaw_schedule(state=None) == ["default"]

    assert get_plugin_manager(load_entrypoints=False, default_plugins=False).get_plugin(modname) is None
    explicit = get_plugin_manager(load_entrypoints=False, default_plugins=[modname])
    assert explicit.get_plugin(modname) is not None


def _fake_distribution(root, dist, module, source):
    """A distribution installed on sys.path: module + dist-info with an entry point."""
    _write_module(root, module, source)
    info = root / f"{dist}-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.2.3\n")
    (info / "entry_points.txt").write_text(f"[jigsaw_plugin]\nmyplugin = {module}\n")


@pytest.fixture
def fake_dist(tmp_path, monkeypatch):
    def make(source):
        module = f"jigsaw_ep_{tmp_path.name}"
        _fake_distribution(tmp_path, "fake-jigsaw-ext", module, source)
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, module, raising=False)
        monkeypatch.delenv(manager.DISABLE_AUTOLOAD_ENV, raising=False)
        return module

    return make


GOOD_PLUGIN = """
from jigsaw_plugin.hookspecs import hookimpl

@hookimpl
def jigsaw_predict_duration(kind):
    return 42.0
"""


def test_entry_point_plugins_are_loaded(fake_dist):
    fake_dist(GOOD_PLUGIN)
    pm = get_plugin_manager(default_plugins=False)
    assert pm.get_plugin("myplugin") is not None
    dists = [d.project_name for _, d in pm.list_plugin_distinfo()]
    assert "fake-jigsaw-ext" in dists
    assert pm.hook.jigsaw_predict_duration(kind="gen", pipeline="p", sizes={}, devices=()) == 42.0


def test_entry_points_can_be_skipped(fake_dist, monkeypatch):
    fake_dist(GOOD_PLUGIN)
    assert get_plugin_manager(load_entrypoints=False).get_plugin("myplugin") is None
    monkeypatch.setenv(manager.DISABLE_AUTOLOAD_ENV, "1")
    assert get_plugin_manager().get_plugin("myplugin") is None


def test_entry_point_with_unknown_hook_fails_loudly(fake_dist):
    fake_dist("def jigsaw_request_finsihed(pipeline):\n    pass\n")
    with pytest.raises(PluginRegistrationError) as info:
        get_plugin_manager(default_plugins=False)
    msg = str(info.value)
    assert "jigsaw_request_finsihed" in msg and "jigsaw_request_finished" in msg
    assert "myplugin" in msg and "fake-jigsaw-ext" in msg


def test_entry_point_with_unknown_argument_fails_loudly(fake_dist):
    fake_dist("def jigsaw_step_end(pipeline, stepp):\n    pass\n")
    with pytest.raises(PluginRegistrationError) as info:
        get_plugin_manager(default_plugins=False)
    assert "myplugin" in str(info.value) and "stepp" in str(info.value)
    assert "fake-jigsaw-ext" in str(info.value)


def test_call_dispatches_historic_and_plain_hooks(pm):
    seen = []

    class P:
        def jigsaw_register_pipeline(self, pipeline):
            seen.append(("register", pipeline))

        def jigsaw_pipeline_start(self, pipeline, t):
            seen.append(("start", pipeline, t))
            return "ok"

    register(pm, P())
    assert call(pm, "jigsaw_register_pipeline", pipeline="a", spec={}) is None
    assert call(pm, "jigsaw_pipeline_start", pipeline="a", t=1.5) == ["ok"]
    assert seen == [("register", "a"), ("start", "a", 1.5)]
    with pytest.raises(ValueError, match="jigsaw_pipeline_start"):  # lists the valid names
        call(pm, "jigsaw_pipline_start", pipeline="a", t=0.0)


def test_emitter(pm):
    seen = []

    class P:
        def jigsaw_register_pipeline(self, pipeline):
            seen.append(pipeline)

    emit = Emitter(pm)
    emit.jigsaw_register_pipeline(pipeline="a", spec={})  # historic: no error
    register(pm, P())
    assert seen == ["a"]
    emit.jigsaw_step_start(pipeline="a", step=0, t=0.0)
    with pytest.raises(AttributeError):
        emit.not_a_hook  # noqa: B018
