"""Tests of sweeps, executors, export and capacity search."""

from __future__ import annotations

import pandas as pd
import pytest

from simsched import SimConfig
from simsched.analysis.slo import SLO
from simsched.analysis.capacity import SLOTarget, capacity_search
from simsched.analysis.sweep import sweep

TINY = SimConfig().replace(name="lesson", num_requests=40, rate=5.0)
UNIT = SimConfig().replace(cost_model="unit", max_num_seqs=1, max_num_batched_tokens=64,
                           name="custom", arrival="deterministic", lengths="fixed",
                           prompt_len=16, output_len=4, num_requests=120, rate=0.1)


def test_one_row_per_combination_with_varied_fields_and_metrics():
    res = sweep(TINY, executor="serial", progress=False, slos=SLO(ttft=0.5),
                rate=[2.0, 20.0], policy=["fcfs", "spf"], **{"cache.num_blocks": [400]})
    runs = res.runs
    assert len(runs) == 4
    assert list(runs["run_id"]) == [0, 1, 2, 3]
    assert set(zip(runs["rate"], runs["policy"])) == {(2.0, "fcfs"), (2.0, "spf"),
                                                      (20.0, "fcfs"), (20.0, "spf")}
    assert (runs["cache.num_blocks"] == 400).all()
    for col in ("ttft_mean", "ttft_p50", "ttft_p90", "ttft_p99", "tpot_p99", "itl_p99",
                "e2el_p99", "request_throughput", "goodput", "slo_attainment",
                "num_preemptions", "kv_usage_mean", "saturation", "num_rejected",
                "num_unfinished", "max_sim_time"):
        assert col in runs.columns, col
    assert set(runs["saturation"]) <= {"stable", "backlogged", "overloaded"}
    # Per-request frames are concatenated with their run id.
    assert len(res.requests) == 4 * 40
    assert res.requests.groupby("run_id").size().tolist() == [40] * 4
    assert set(res.iterations["run_id"]) == {0, 1, 2, 3}
    # The default time limit was applied (the config had none).
    assert (runs["max_sim_time"] < float("inf")).all()


def test_bad_factor_fails_before_running():
    with pytest.raises(ValueError, match="bogus"):
        sweep(TINY, executor="serial", progress=False, bogus=[1, 2])
    with pytest.raises(ValueError, match="executor"):
        sweep(TINY, executor="gpu", progress=False, rate=[1.0])


def test_parallel_and_serial_give_identical_rows_and_frames():
    kw = dict(progress=False, rate=[3.0, 30.0], policy=["fcfs", "spf"], seed=[0, 1])
    a = sweep(TINY, executor="serial", **kw)
    b = sweep(TINY, executor="local", max_workers=2, **kw)
    pd.testing.assert_frame_equal(a.runs, b.runs)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.iterations, b.iterations)
    # Different seeds really give different runs.
    assert a.runs.loc[0, "ttft_mean"] != a.runs.loc[1, "ttft_mean"]


def test_export_csv_and_parquet_round_trip(tmp_path):
    res = sweep(TINY, executor="serial", progress=False, rate=[2.0, 4.0])
    written = res.to_csv(tmp_path / "csv") + res.to_parquet(tmp_path / "pq")
    assert {p.name for p in written} == {f"{n}.{ext}" for n in
                                         ("runs", "requests", "iterations", "preemptions",
                                          "replicas")
                                         for ext in ("csv", "parquet")} | {"config.json"}
    back = pd.read_parquet(tmp_path / "pq" / "requests.parquet")
    assert len(back) == len(res.requests)
    assert pd.read_csv(tmp_path / "csv" / "runs.csv")["ttft_p99"].tolist() == \
        pytest.approx(res.runs["ttft_p99"].tolist())


def test_capacity_search_finds_analytic_capacity():
    # Deterministic arrivals, 4 s of service per request: the queue stays empty below
    # 0.25 req/s and grows without bound above it, so TTFT p99 <= 5 s holds up to 0.25.
    res = capacity_search(UNIT, {"ttft_p99": 5.0}, policies=["fcfs"], low=0.05, tol=0.02,
                          executor="serial")
    row = res.iloc[0]
    assert row["status"] == "ok"
    assert 0.25 * (1 - 0.03) <= row["capacity"] <= 0.25 * 1.001
    assert row["bracket_high"] > 0.25
    assert row["ci_low"] <= row["capacity"] <= row["ci_high"]
    runs = res.attrs["runs"]
    assert runs["holds"].tolist() == (runs["rate"] <= 0.25 + 1e-12).tolist()
    assert row["num_runs"] == len(runs)


def test_capacity_search_over_seeds_reports_interval():
    res = capacity_search(UNIT.replace(arrival="poisson", num_requests=60), {"ttft_p99": 12.0},
                          policies=["fcfs"], seeds=[0, 1, 2], low=0.05, tol=0.05,
                          executor="local", max_workers=2)
    row = res.iloc[0]
    seeds = res.attrs["seed_capacities"]
    assert seeds["seed"].tolist() == [0, 1, 2] and (seeds["policy"] == "fcfs").all()
    assert seeds["capacity"].dtype == float
    assert 0.05 < row["capacity"] < 0.3
    assert row["ci_low"] <= row["ci_high"]


def test_capacity_target_validation():
    with pytest.raises(ValueError):
        SLOTarget()
    with pytest.raises(ValueError, match="min_attainment"):
        SLOTarget(min_attainment=0.9)
    with pytest.raises(ValueError, match="not a sweep column"):
        capacity_search(UNIT, {"ttft_p999": 1.0}, low=0.1, executor="serial")
