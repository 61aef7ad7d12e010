"""``simsched run --trace / --metrics / --seeds`` write what the API writes (issue 46)."""

from __future__ import annotations

import json

import pandas as pd

from simsched.cli import main


def test_run_writes_trace_and_metrics(tmp_path, capsys):
    trace, metrics = tmp_path / "t" / "run.json", tmp_path / "m.om"
    assert main(["run", "--num-requests", "30", "--rate", "20", "--out", str(tmp_path / "out"),
                 "--trace", str(trace), "--metrics", str(metrics),
                 "--metrics-interval", "0.5"]) == 0
    events = json.loads(trace.read_text())["traceEvents"]
    assert sum(e["name"] == "request" for e in events) == 30
    text = metrics.read_text()
    assert text.endswith("# EOF\n") and "vllm:num_requests_running{" in text


def test_unwritable_outputs_are_refused_before_the_run(tmp_path, capsys):
    afile = tmp_path / "f"
    afile.write_text("x")
    assert main(["run", "--num-requests", "5", "--out", str(tmp_path / "o"),
                 "--trace", str(afile / "t.json")]) == 2
    err = capsys.readouterr().err
    assert "--trace" in err and "is a file" in err
    assert not (tmp_path / "o").exists()
    assert main(["run", "--num-requests", "5", "--metrics", str(tmp_path),
                 "--out", str(tmp_path / "o")]) == 2
    assert "--metrics" in capsys.readouterr().err
    assert main(["run", "--num-requests", "5", "--metrics-interval", "0",
                 "--out", str(tmp_path / "o")]) == 2


def test_run_seeds_writes_intervals(tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["run", "--num-requests", "20", "--rate", "20", "--seeds", "2",
                 "--out", str(out)]) == 0
    seeds = pd.read_csv(out / "seeds.csv")
    assert list(seeds["seed"]) == [0, 1]
    intervals = pd.read_csv(out / "intervals.csv").set_index("metric")
    assert intervals.loc["ttft_p99", "ci_low"] <= intervals.loc["ttft_p99", "mean"]
    assert "ttft_p99" in capsys.readouterr().out
    assert main(["run", "--num-requests", "5", "--seeds", "1", "--out", str(out)]) == 2
