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
    page = root / "docs" / "cost_model.md"
    text = page.read_text()
    assert "7,422 blocks of 16 tokens for" in text
    page.write_text(text.replace("7,422 blocks of 16 tokens for", "7,500 blocks of 16 tokens for",
                                 1))
    problems = check_docs.check(["cost-summary"], root=root, out=io.StringIO())
    assert len(problems) == 1 and "drifted" in problems[0] and "-7,500 blocks" in problems[0]
    assert not check_docs.check(["cost-summary"], update=True, root=root, out=io.StringIO())
    assert page.read_text() == text


def test_a_claim_that_stops_holding_is_reported(tmp_path, monkeypatch):
    root = _copy_docs(tmp_path)

    def broken(runs):
        raise Drift("claim no longer holds: SPF lowers the mean TTFT")

    monkeypatch.setitem(check_docs.BLOCKS, "cost-summary",
                        check_docs.Block("docs/cost_model.md", broken, True))
    problems = check_docs.check(["cost-summary"], root=root, out=io.StringIO())
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
               "starvation", "trace_replay", "policy_zoo", "calibrate_a100", "disaggregation",
               "llm_d")


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
    assert {"README.md", "docs/api.md", "docs/workloads.md", "docs/cluster.md",
            "docs/extending.md"} <= marked


@pytest.mark.parametrize("file, line, code", runnable_blocks(),
                         ids=[f"{f}:{n}" for f, n, _ in runnable_blocks()])
def test_runnable_doc_blocks_run_as_pasted(file, line, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)          # blocks may write out/...
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        exec(compile(code, f"{file}:{line}", "exec"), {"__name__": "__main__"})


# ----------------------------------------------------------------------------- docs as a reference
# (issue 40, item 4): a short README, reference pages, every link resolving, history in
# CHANGELOG.md.
LINK_RE = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def doc_pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "benchmarks" / "README.md",
            *sorted((ROOT / "docs").glob("*.md"))]


def test_every_relative_link_in_the_docs_resolves_to_a_file():
    broken = []
    for page in doc_pages():
        text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)   # not code
        for target in LINK_RE.findall(text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue                                    # a URL or an anchor on the page
            path = (page.parent / target.split("#")[0]).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "\n".join(broken)


def test_the_link_check_finds_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[ok](page.md) [gone](missing.md#x) [web](https://example.com)")
    targets = [t for t in LINK_RE.findall(page.read_text()) if not re.match(r"[a-z]+:", t)]
    assert [t for t in targets if not (tmp_path / t.split("#")[0]).exists()] == ["missing.md#x"]


def test_the_readme_is_short_and_links_every_reference_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    # The two commands CI runs, as they are.
    assert (".venv/bin/pip install -q . && .venv/bin/python -m experiments.policy_comparison"
            in text)
    assert '.venv/bin/pip install -q ".[test]" && .venv/bin/python -m pytest -q' in text
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"](docs/{page.name})" in text, page.name
    assert "](CHANGELOG.md)" in text and "](benchmarks/README.md)" in text
    # Nothing dated, no session's notes.
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text)
    assert not re.search(r"session|round \d|\bbefore (this|these)\b", text, re.I)
    for licence in ("MIT licence", "CC-BY-4.0", "Apache-2.0", "Vidur", "Splitwise", "Mooncake",
                    "Each folder keeps its licence file."):
        assert licence in text, licence


def test_the_docs_pages_carry_no_session_history():
    pattern = re.compile(r"this session|this round|\bround \d|(first|second|third|fourth|"
                         r"earlier|later|previous) session", re.I)
    found = [f"{page.relative_to(ROOT)}: {m.group(0)}" for page in doc_pages()[2:]
             for m in pattern.finditer(page.read_text())]
    assert not found, found


def test_the_changelog_is_dated_newest_first():
    text = (ROOT / "CHANGELOG.md").read_text()
    dates = re.findall(r"^## (20\d\d-\d\d-\d\d)$", text, re.M)
    assert len(dates) >= 4 and dates == sorted(dates, reverse=True)


def test_the_documented_command_lines_parse():
    from simsched.cli import make_parser

    parser = make_parser()
    lines = []
    for page in (ROOT / "README.md", ROOT / "docs" / "cli.md"):
        for block in re.findall(r"^```bash\n(.*?)^```", page.read_text(), re.S | re.M):
            lines += [line.split("  #")[0].split() for line in block.splitlines()
                      if line.startswith("simsched ")]
    assert len(lines) >= 8
    for words in lines:
        args = parser.parse_args(words[1:])        # exits 2 on an unknown flag or value
        assert args.command == words[1], words
