"""Issue 17, section 2: the defects a new user hit, each with a test that would have caught it.

Item numbers refer to the issue; the CLI is driven through ``simsched.cli.main``.
"""

from __future__ import annotations

import importlib
import json
import math
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import simsched
from simsched import SimConfig, UnitCostModel
from simsched.analysis import plots
from simsched.analysis.export import read_frames
from simsched.analysis.runner import RejectionWarning
from simsched.analysis.slo import SLO, summarize
from simsched.analysis.sweep import sweep
from simsched.cli import main
from simsched.policies import VICTIM_POLICIES
from simsched.workloads.traces import apply_long_prompt_policy

ROOT = Path(__file__).resolve().parent.parent
TINY = SimConfig().replace(name="lesson", num_requests=30, rate=5.0)
METRICS = ("ttft", "tpot", "itl", "e2el", "queue_time")


def _quiet_simulate(config, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return simsched.simulate(config, **kw)


# ----------------------------------------------------------------------------- 1: Python 3.10


def test_cli_imports_tomli_where_tomllib_is_missing(monkeypatch):
    import simsched.cli.configs as cli

    fake = types.ModuleType("tomli")
    fake.loads, fake.TOMLDecodeError = tomllib.loads, tomllib.TOMLDecodeError
    try:
        with monkeypatch.context() as m:
            m.setitem(sys.modules, "tomllib", None)        # as on Python 3.10
            m.setitem(sys.modules, "tomli", fake)
            reloaded = importlib.reload(cli)
            assert reloaded.tomllib is fake
            assert reloaded.load_toml.__module__ == "simsched.cli.configs"
    finally:
        importlib.reload(cli)
    assert cli.tomllib is tomllib


def test_pyproject_declares_tomli_for_old_pythons_and_plots_progress_as_core():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = [d.replace(" ", "") for d in project["dependencies"]]
    assert "tomli>=2;python_version<'3.11'" in deps
    assert any(d.startswith("matplotlib") for d in deps)      # item 3
    assert any(d.startswith("tqdm") for d in deps)            # item 16
    assert project["requires-python"] == ">=3.10"
    assert "python3.10" in (ROOT / ".ci" / "run").read_text()


# ----------------------------------------------------------------------------- 2: --quick --out

# Every study module in experiments/ (helpers start with "_"; the doc generators are in tools/docs).
EXPERIMENTS = tuple(sorted(
    p.stem for p in (Path(__file__).resolve().parent.parent / "experiments").glob("*.py")
    if not p.stem.startswith("_")))


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_accepts_quick_and_out(name, capsys):
    module = importlib.import_module(f"experiments.{name}")
    with pytest.raises(SystemExit) as exc:
        module.main(["--quick", "--out", "somewhere", "--quiet", "--help"])
    assert exc.value.code == 0                     # unknown flags would exit 2 before --help
    text = capsys.readouterr().out
    assert "--quick" in text and "--out" in text


def test_the_docs_list_every_experiment():
    readme = (ROOT / "docs" / "experiments.md").read_text()
    for name in EXPERIMENTS:
        assert f"`{name}`" in readme, name


# ----------------------------------------------------------------------------- 3: plots never cost results


@pytest.fixture
def no_matplotlib(monkeypatch):
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.pyplot"):
        monkeypatch.setitem(sys.modules, name, None)


def test_cli_sweep_without_matplotlib_still_prints_and_writes(no_matplotlib, tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["sweep", "--num-requests", "20", "--vary", "rate=2,20", "--executor", "serial",
                 "--quiet", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "ttft_p99" in captured.out and "skipped" in captured.err
    assert len(pd.read_csv(out / "runs.csv")) == 2
    assert not (out / "latency_vs_load.png").exists()


def test_cli_run_without_matplotlib_still_succeeds(no_matplotlib, tmp_path, capsys):
    assert main(["run", "--num-requests", "20", "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "num_finished" in captured.out and "timeline plot skipped" in captured.err
    assert (tmp_path / "requests.csv").exists()


def test_experiment_without_matplotlib_prints_its_tables(no_matplotlib, tmp_path, capsys):
    from experiments import calibrate_a100

    tables = calibrate_a100.main(["--out", str(tmp_path), "--quiet"])   # draws a plot
    captured = capsys.readouterr()
    assert "leave-one-model-out" in captured.out and "skipped" in captured.err
    assert len(tables["linear"]) > 0 and (tmp_path / "linear_errors.csv").exists()


# ----------------------------------------------------------------------------- 5: all rejected


def test_all_rejected_run_warns_and_is_labelled_failed():
    with pytest.warns(RejectionWarning, match=r"20 of 20 requests rejected.*KV blocks"):
        res = simsched.simulate(TINY.replace(num_blocks=2, num_requests=20))
    row = summarize(res)
    assert row["num_finished"] == 0 and row["saturation"] == "failed"


def test_cli_fails_when_no_request_finishes(tmp_path, capsys):
    code = main(["run", "--num-blocks", "2", "--num-requests", "20", "--out", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 1
    assert "stable" not in captured.out and "failed" in captured.out
    assert "simsched: warning: 20 of 20 requests rejected" in captured.err
    assert "simsched: error: no request finished" in captured.err


def test_partial_rejection_warns_once_with_count():
    requests = [(0.0, 4000, 200), (0.0, 100, 10), (0.1, 5000, 10)]
    with pytest.warns(RejectionWarning, match=r"2 of 3 requests rejected; most common reason "
                                              r"\(2 of them\): prompt \+ output"):
        res = simsched.simulate(SimConfig(), requests=requests)
    assert res.summary()["num_rejected"] == 2


# ----------------------------------------------------------------------------- 6: hidden rejections, clip


def test_cli_table_shows_finished_rejected_unfinished(tmp_path, capsys):
    assert main(["run", "--workload", "azure-conv", "--num-requests", "300",
                 "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    header = captured.out.splitlines()[0].split()
    assert header[:3] == ["num_finished", "num_rejected", "num_unfinished"]
    values = captured.out.splitlines()[1].split()
    summary = pd.read_csv(tmp_path / "summary.csv").iloc[0]
    assert int(values[1]) == summary["num_rejected"] > 0
    assert "requests rejected" in captured.err and "long_prompt_policy" in captured.err


def test_clip_fits_prompt_plus_output_into_the_context():
    table = pd.DataFrame({"num_prompt_tokens": [100, 4000, 5000, 10], "num_output_tokens":
                          [50, 200, 10, 5000]})
    with pytest.warns(UserWarning, match="3 request"):
        clipped, counts = apply_long_prompt_policy(table, None, "clip", "t",
                                                   max_total_tokens=4096)
    total = clipped["num_prompt_tokens"] + clipped["num_output_tokens"]
    assert (total <= 4096).all() and (clipped["num_prompt_tokens"] >= 1).all()
    assert clipped["num_prompt_tokens"].tolist()[:3] == [100, 3896, 4086]
    assert counts["num_clipped"] == 3
    with pytest.warns(UserWarning):
        dropped, _ = apply_long_prompt_policy(table, None, "drop", "t", max_total_tokens=4096)
    assert len(dropped) == 1
    with pytest.raises(ValueError, match="prompt \\+ output > 4096"):
        apply_long_prompt_policy(table, None, "error", "t", max_total_tokens=4096)


def test_workload_clip_leaves_nothing_rejected():
    base = SimConfig().replace(name="azure-conv", num_requests=300)
    assert _quiet_simulate(base).summary()["num_rejected"] > 0
    with pytest.warns(UserWarning, match="clipped"):
        clipped = simsched.simulate(base.replace(long_prompt_policy="clip"))
    assert clipped.summary()["num_rejected"] == 0


# ----------------------------------------------------------------------------- 7: TTFT CDF per rate


def test_ttft_cdf_draws_one_titled_panel_per_rate():
    res = sweep(TINY, executor="serial", progress=False, rate=[2.0, 20.0], policy=["fcfs", "spf"])
    fig = plots.ttft_cdf(res.requests, res.runs, by=["policy"], panel="rate")
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["TTFT CDF: rate = 2.0", "TTFT CDF: rate = 20.0"]
    assert all(len(ax.get_lines()) == 2 for ax in fig.axes)         # one curve per policy


def test_cli_sweep_plots_ttft_cdf_per_rate(tmp_path, monkeypatch):
    drawn = []
    real = plots.ttft_cdf
    monkeypatch.setattr(plots, "ttft_cdf", lambda *a, **k: drawn.append(real(*a, **k)) or
                        drawn[-1])
    assert main(["sweep", "--num-requests", "20", "--vary", "rate=2,20", "--vary",
                 "policy=fcfs,spf", "--executor", "serial", "--quiet",
                 "--out", str(tmp_path)]) == 0
    assert len(drawn[0].axes) == 2 and (tmp_path / "ttft_cdf.png").exists()


# ----------------------------------------------------------------------------- 9: clean warnings


def test_cli_warnings_are_one_clean_line_each(tmp_path, capsys):
    assert main(["run", "--num-requests", "20", "--set", "max_model_len=200",
                 "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err and all(line.startswith("simsched: warning: ") for line in err), err
    assert not any(".py:" in line or "warnings.warn" in line for line in err)
    assert len(err) == len(set(err))


# ----------------------------------------------------------------------------- 12: one naming scheme


def test_summary_keys_follow_the_scheme():
    keys = set(_quiet_simulate(TINY).summary())
    for metric in METRICS:
        assert {f"{metric}_{s}" for s in ("mean", "p50", "p90", "p95", "p99")} <= keys, metric
    assert not any("median" in k or k.endswith("_ms") for k in keys)
    assert {"num_requests", "num_finished", "num_rejected", "num_unfinished",
            "request_throughput", "output_throughput", "total_token_throughput"} <= keys


def test_sweep_rows_use_the_summary_names():
    res = sweep(TINY, executor="serial", progress=False, rate=[5.0])
    summary = _quiet_simulate(res.configs[0].replace(max_sim_time=res.runs["max_sim_time"][0]))
    for key, value in summary.summary().items():
        assert res.runs.loc[0, key] == pytest.approx(value, nan_ok=True), key


VLLM_KEYS = {"date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id",
             "num_prompts", "request_rate", "burstiness", "max_concurrency", "duration",
             "completed", "failed", "total_input_tokens", "total_output_tokens",
             "request_throughput", "request_goodput", "output_throughput",
             "total_token_throughput", "max_output_tokens_per_s", "max_concurrent_requests",
             "rtfx"} | {f"{stat}_{m}_ms" for stat in ("mean", "median", "std", "p99")
                        for m in ("ttft", "tpot", "itl", "e2el")}


def test_vllm_export_has_exactly_the_bench_serve_keys_and_values():
    res = _quiet_simulate(TINY.replace(num_blocks=20, max_sim_time=3.0))
    out = res.to_vllm_bench()
    assert set(out) == VLLM_KEYS
    done = res.requests[res.requests["status"] == "finished"]
    assert out["completed"] == len(done) and out["failed"] == len(res.requests) - len(done) > 0
    assert out["mean_ttft_ms"] == pytest.approx(done["ttft"].mean() * 1e3)
    assert out["median_e2el_ms"] == pytest.approx(done["e2el"].median() * 1e3)
    assert out["std_ttft_ms"] == pytest.approx(np.std(done["ttft"]) * 1e3)
    assert out["p99_itl_ms"] == pytest.approx(np.percentile(res.itl_samples(), 99) * 1e3)
    assert out["total_output_tokens"] == done["num_output_tokens"].sum()
    more = res.to_vllm_bench(percentiles=(50, 99.9), percentile_metrics=("ttft",),
                             slo=SLO(ttft=0.5))
    assert {"p50_ttft_ms", "p99.9_ttft_ms"} <= set(more) and "mean_tpot_ms" not in more
    assert more["request_goodput"] is not None


def test_cli_writes_the_vllm_json(tmp_path):
    path = tmp_path / "bench.json"
    assert main(["run", "--num-requests", "20", "--out", str(tmp_path), "--vllm-json", str(path),
                 "--metric-percentiles", "50,99"]) == 0
    data = json.loads(path.read_text())
    assert data["completed"] == 20 and "p50_ttft_ms" in data and "p99_e2el_ms" in data


# ----------------------------------------------------------------------------- 13: populations


def test_summary_populations_when_the_run_is_cut():
    # Request 0 decodes 1000 tokens and is still running at t=50; request 1 finishes.
    res = _quiet_simulate(SimConfig().replace(max_sim_time=50.0, max_num_seqs=4),
                          requests=[(0.0, 8, 1000), (0.0, 8, 5)], cost_model=UnitCostModel())
    df, s = res.requests, res.summary()
    assert s["num_finished"] == 1 and s["num_unfinished"] == 1
    assert s["ttft_mean"] == pytest.approx(df["ttft"].mean())          # both requests
    assert s["e2el_mean"] == pytest.approx(df.loc[1, "e2el"])          # finished only
    assert s["tpot_mean"] == pytest.approx(df.loc[1, "tpot"])
    assert res.num_itl_samples > df.loc[1, "num_output_tokens"]        # in-flight gaps too
    readme = (ROOT / "docs" / "metrics.md").read_text()
    for row in ("| `ttft_*` | every request that received its first token",
                "| `e2el_*` | finished requests |", "| `tpot_*` | finished requests"):
        assert row in readme
    assert "population" in simsched.Results.summary.__doc__


# ----------------------------------------------------------------------------- 14: tidy frames


def test_written_run_carries_its_resolved_config_and_round_trips(tmp_path):
    res = _quiet_simulate(TINY.replace(num_blocks=12, max_num_seqs=4, preemption=True,
                                       policy="spf", num_requests=60, rate=20.0))
    assert len(res.preemptions) and res.preemptions["preempted_by"].dtype == "Int64"
    written = {p.name for p in res.to_csv(tmp_path / "csv")}
    assert "config.json" in written
    config = json.loads((tmp_path / "csv" / "config.json").read_text())
    assert config["cache"]["num_blocks"] == 12 and config["derived"]["num_blocks"] == 12
    back = read_frames(tmp_path / "csv")
    assert back["requests"]["reject_reason"].tolist() == res.requests["reject_reason"].tolist()
    pd.testing.assert_series_equal(back["preemptions"]["preempted_by"],
                                   res.preemptions["preempted_by"])
    res.to_parquet(tmp_path / "pq")
    assert read_frames(tmp_path / "pq")["requests"]["reject_reason"].tolist() == \
        res.requests["reject_reason"].tolist()


def test_derived_num_blocks_is_recorded(tmp_path):
    res = _quiet_simulate(TINY)
    res.to_csv(tmp_path)
    derived = json.loads((tmp_path / "config.json").read_text())["derived"]
    assert derived == {"num_blocks": 7422, "max_model_len": 4096}


def test_summary_returns_plain_python_numbers():
    for key, value in _quiet_simulate(TINY).summary().items():
        assert type(value) in (int, float), (key, type(value))


def test_results_repr_is_short():
    text = repr(_quiet_simulate(TINY))
    assert text.startswith("<Results: 30 requests (30 finished)") and len(text) < 150


def test_sweep_frames_carry_the_varied_fields_and_configs(tmp_path):
    res = sweep(TINY, executor="serial", progress=False, rate=[2.0, 20.0], policy=["fcfs"])
    assert list(res.requests.columns[:3]) == ["run_id", "rate", "policy"]
    assert res.requests.groupby("run_id")["rate"].first().tolist() == [2.0, 20.0]
    assert "rate" in res.iterations.columns
    res.to_csv(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert [r["point"]["rate"] for r in config["runs"]] == [2.0, 20.0]
    assert config["runs"][1]["config"]["workload"]["rate"] == 20.0
    assert config["runs"][0]["config"]["derived"]["max_sim_time"] > 0


# ----------------------------------------------------------------------------- 15: figures


def test_plots_return_figures_and_draw_into_given_axes(tmp_path):
    from matplotlib.figure import Figure

    res = _quiet_simulate(TINY.replace(num_blocks=12, max_num_seqs=4, preemption=True,
                                       policy="spf", num_requests=60, rate=20.0))
    fig = plots.timeline(res, path=tmp_path / "t.png")
    assert isinstance(fig, Figure) and len(fig.axes) == 3 and (tmp_path / "t.png").exists()
    host = Figure()
    axes = host.subplots(3, 1)
    assert plots.timeline(res, ax=axes) is host
    gantt = plots.gantt(res, max_requests=20)
    ax = gantt.axes[0]
    assert len(ax.get_yticks()) == 20
    labels = ax.get_legend_handles_labels()[1]
    assert {"queued", "prefill", "decode", "preempted"} <= set(labels)
    with pytest.raises(ValueError, match="max_requests"):
        plots.gantt(res, max_requests=0)


def test_cli_run_draws_timeline_and_gantt(tmp_path):
    assert main(["run", "--num-requests", "20", "--gantt", "10", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "timeline.png").stat().st_size > 1000
    assert (tmp_path / "gantt.png").stat().st_size > 1000


def test_plot_functions_are_documented():
    readme = (ROOT / "docs" / "api.md").read_text()
    for name in ("timeline", "gantt", "latency_vs_load", "ttft_cdf"):
        assert f"`{name}(" in readme, name
        assert getattr(plots, name).__doc__


# ----------------------------------------------------------------------------- 16: progress


def _terminal(monkeypatch):
    # A bar is drawn only where it can be redrawn (issue 24 item 14): pretend stderr is one.
    monkeypatch.setattr("simsched.analysis.progress._interactive", lambda stream: True)


def test_sweep_shows_progress_by_default_and_not_when_asked(capsys, monkeypatch):
    _terminal(monkeypatch)
    sweep(TINY, executor="serial", rate=[2.0, 4.0])
    assert "sweep" in capsys.readouterr().err
    sweep(TINY, executor="serial", progress=False, rate=[2.0, 4.0])
    assert capsys.readouterr().err == ""


def test_capacity_search_shows_progress_by_default():
    import inspect

    from simsched.analysis.capacity import capacity_search

    assert inspect.signature(capacity_search).parameters["progress"].default is True


def test_cli_quiet_turns_the_bar_off(tmp_path, capsys, monkeypatch):
    _terminal(monkeypatch)
    main(["sweep", "--num-requests", "20", "--vary", "rate=2,20", "--executor", "serial",
          "--out", str(tmp_path)])
    assert "sweep" in capsys.readouterr().err
    main(["sweep", "--num-requests", "20", "--vary", "rate=2,20", "--executor", "serial",
          "--quiet", "--out", str(tmp_path)])
    assert "sweep:" not in capsys.readouterr().err


# ----------------------------------------------------------------------------- 17: small CLI issues


def test_workers_zero_names_the_flag(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["sweep", "--workers", "0", "--vary", "rate=1,2"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--workers" in err and "max_workers" not in err


def test_policy_flags_list_every_registered_policy(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in VICTIM_POLICIES:
        assert name in text, name


def test_run_has_no_progress_flag_and_help_has_no_rst(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--quiet"])
    assert exc.value.code == 2
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "``" not in capsys.readouterr().out


def test_bad_percentiles_are_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--metric-percentiles", "120"])
    assert exc.value.code == 2 and capsys.readouterr().err.count("\n") == 1


def test_nan_free_summary_of_an_empty_run_has_all_keys():
    from simsched.analysis.runner import run

    # An empty workload table (simulate refuses an empty request list: issue 24 item 12).
    res = run(SimConfig(), requests=[], from_workload=True)[0]
    s = res.summary()
    assert s["num_requests"] == 0 and math.isnan(s["ttft_p50"])
