"""OpenRLHF adapter: command-line flags, version guard, CLI misuse (exit code 2).

Runs in the core test environment, where OpenRLHF, torch, vLLM are absent: only the pure
parts are tested here; integration_tests/openrlhf runs the real OpenRLHF loop.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from jigsaw_plugin.adapters.openrlhf import version as version_mod
from jigsaw_plugin.adapters.openrlhf.config import (
    FLAGS,
    MIGRATION_FLAGS,
    JigsawConfig,
    JigsawUsageError,
    MigrationSettings,
    parse_jigsaw_flags,
)

MODULE = "jigsaw_plugin.adapters.openrlhf.train_ppo_ray"


def test_flags_are_taken_out_and_host_arguments_kept_in_order():
    argv = ["--actor.model_name_or_path", "m", "--jigsaw.enable", "--vllm.num_engines", "2",
            "--jigsaw.policy", "least-in-flight", "--jigsaw.tail_fraction=0.5", "--train.colocate_all"]
    config, rest = parse_jigsaw_flags(argv)
    assert rest == ["--actor.model_name_or_path", "m", "--vllm.num_engines", "2", "--train.colocate_all"]
    assert config == JigsawConfig(enable=True, policy="least-in-flight", migration=MigrationSettings(tail_fraction=0.5))


def test_every_flag_parses():
    argv = ["--jigsaw.enable=true", "--jigsaw.policy", "jigsaw", "--jigsaw.pipeline", "p1",
            "--jigsaw.coordinator", "pool", "--jigsaw.namespace", "ns", "--jigsaw.active_engines", "3",
            "--jigsaw.tail_fraction", "1", "--jigsaw.migrate_min_tokens", "0", "--jigsaw.poll_interval_s", "0.05",
            "--jigsaw.events", "/tmp/e.jsonl", "--jigsaw.lease_timeout_s", "30"]
    config, rest = parse_jigsaw_flags(argv)
    assert rest == []
    settings = config.to_dict()  # what install() ships to the trainer actors
    assert set(FLAGS) == set(settings) - {"migration"} | set(MIGRATION_FLAGS)
    assert (config.coordinator, config.namespace, config.active_engines) == ("pool", "ns", 3)
    assert settings["migration"] == MigrationSettings(tail_fraction=1.0, migrate_min_tokens=0, poll_interval_s=0.05)
    assert config.lease_timeout_s == 30.0


def test_migration_settings_have_one_default_and_check_python_values_like_flags():
    assert JigsawConfig().migration == MigrationSettings() == parse_jigsaw_flags(["--jigsaw.enable"])[0].migration
    assert MigrationSettings().migrate_min_tokens == 8
    with pytest.raises(JigsawUsageError, match=r"--jigsaw.tail_fraction: got '1.5'; allowed: float > 0.0 and <= 1.0"):
        MigrationSettings(tail_fraction=1.5)
    with pytest.raises(JigsawUsageError, match=r"--jigsaw.migrate_min_tokens: got '2.5'; allowed: int >= 0"):
        MigrationSettings(migrate_min_tokens=2.5)
    with pytest.raises(JigsawUsageError, match=r"--jigsaw.poll_interval_s: got None; allowed: a number"):
        MigrationSettings(poll_interval_s=None)


def test_no_jigsaw_flags_means_disabled():
    config, rest = parse_jigsaw_flags(["--a", "1"])
    assert not config.enable and rest == ["--a", "1"]


@pytest.mark.parametrize("argv, needle", [
    (["--jigsaw.enable", "--jigsaw.polcy", "jigsaw"], "unknown flag '--jigsaw.polcy'; allowed: --jigsaw.enable"),
    (["--jigsaw.enable", "--jigsaw.policy", "verl-sync"], "--jigsaw.policy: got 'verl-sync'; allowed: jigsaw, "
                                                            "least-in-flight"),
    (["--jigsaw.enable", "--jigsaw.tail_fraction", "0"], "--jigsaw.tail_fraction: got '0'; allowed: float > 0.0"),
    (["--jigsaw.enable", "--jigsaw.tail_fraction", "1.5"], "and <= 1.0"),
    (["--jigsaw.enable", "--jigsaw.migrate_min_tokens", "-1"],
     "--jigsaw.migrate_min_tokens: got '-1'; allowed: int >= 0"),
    (["--jigsaw.enable", "--jigsaw.poll_interval_s", "soon"],
     "--jigsaw.poll_interval_s: got 'soon'; allowed: float > 0.0"),
    (["--jigsaw.enable", "--jigsaw.active_engines", "two"], "--jigsaw.active_engines: got 'two'; allowed: int >= 1"),
    (["--jigsaw.enable", "--jigsaw.policy"], "--jigsaw.policy needs a value"),
    (["--jigsaw.enable", "--jigsaw.pipeline", "--x"], "--jigsaw.pipeline needs a value"),
    (["--jigsaw.enable", "--jigsaw.enable"], "--jigsaw.enable given twice"),
    (["--jigsaw.enable=maybe"], "--jigsaw.enable: got 'maybe'; allowed: true or false"),
    (["--jigsaw.policy", "jigsaw"], "--jigsaw.policy given without --jigsaw.enable"),
])
def test_bad_flags_name_the_option_the_value_and_what_is_allowed(argv, needle):
    with pytest.raises(JigsawUsageError) as e:
        parse_jigsaw_flags(argv)
    assert needle in str(e.value)


def test_version_guard_missing(monkeypatch):
    def missing(name):
        raise version_mod.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(version_mod.metadata, "version", missing)
    with pytest.raises(JigsawUsageError, match=r"OpenRLHF is not installed; this adapter needs openrlhf==0\.11\.2"):
        version_mod.check_openrlhf()


def test_version_guard_wrong_version(monkeypatch):
    monkeypatch.setattr(version_mod.metadata, "version", lambda name: "0.10.1")
    with pytest.raises(JigsawUsageError, match=r"OpenRLHF 0\.10\.1 is installed; this adapter supports only "
                                               r"openrlhf==0\.11\.2"):
        version_mod.check_openrlhf()


def test_version_guard_broken_install(monkeypatch):
    monkeypatch.setattr(version_mod.metadata, "version", lambda name: "0.11.2")
    with pytest.raises(JigsawUsageError, match=r"openrlhf\.trainer\.ppo_trainer does not import"):
        version_mod.check_openrlhf()  # OpenRLHF itself is absent from the core environment


def _cli(*args):
    return subprocess.run([sys.executable, "-m", MODULE, *args], capture_output=True, text=True, timeout=60)


def test_cli_unknown_flag_exits_2_with_the_allowed_list():
    r = _cli("--actor.model_name_or_path", "m", "--jigsaw.enable", "--jigsaw.bogus", "1")
    assert r.returncode == 2
    assert "unknown flag '--jigsaw.bogus'; allowed: --jigsaw.enable, --jigsaw.policy" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_cli_bad_migration_setting_exits_2_naming_the_option():
    r = _cli("--actor.model_name_or_path", "m", "--jigsaw.enable", "--jigsaw.migrate_min_tokens=-3")
    assert r.returncode == 2
    assert "--jigsaw.migrate_min_tokens: got '-3'; allowed: int >= 0" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_cli_without_openrlhf_exits_2_saying_what_is_required():
    r = _cli("--actor.model_name_or_path", "m", "--jigsaw.enable")
    assert r.returncode == 2
    assert "OpenRLHF is not installed; this adapter needs openrlhf==0.11.2" in r.stderr
    assert "Traceback" not in r.stderr


def test_importing_the_cli_module_imports_no_host():
    code = (f"import sys, {MODULE}; "
            "bad = [m for m in ('openrlhf', 'torch', 'vllm', 'ray', 'deepspeed') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
