"""benchmarks/README.md's table and docs/performance.md's figures are rendered from the results
the benchmark scripts recorded (benchmarks/results/*.json), one current figure per script."""

from __future__ import annotations

import importlib
import io
import json
from pathlib import Path

import pytest

from benchmarks import results
from tools.docs import check_docs

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py")
                 if p.stem not in {"__init__", "common", "results", "results_shards",
                                   "fuzz_faults"})
# (fuzz_faults is the fuzz script's part, results_shards the results' part: not scripts.)
# Scripts without a row: spec_parity's figures are docs/speculative.md's (checked by its tests).
NO_ROW = {"spec_parity"}


def test_every_benchmark_script_has_a_row_and_recorded_results():
    assert set(results.BENCHMARKS) == set(SCRIPTS) - NO_ROW
    for name in results.BENCHMARKS:
        recorded = results.load(name)
        assert recorded, name
        for variant, figures in recorded.items():
            assert set(results.META) <= set(figures), (name, variant)


def test_the_table_and_the_summary_are_the_recorded_figures():
    problems = check_docs.check(list(results.BLOCK_NAMES), out=io.StringIO())
    assert not problems, "\n".join(problems)
    text = (ROOT / "benchmarks" / "README.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == [f"{n}.py" for n in results.BENCHMARKS]
    fleet = results.load("fleet_day")["full"]
    assert f"{fleet['wall_s']:,.1f} s" in text and f"{fleet['requests']:,} requests" in text


def test_no_history_in_the_table():
    text = (ROOT / "benchmarks" / "README.md").read_text()
    table = text[text.index("| script |"):text.index("<!-- end generated -->")]
    for word in ("session", "Earlier", "before", "was "):
        assert word not in table, word
    assert max(len(cell) for line in table.splitlines() for cell in line.split(" | ")) < 600


def test_record_keeps_other_variants_and_the_status_follows_the_figures(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path)
    src = ROOT / "benchmarks" / "results" / "scaling.json"
    (tmp_path / "scaling.json").write_text(src.read_text())
    recorded = results.load("scaling")
    assert results.status_of("scaling", recorded) == "met"
    slow = dict(recorded["full"], fcfs_ratio=2.5)
    del slow["measured"], slow["commit"], slow["python"], slow["argv"]
    results.record("scaling", "full", slow, render=False)
    results.record("scaling", "quick", {"fcfs_ratio": 1.0}, render=False)
    again = results.load("scaling")
    assert set(again) == {"full", "quick"} and again["full"]["fcfs_ratio"] == 2.5
    assert len(again["full"]["measured"]) == 10 and again["full"]["python"].count(".") == 2
    assert results.status_of("scaling", again) == "**not met**"
    assert "(ratio 2.50)" in results.current("scaling", again)
    with pytest.raises(ValueError, match="no benchmark"):
        results.record("nope", "full", {}, render=False)


@pytest.mark.parametrize("name", sorted(set(results.BENCHMARKS) - {"vllm_parity"}))
def test_every_script_can_record_and_refuses_a_quick_record(name, capsys, monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "0")     # or bytecodes re-executes itself with it
    module = importlib.import_module(f"benchmarks.{name}")
    with pytest.raises(SystemExit) as exc:
        module.main(["--help"])
    assert exc.value.code == 0 and "--record" in capsys.readouterr().out
    if "--quick" in results.BENCHMARKS[name].command and name != "floor":   # floor: a variant
        with pytest.raises(SystemExit) as exc:
            module.main(["--quick", "--record"])
        assert exc.value.code == 2 and "--record" in capsys.readouterr().err


def test_results_files_are_plain_json():
    for path in (ROOT / "benchmarks" / "results").glob("*.json"):
        assert path.stem in results.BENCHMARKS
        assert json.loads(path.read_text())
