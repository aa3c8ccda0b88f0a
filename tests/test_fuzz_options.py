"""Fuzzing the adapters' options: verl's ``+jigsaw.*`` (a Hydra mapping, any YAML value)
and OpenRLHF's ``--jigsaw.*`` (command-line words). Every mutation parses to sane values,
or fails with one line naming the option (exit code 2 from OpenRLHF's entry point).
Never a traceback.
"""

from __future__ import annotations

import contextlib
import io
import math
import os

from hypothesis import given, settings
from hypothesis import strategies as st

from jigsaw_plugin.adapters.openrlhf.config import FLAGS, JigsawUsageError, parse_jigsaw_flags
from jigsaw_plugin.adapters.openrlhf.train_ppo_ray import main as openrlhf_main
from jigsaw_plugin.adapters.verl.options import JigsawOptions, parse_options
from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.runtime.liveness import LOSS_MODES

#: ``JIGSAW_FUZZ_EXAMPLES=N`` for a longer hunt than CI's.
SCALE = int(os.environ.get("JIGSAW_FUZZ_EXAMPLES", "0")) or None
FUZZ = settings(max_examples=SCALE or 300, deadline=None)

ODD_WORDS = ["", " ", "nan", "NaN", "inf", "-inf", "1e309", "-1", "0", "0.0", "1", "2", "0.5", "1e9", "none", "None",
             "true", "false", "yes", "off", "jigsaw", "observe", "least-in-flight", "stop", "fallback", "a b",
             "--x", "-", "é", "9" * 40, "0x10", "1_000"]
words = st.one_of(st.sampled_from(ODD_WORDS), st.text(max_size=10))


@st.composite
def openrlhf_argvs(draw):
    """A command line: host arguments with ``--jigsaw.*`` flags among them."""
    host = ["--pretrain", "tiny", "--micro_train_batch_size", "2"]
    argv = list(host)
    names = list(FLAGS) + ["enable", "unknown_flag", "Policy", "lease-timeout-s", ""]
    for _ in range(draw(st.integers(0, 5))):
        name = draw(st.sampled_from(names))
        form = draw(st.sampled_from(["eq", "space", "bare"]))
        value = draw(words)
        words_ = {"eq": [f"--jigsaw.{name}={value}"], "space": [f"--jigsaw.{name}", value],
                  "bare": [f"--jigsaw.{name}"]}[form]
        at = draw(st.integers(0, len(argv)))
        argv[at:at] = words_
    if draw(st.booleans()):
        argv.insert(0, "--jigsaw.enable")
    return argv


def _check_config(config) -> None:
    """A config that parsed holds only values its fields allow."""
    for name in ("lease_timeout_s",):
        value = getattr(config, name)
        assert value is None or (math.isfinite(value) and value > 0), (name, value)
    m = config.migration
    assert 0 < m.tail_fraction <= 1 and math.isfinite(m.poll_interval_s) and m.poll_interval_s > 0
    assert m.migrate_min_tokens >= 0 and config.on_coordinator_loss in LOSS_MODES
    assert config.active_engines is None or config.active_engines >= 1


@FUZZ
@given(openrlhf_argvs())
def test_openrlhf_flags_parse_or_exit_2_naming_the_flag(argv):
    try:
        config, rest = parse_jigsaw_flags(argv)
    except JigsawUsageError as e:
        text = str(e)
        assert "--jigsaw." in text and "\n" not in text, text
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            assert openrlhf_main(argv) == 2
        assert err.getvalue().count("\n") == 1 and "--jigsaw." in err.getvalue()
        return
    _check_config(config)
    assert not any(a.startswith("--jigsaw.") for a in rest)


verl_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
              st.sampled_from(ODD_WORDS), st.text(max_size=70)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=5)
verl_keys = st.one_of(st.sampled_from(list(JigsawOptions.__dataclass_fields__)), st.text(max_size=8), st.integers())


@FUZZ
@given(st.dictionaries(verl_keys, verl_values, max_size=5), st.one_of(st.none(), st.text(max_size=70)))
def test_verl_options_parse_or_name_the_option(raw, experiment_name):
    try:
        opts = parse_options(raw, default_pipeline=experiment_name)
    except SpecError as e:
        assert e.field.startswith(("+jigsaw.", "+jigsaw[")) and e.field in str(e) and "\n" not in str(e), str(e)
        return
    assert opts.policy in ("jigsaw", "observe") and opts.on_coordinator_loss in LOSS_MODES
    assert math.isfinite(opts.lookahead_s) and opts.lookahead_s > 0
    for name in ("pipeline", "coordinator", "address", "events_path"):
        value = getattr(opts, name)
        assert value is None or (isinstance(value, str) and value), (name, value)
    assert isinstance(opts.namespace, str) and opts.namespace


def test_non_finite_numbers_and_bad_loss_modes_are_refused_by_name():
    for flag, value in [("poll_interval_s", "inf"), ("tail_fraction", "nan"), ("lease_timeout_s", "inf"),
                        ("on_coordinator_loss", "retry")]:
        try:
            parse_jigsaw_flags(["--jigsaw.enable", f"--jigsaw.{flag}={value}"])
        except JigsawUsageError as e:
            assert str(e).startswith(f"--jigsaw.{flag}: got {value!r}; allowed:"), str(e)
        else:
            raise AssertionError(f"--jigsaw.{flag}={value} was accepted")
    for key, value in [("lookahead_s", math.inf), ("on_coordinator_loss", "retry"), ("namespace", 3)]:
        try:
            parse_options({key: value})
        except SpecError as e:
            assert e.field == f"+jigsaw.{key}", str(e)
        else:
            raise AssertionError(f"+jigsaw.{key}={value!r} was accepted")
