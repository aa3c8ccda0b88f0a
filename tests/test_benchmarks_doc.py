"""docs/benchmarks.md stays what its scripts render: `benchmarks/report.py --only policies
--reuse` (the saved runs, no simulation) reproduces the file, so hand-written notes sit in
marked blocks a re-render keeps and the tables agree with benchmarks/results/."""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import report  # noqa: E402

_MACHINE = re.compile(r"Machine: [^\n]*?,\s*[^\n]*?,")  # the render's own platform line


def test_rerendering_the_policy_tables_from_the_saved_runs_reproduces_the_file():
    rendered = _MACHINE.sub("Machine:", report.render(["--only", "policies", "--reuse"]))
    current = _MACHINE.sub("Machine:", (ROOT / "docs" / "benchmarks.md").read_text())
    if rendered != current:
        import difflib

        diff = "".join(list(difflib.unified_diff(current.splitlines(True), rendered.splitlines(True),
                                                 "docs/benchmarks.md", "render"))[:60])
        raise AssertionError("docs/benchmarks.md differs from `python benchmarks/report.py --only policies "
                             "--reuse` (text outside a marked block, or a table behind its saved runs):\n" + diff)


def test_every_marked_block_survives_a_rerender():
    text = report.render(["--only", "policies", "--reuse"])
    names = re.findall(r"<!-- ([a-z0-9-]+):start -->", (ROOT / "docs" / "benchmarks.md").read_text())
    assert {"stop-notes", "ablation-notes", "held-out-mixes"} <= set(names)
    for name in names:
        assert text.count(f"<!-- {name}:start -->") == 1, name


def test_the_notes_block_says_where_the_build_stands_and_the_history_lives_apart():
    # a reader of docs/benchmarks.md meets the current build's state above the policy
    # tables, not every stop's notes (880 lines of them before stop 112): those go to
    # docs/benchmarks_history.md, which the block names
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    block = text[text.index("<!-- stop-notes:start -->"):text.index("<!-- stop-notes:end -->")]
    assert len(block.splitlines()) <= 40, len(block.splitlines())
    assert "docs/benchmarks_history.md" in block
    history = (ROOT / "docs" / "benchmarks_history.md").read_text()
    assert re.search(r"\*Stop 111 changes no policy", history)
