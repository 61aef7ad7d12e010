"""Tests of the simsched command: each subcommand on a tiny config, and clean errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from simsched.cli import main

TOML = """
[scheduler]
policy = "fcfs"
[workload]
name = "lesson"
num_requests = 30
rate = 5.0
[run]
seed = 3
[slo]
ttft = 0.5
"""


@pytest.fixture
def config(tmp_path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TOML)
    return path


def test_run_writes_frames_and_summary(config, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", str(config), "--policy", "spf", "--out", str(out)]) == 0
    assert "ttft_p99" in capsys.readouterr().out
    summary = pd.read_csv(out / "summary.csv")
    assert summary.loc[0, "num_requests"] == 30
    assert "goodput" in summary.columns            # from the [slo] section
    assert len(pd.read_csv(out / "requests.csv")) == 30


def test_sweep_writes_runs_and_plots(config, tmp_path):
    out = tmp_path / "sweep"
    assert main(["sweep", str(config), "--vary", "rate=2,20", "--vary", "policy=fcfs,spf",
                 "--executor", "serial", "--quiet", "--out", str(out)]) == 0
    runs = pd.read_csv(out / "runs.csv")
    assert len(runs) == 4 and set(runs["policy"]) == {"fcfs", "spf"}
    assert (out / "latency_vs_load.png").stat().st_size > 1000


def test_capacity_writes_table(tmp_path):
    out = tmp_path / "cap"
    assert main(["capacity", "--cost-model", "unit", "--max-num-seqs", "1",
                 "--max-num-batched-tokens", "64", "--workload", "custom",
                 "--set", "arrival=deterministic", "--set", "lengths=fixed",
                 "--set", "prompt_len=16", "--set", "output_len=4", "--num-requests", "60",
                 "--target", "ttft_p99=5", "--low", "0.1", "--tol", "0.05",
                 "--executor", "serial", "--quiet", "--out", str(out)]) == 0
    table = pd.read_csv(out / "capacity.csv")
    assert table.loc[0, "capacity"] == pytest.approx(0.25, rel=0.06)
    assert "seed_capacities" not in table.columns            # tidy: one row per seed, apart
    assert pd.read_csv(out / "seed_capacities.csv")["seed"].tolist() == [0]
    assert (out / "config.json").exists()


@pytest.mark.parametrize("argv", [
    ["run", "--rate", "-1"],
    ["run", "--rate", "abc"],
    ["run", "--policy", "nope"],
    ["run", "/no/such/file.toml"],
    ["sweep", "--vary", "bogus=1,2"],
    ["sweep", "--vary", "rate"],
    ["capacity", "--target", "ttft_p99=x"],
])
def test_bad_values_exit_2_with_one_line(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(argv))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("simsched: error: ") and "\n" not in err, err


def test_bad_toml_is_one_line(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text("[workload\nrate = 1")
    assert main(["run", str(path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_python_dash_m_help():
    proc = subprocess.run([sys.executable, "-m", "simsched", "sweep", "--help"],
                          capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    assert proc.returncode == 0
    assert "--vary" in proc.stdout and "--max-num-batched-tokens" in proc.stdout
