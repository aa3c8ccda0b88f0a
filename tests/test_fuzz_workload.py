"""Fuzzing the workload file: every mutation of a valid spec parses, or fails with one
paragraph naming the field (``SpecError``; exit code 2 from the CLI). Never a traceback.

Bounded (``max_examples``) and without deadline, so the file runs in a few seconds.
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
import os
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jigsaw_plugin.cli import main as jigsaw_main
from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.workload import load_workload
from jigsaw_plugin.workload.spec import parse_workload

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "workloads"
#: Self-contained examples (the trace twins read PolyTrace files that CI does not have).
SOURCES = {p.name: yaml.safe_load(p.read_text()) for p in sorted(EXAMPLES.glob("*.yaml"))}
#: ``JIGSAW_FUZZ_EXAMPLES=N`` for a longer hunt than CI's.
SCALE = int(os.environ.get("JIGSAW_FUZZ_EXAMPLES", "0")) or None
FUZZ = settings(max_examples=SCALE or 150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: Values a YAML file can hold, odd ones included.
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.just(10**400),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["quantiles", "lognormal", "const", "categorical", "rule", "h100", "grpo", "sync", "1e9"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=8)


def _paths(node, prefix=()):
    """Every path into the nested dicts and lists of a spec."""
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


def _mutate(data, path, action, value):
    if not path:
        return value if action == "replace" else data
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if action == "delete":
        del parent[last]
    elif action == "replace":
        parent[last] = value
    elif action == "duplicate" and isinstance(parent, list):
        parent.append(copy.deepcopy(parent[last]))
    elif action == "empty":
        parent[last] = type(parent[last])() if isinstance(parent[last], (dict, list, str)) else None
    return data


@st.composite
def mutated_specs(draw):
    name = draw(st.sampled_from(sorted(SOURCES)))
    data = copy.deepcopy(SOURCES[name])
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(data))
        path = draw(st.sampled_from(paths))
        action = draw(st.sampled_from(["delete", "replace", "replace", "duplicate", "empty"]))
        data = _mutate(data, path, action, draw(values))
    return name, data


def _is_one_paragraph_error(e: SpecError) -> bool:
    text = str(e)
    return bool(e.field) and e.field in text and "\n\n" not in text and "Traceback" not in text


@FUZZ
@given(mutated_specs())
def test_a_mutated_spec_parses_or_names_the_field(case):
    name, data = case
    try:
        parse_workload(data, base_dir=EXAMPLES, where=name)
    except SpecError as e:
        assert _is_one_paragraph_error(e), str(e)


@st.composite
def corrupted_texts(draw):
    text = (EXAMPLES / draw(st.sampled_from(sorted(SOURCES)))).read_text()
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(text)))
        kind = draw(st.sampled_from(["truncate", "insert", "delete"]))
        if kind == "truncate":
            text = text[:at]
        elif kind == "insert":
            text = text[:at] + draw(st.text(alphabet=st.sampled_from(list(":-[]{}'\"#&*!|>%@` \n\t0a.,")),
                                            min_size=1, max_size=6)) + text[at:]
        else:
            text = text[:at] + text[at + draw(st.integers(1, 40)):]
    return text


@settings(max_examples=SCALE or 60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corrupted_texts())
def test_a_corrupted_file_through_the_cli_exits_0_or_2_with_one_paragraph(text):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "w.yaml"
        path.write_text(text)
        try:
            spec = load_workload(path)
        except SpecError as e:
            assert _is_one_paragraph_error(e), str(e)
            spec = None
        pipeline = spec.pipelines[0].name if spec is not None else "x"
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = jigsaw_main(["graph", str(path), "--pipeline", pipeline, "--out", str(Path(tmp) / "g.json"),
                              "--steps", "1", "--max-samples", "2", "-q"])
        assert rc == (0 if spec is not None else 2), err.getvalue()
        if rc == 2:
            assert err.getvalue().count("\n") == 1 and "error:" in err.getvalue()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 2**70, 10**400, "3", 0])
def test_numbers_that_are_not_counts_are_refused_by_name(bad):
    data = copy.deepcopy(SOURCES["demo.yaml"])
    data["pipelines"][0]["prompts_per_step"] = bad
    with pytest.raises(SpecError, match=r"pipelines\[0\]\.prompts_per_step"):
        parse_workload(data, base_dir=EXAMPLES)


def test_an_empty_key_is_named_in_the_error():
    # found by the fuzzer: an empty top-level key gave "x.yaml: : got ''", naming no field
    try:
        parse_workload({"": None}, where="x.yaml")
    except SpecError as e:
        assert _is_one_paragraph_error(e) and "''" in e.field
    else:
        raise AssertionError("an empty key must be refused")


@pytest.mark.parametrize("flags, named", [(["--baseline", "nope"], "--baseline"),
                                          (["--baseline", "verl-sync", "--candidate", "nah"], "--candidate")])
def test_an_unknown_policy_in_bench_is_named_by_the_flag_that_gave_it(flags, named):
    err = io.StringIO()
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stderr(err), \
            contextlib.redirect_stdout(io.StringIO()):
        rc = jigsaw_main(["bench", "a", *flags, "--out", str(Path(tmp) / "o"), "-q"])
    assert rc == 2 and f"error: {named}: got" in err.getvalue() and "allowed: areal" in err.getvalue()


def test_an_output_that_cannot_be_written_is_refused_before_the_run():
    # a file where --out wants a folder: refused by name before any simulated run (it used
    # to fail with a traceback after both runs, their results lost)
    err = io.StringIO()
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stderr(err), \
            contextlib.redirect_stdout(io.StringIO()):
        blocker = Path(tmp) / "file"
        blocker.write_text("")
        rc = jigsaw_main(["bench", "a", "--baseline", "verl-sync", "--out", str(blocker / "run"), "-q"])
        assert rc == 2 and "error: --out: got" in err.getvalue()
        rc = jigsaw_main(["sim", "a", "--json", str(blocker / "r.json"), "-q"])
        assert rc == 2 and "error: --json: got" in err.getvalue()


def test_a_negative_seed_is_refused_by_name():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as ex:
        jigsaw_main(["sim", "a", "--seed", "-1", "-q"])
    assert ex.value.code == 2 and "argument --seed: got '-1'; allowed: an integer >= 0" in err.getvalue()


def test_a_repeat_count_below_one_is_refused_by_name():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as ex:
        jigsaw_main(["bench", "a", "--baseline", "verl-sync", "--repeats", "0", "-q"])
    assert ex.value.code == 2 and "argument --repeats: got '0'; allowed: an integer >= 1" in err.getvalue()
