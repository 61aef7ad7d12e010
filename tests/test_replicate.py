"""Intervals over seeds (issue 46, item 4): the t-interval is the textbook one, and each seed's
row is the run of that seed."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import simsched
from simsched import SimConfig
from simsched.analysis.replicate import intervals_of, t_cdf, t_quantile

# Student-t 0.975 quantiles from published tables (df: value).
T_975 = {1: 12.706204736, 2: 4.302652730, 5: 2.570581836, 10: 2.228138852, 30: 2.042272456,
         120: 1.979930405}


@pytest.mark.parametrize("df, value", sorted(T_975.items()))
def test_t_quantile_matches_the_tables(df, value):
    assert t_quantile(0.975, df) == pytest.approx(value, abs=1e-8)
    assert t_cdf(value, df) == pytest.approx(0.975, abs=1e-10)
    assert t_quantile(0.025, df) == pytest.approx(-value, abs=1e-8)


def test_intervals_are_mean_plus_minus_t_sem():
    runs = pd.DataFrame({"seed": [0, 1, 2, 3], "x": [1.0, 2.0, 4.0, 7.0], "flag": [True] * 4})
    row = intervals_of(runs, 0.95).set_index("metric").loc["x"]
    sem = np.std([1, 2, 4, 7], ddof=1) / 2
    assert row["mean"] == 3.5
    assert row["ci_high"] - row["mean"] == pytest.approx(t_quantile(0.975, 3) * sem)
    assert "flag" not in set(intervals_of(runs)["metric"])


def test_replicate_runs_each_seed():
    cfg = SimConfig().replace(rate=20.0, num_requests=40, seed=7)
    rep = simsched.replicate(cfg, seeds=3)
    assert list(rep.runs["seed"]) == [7, 8, 9]
    alone = simsched.simulate(cfg.replace(seed=8)).summary()
    assert rep.runs.iloc[1]["ttft_p99"] == alone["ttft_p99"]
    mean, low, high = rep.interval("ttft_p99")
    assert low < mean < high
    assert mean == pytest.approx(rep.runs["ttft_p99"].mean())
    assert math.isclose(rep.intervals.set_index("metric").loc["num_finished", "std"], 0.0)


@pytest.mark.parametrize("seeds, match", [(1, "at least 2"), ([3, 3], "distinct"),
                                          (True, "count or a list")])
def test_bad_seeds_are_refused(seeds, match):
    with pytest.raises(ValueError, match=match):
        simsched.replicate(SimConfig().replace(num_requests=5), seeds=seeds)


def test_bad_confidence_is_refused():
    with pytest.raises(ValueError, match="confidence"):
        simsched.replicate(SimConfig().replace(num_requests=5), seeds=2, confidence=95)


def test_sweep_intervals_group_by_the_other_factors():
    from simsched import sweep

    res = sweep(SimConfig().replace(num_requests=20), executor="serial", rate=[5.0, 20.0],
                seed=[0, 1, 2], progress=False)
    iv = res.intervals()
    rows = iv[iv["metric"] == "ttft_p99"].set_index("rate")
    for rate in (5.0, 20.0):
        values = res.runs[res.runs["rate"] == rate]["ttft_p99"]
        assert rows.loc[rate, "mean"] == pytest.approx(values.mean())
        assert rows.loc[rate, "num_seeds"] == 3
        sem = values.std(ddof=1) / math.sqrt(3)
        assert rows.loc[rate, "ci_high"] - rows.loc[rate, "mean"] == pytest.approx(
            t_quantile(0.975, 2) * sem)
    with pytest.raises(ValueError, match="did not vary it"):
        res.intervals("policy")


def test_latency_plot_draws_a_band_per_line_with_seeds():
    from simsched import sweep
    from simsched.analysis import plots

    res = sweep(SimConfig().replace(num_requests=20), executor="serial", rate=[5.0, 20.0],
                seed=[0, 1], progress=False)
    fig = plots.latency_vs_load(res.runs, by=[])
    assert all(len(ax.collections) == 1 for ax in fig.axes)      # one interval band each
    one = plots.latency_vs_load(res.runs[res.runs["seed"] == 0], by=[])
    assert all(len(ax.collections) == 0 for ax in one.axes)


def test_cli_sweep_seeds_writes_intervals(tmp_path):
    from simsched.cli import main

    out = tmp_path / "sw"
    assert main(["sweep", "--num-requests", "15", "--vary", "rate=5,20", "--seeds", "2",
                 "--executor", "serial", "--quiet", "--out", str(out)]) == 0
    iv = pd.read_csv(out / "intervals.csv")
    assert set(iv["rate"]) == {5.0, 20.0} and (iv["num_seeds"] == 2).all()
    assert main(["sweep", "--num-requests", "5", "--vary", "seed=0,1", "--seeds", "2",
                 "--executor", "serial", "--quiet", "--out", str(out)]) == 2
