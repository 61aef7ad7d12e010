"""Every result quoted in README.md and docs/ matches what the code produces (issue 17, item 18).

The fast blocks are checked on every run; the whole check (every experiment at full size, about a
minute on 2 cores) and every experiment's ``--quick`` run are marked slow (``pytest -m slow``).
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tools.docs import check_docs
from tools.docs.doc_format import Drift, md_table, num, wrap_md

ROOT = Path(__file__).resolve().parent.parent


def test_every_block_in_the_docs_has_a_generator_and_vice_versa():
    found = check_docs.read_blocks()
    assert set(found) == set(check_docs.BLOCKS)
    for name, (file, _) in found.items():
        assert check_docs.BLOCKS[name].file == file, name


def test_quick_blocks_match_the_code():
    problems = check_docs.check(quick=True, out=io.StringIO())
    assert not problems, "\n".join(problems)


def _copy_docs(tmp_path: Path) -> Path:
    for rel in check_docs.DOC_FILES:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    return tmp_path


def test_a_changed_number_is_reported_and_update_restores_it(tmp_path):
    root = _copy_docs(tmp_path)
    readme = root / "README.md"
    text = readme.read_text()
    assert "7,422 blocks" in text
    readme.write_text(text.replace("7,422 blocks", "7,500 blocks", 1))
    problems = check_docs.check(["readme-cost"], root=root, out=io.StringIO())
    assert len(problems) == 1 and "drifted" in problems[0] and "-7,500 blocks" in problems[0]
    assert not check_docs.check(["readme-cost"], update=True, root=root, out=io.StringIO())
    assert readme.read_text() == text


def test_a_claim_that_stops_holding_is_reported(tmp_path, monkeypatch):
    root = _copy_docs(tmp_path)

    def broken(runs):
        raise Drift("claim no longer holds: SPF lowers the mean TTFT")

    monkeypatch.setitem(check_docs.BLOCKS, "readme-cost",
                        check_docs.Block("README.md", broken, True))
    problems = check_docs.check(["readme-cost"], root=root, out=io.StringIO())
    assert problems and "SPF lowers the mean TTFT" in problems[0]


def test_formatting_helpers():
    assert num(1051.7) == "1,052" and num(0.12345) == "0.123" and num(float("nan")) == "–"
    import pandas as pd

    table = md_table(pd.DataFrame({"a": [1, 12345], "b": [0.5, 2.0]}))
    assert table.splitlines()[-1] == "| 12,345 | 2 |"
    wrapped = wrap_md("- " + "word " * 40 + "\n| a | b |")
    lines = wrapped.splitlines()
    assert all(len(line) <= 100 for line in lines) and lines[1].startswith("  ")
    assert lines[-1] == "| a | b |"


@pytest.mark.slow
def test_every_documented_result_matches_the_code():
    problems = check_docs.check(out=io.StringIO())
    assert not problems, "\n".join(problems)


EXPERIMENTS = ("policy_comparison", "load_sweep", "memory_pressure", "token_budget",
               "starvation", "trace_replay", "policy_zoo", "calibrate_a100", "disaggregation")


@pytest.mark.slow
@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_runs_quick(name, tmp_path):
    proc = subprocess.run([sys.executable, "-m", f"experiments.{name}", "--quick", "--quiet",
                           "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() and any(tmp_path.iterdir())
    assert "_ms " not in proc.stdout and "Traceback" not in proc.stderr


# Python blocks marked runnable (an HTML comment ``<!-- runnable -->`` on the line above the
# fence) run as pasted into a fresh interpreter (issue 24 item 14).
RUNNABLE_RE = re.compile(r"^<!-- runnable -->\n```python\n(.*?)^```", re.S | re.M)


def runnable_blocks() -> list[tuple[str, int, str]]:
    """Every runnable block of README.md and docs/*.md: (file, line of the fence, code)."""
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        for m in RUNNABLE_RE.finditer(text):
            line = text.count("\n", 0, m.start()) + 2
            out.append((str(path.relative_to(ROOT)), line, m.group(1)))
    return out


def test_the_documented_examples_are_marked_runnable():
    marked = {file for file, _, _ in runnable_blocks()}
    assert {"README.md", "docs/workloads.md", "docs/cluster.md", "docs/extending.md"} <= marked


@pytest.mark.parametrize("file, line, code", runnable_blocks(),
                         ids=[f"{f}:{n}" for f, n, _ in runnable_blocks()])
def test_runnable_doc_blocks_run_as_pasted(file, line, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)          # blocks may write out/...
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        exec(compile(code, f"{file}:{line}", "exec"), {"__name__": "__main__"})
