"""Tests of goodput, SLO attainment and the saturation label."""

from __future__ import annotations

import math

import pandas as pd
import pytest

import simsched
from simsched import SimConfig
from simsched.analysis.slo import SLO, goodput, saturation_label, saturation_signals, summarize

# Unit cost model, one sequence at a time, 4 output tokens: every request takes exactly 4
# iterations of 1 s, so the engine serves 0.25 requests/s.
UNIT = SimConfig().replace(cost_model="unit", max_num_seqs=1, max_num_batched_tokens=64,
                           name="custom", arrival="deterministic", lengths="fixed",
                           prompt_len=16, output_len=4, num_requests=200, rate=0.1)


def frame() -> pd.DataFrame:
    return pd.DataFrame({
        "status": ["finished", "finished", "finished", "finished", "rejected", "waiting"],
        "arrival_at": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
        "finished_at": [2.0, 4.0, 9.0, 10.0, math.nan, math.nan],
        "ttft": [0.5, 1.5, 0.2, 0.4, math.nan, math.nan],
        "tpot": [0.05, 0.05, 0.3, math.nan, math.nan, math.nan],   # last: one output token
        "e2el": [2.0, 3.0, 7.0, 7.0, math.nan, math.nan],
    })


def test_goodput_matches_hand_count():
    df = frame()
    # ttft <= 1: rows 0, 2, 3; tpot <= 0.1 (NaN = single token passes): rows 0, 1, 3
    out = goodput(df, SLO(ttft=1.0, tpot=0.1))
    assert out["num_good"] == 2                    # rows 0 and 3
    assert out["goodput"] == pytest.approx(2 / 10.0)   # span: first arrival 0 .. last finish 10
    assert out["slo_attainment"] == pytest.approx(2 / 6)
    assert goodput(df, SLO(e2el=5.0))["num_good"] == 2
    # Rejected and unfinished requests are never good, however loose the SLO.
    assert goodput(df, SLO(ttft=1e9, tpot=1e9, e2el=1e9))["num_good"] == 4


@pytest.mark.parametrize("bad", [{}, {"ttft": 0}, {"tpot": -1.0}, {"e2el": math.inf},
                                 {"ttft": "1"}])
def test_slo_rejects_bad_values(bad):
    with pytest.raises(ValueError, match="(?i)slo"):
        SLO(**bad)


def test_clearly_stable_run_is_stable():
    res = simsched.simulate(UNIT.replace(rate=0.1))
    assert saturation_label(res) == "stable"
    assert summarize(res)["saturation"] == "stable"


def test_clearly_overloaded_run_is_overloaded():
    res = simsched.simulate(UNIT.replace(rate=0.5))     # twice the service rate
    signals = saturation_signals(res.requests, res.iterations)
    assert signals["queue_growth"] > 0.3
    assert saturation_label(res) == "overloaded"


def test_run_cut_by_time_limit_is_overloaded_and_reports_waiting():
    res = simsched.simulate(UNIT.replace(rate=0.5, max_sim_time=300.0))
    row = summarize(res)
    assert row["num_unfinished"] > 0
    assert row["num_waiting_at_end"] > 0
    assert row["saturation"] == "overloaded"


def test_summarize_adds_named_goodput_columns():
    res = simsched.simulate(UNIT.replace(num_requests=20))
    row = summarize(res, {"tight": SLO(ttft=0.01), "loose": SLO(ttft=100.0)})
    assert row["slo_attainment_loose"] == 1.0
    assert row["num_good_tight"] < row["num_good_loose"]
    assert "ttft_p50" in row and "ttft_median" not in row


def test_t_quantile_table_matches_scipy_where_available():
    from simsched.analysis.capacity import t_quantile_975

    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 5, 10, 29, 30, 31, 45, 60, 120, 1000):
        assert t_quantile_975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=2e-3)


def test_t_quantile_known_values():
    from simsched.analysis.capacity import t_quantile_975

    # Published 97.5 % points: df 1, 4, 30, 60, 120 and the normal limit.
    for df, value in ((1, 12.706), (4, 2.776), (30, 2.042), (60, 2.000), (120, 1.980)):
        assert t_quantile_975(df) == pytest.approx(value, abs=1e-3)
    assert t_quantile_975(10**6) == pytest.approx(1.95996, abs=1e-4)
    with pytest.raises(ValueError):
        t_quantile_975(0)
