"""Rate-schedule arrivals: each window's rate and CV, scaling, the ServeGen reader, config checks."""

import math

import numpy as np
import pandas as pd
import pytest

from simsched.workloads import rate_schedule as rs
from simsched.workloads.workload import WorkloadConfig, generate

SCHEDULE = ((4000.0, 5.0, 1.0), (4000.0, 20.0, 3.0), (4000.0, 2.0, 0.5), (4000.0, 0.0, 1.0),
            (4000.0, 10.0, 6.0))


@pytest.mark.parametrize("family", ["gamma", "weibull"])
def test_windows_reproduce_each_windows_rate_and_cv(family):
    rng = np.random.default_rng(11)
    times = rs.windowed(rng, rs.windows_from_schedule(SCHEDULE, family=family))
    assert np.all(np.diff(times) >= 0)
    for k, (seconds, rate, cv) in enumerate(SCHEDULE):
        lo, hi = k * seconds, (k + 1) * seconds
        inside = times[(times >= lo) & (times < hi)]
        expected = rate * seconds
        if rate == 0:
            assert len(inside) == 0
            continue
        # A stationary renewal count has variance ~ expected * cv**2: 5 standard deviations.
        assert abs(len(inside) - expected) <= 5 * cv * math.sqrt(expected), (k, len(inside))
        gaps = np.diff(inside)
        measured_cv = gaps.std() / gaps.mean()
        assert measured_cv == pytest.approx(cv, rel=0.15 if cv > 2 else 0.05), (k, measured_cv)


def test_high_cv_windows_are_not_biased_by_restarts():
    # 400 short windows of CV 8: a renewal process restarted at each window start would add
    # about (64 - 1) / 2 = 31 arrivals per window (+50 %); the stationary start adds none.
    schedule = tuple((60.0, 1.0, 8.0) for _ in range(400))
    counts = [len(rs.windowed(np.random.default_rng(s), rs.windows_from_schedule(schedule)))
              for s in range(5)]
    expected = 60.0 * 400
    assert abs(np.mean(counts) - expected) / expected < 0.1


def test_rate_rescales_schedule_keeping_its_shape():
    table = rs.windows_from_schedule(((1000.0, 2.0), (1000.0, 6.0)))
    assert rs.mean_rate(table) == pytest.approx(4.0)
    times = rs.windowed(np.random.default_rng(3), table, rate=40.0)
    assert len(times) / 2000.0 == pytest.approx(40.0, rel=0.03)
    first, second = (times < 1000).sum(), (times >= 1000).sum()
    assert second / first == pytest.approx(3.0, rel=0.05)


def test_weibull_shape_inverts_the_cv():
    for cv in (0.3, 1.0, 2.5, 8.0):
        k = rs.weibull_shape(cv)
        cv_back = math.sqrt(math.gamma(1 + 2 / k) / math.gamma(1 + 1 / k) ** 2 - 1)
        assert cv_back == pytest.approx(cv, rel=1e-3)


def test_bundled_servegen_day_reads_and_replays_at_scale():
    table = rs.read_servegen(model="m-large")
    assert set(table.columns) == set(rs.WINDOW_COLUMNS)
    assert rs.span(table) == (0.0, 86400.0)
    totals = rs.total_rates(table)
    assert len(totals) == 144 and totals.max() / totals.min() > 3      # a daily swing
    cfg = WorkloadConfig(name="custom", arrival="servegen", rate=50.0, duration=3600.0,
                         lengths="fixed")
    frame = generate(cfg, np.random.default_rng(0))
    assert frame["arrival_at"].max() < 3600.0
    # The first hour's share of the day's (scaled) traffic.
    hour = table[table["start"] < 3600.0]
    expected = 3600.0 * 50.0  # rate scales the period read (one hour) to 50 req/s
    scale = 50.0 / rs.mean_rate(rs.read_servegen(duration=3600.0))
    sd = math.sqrt((scale * hour["rate"] * 600 * hour["cv"] ** 2).sum())
    assert abs(len(frame) - expected) <= 5 * sd
    assert rs.mean_rate(rs.read_servegen(duration=3600.0)) == pytest.approx(
        (hour["rate"] * 600).sum() / 3600.0)


def test_servegen_reader_errors_name_the_file(tmp_path):
    bad = tmp_path / "w.csv"
    pd.DataFrame({"model": ["m-large"], "client": [0], "window_start_s": [0],
                  "rate": [1.0]}).to_csv(bad, index=False)
    with pytest.raises(ValueError, match=r"w\.csv: missing column"):
        rs.read_servegen(bad)
    pd.DataFrame({"model": ["m-large"], "client": [0], "window_start_s": [0], "rate": [1.0],
                  "cv": [float("nan")], "dist": ["Gamma"]}).to_csv(bad, index=False)
    with pytest.raises(ValueError, match=r"w\.csv: row 2"):
        rs.read_servegen(bad)
    with pytest.raises(ValueError, match="no model 'm-huge'"):
        rs.read_servegen(model="m-huge")


@pytest.mark.parametrize("changes, message", [
    (dict(arrival="windows"), "rate_schedule is required"),
    (dict(arrival="windows", rate_schedule=((10, 1, 0),)), "cv > 0"),
    (dict(arrival="piecewise", rate_schedule=((10, 1, 2),)), r"\(\(seconds, rate\), \.\.\.\)"),
    (dict(arrival="windows", rate_schedule=((10, 1),), gap_family="lognormal"), "gap_family"),
    (dict(arrival="servegen", servegen_model="m-huge"), "servegen_model"),
])
def test_schedule_config_errors(changes, message):
    with pytest.raises(ValueError, match=message):
        WorkloadConfig(name="custom", **changes)


def test_windows_config_generates_once_not_cyclically():
    cfg = WorkloadConfig(name="custom", arrival="windows", rate_schedule=((100, 5), (100, 1, 2)),
                         lengths="fixed")
    assert cfg.resolved_rate is None and cfg.resolved_num_requests is None
    frame = generate(cfg, np.random.default_rng(1))
    assert frame["arrival_at"].max() < 200.0 and len(frame) > 400
