"""Requests created at arrival and recorded into arrays give the same frames as request objects."""

import numpy as np
import pandas as pd
import pytest

from simsched import SimConfig
from simsched.analysis import runner
from simsched.cluster.lazy import LazyRequests
from simsched.request import Status

CASES = {
    "fcfs": dict(num_blocks=96, max_num_seqs=16, rate=30.0, num_requests=300, seed=1),
    "spf_preempt": dict(num_blocks=96, max_num_seqs=16, rate=30.0, num_requests=300,
                        policy="spf", preemption=True, seed=2),
    "swap": dict(num_blocks=60, max_num_seqs=12, rate=25.0, num_requests=200,
                 preemption_mode="swap", victim_policy="newest", seed=3),
    "cut_short": dict(num_blocks=80, max_num_seqs=16, rate=60.0, num_requests=300,
                      max_sim_time=4.0, seed=4),
    "replicas_shed": {"cluster.num_replicas": 2, "cluster.max_num_queued_per_replica": 5,
                      "num_blocks": 80, "rate": 80.0, "num_requests": 300, "seed": 5},
}


def _both(changes, requests=None):
    cfg = SimConfig().replace(**changes)
    lazy, engine = runner.run(cfg, requests)
    assert engine is None
    eager, engine = runner.run(cfg, requests, keep_engine=True)
    assert not isinstance(engine.requests, LazyRequests)
    return lazy, eager


def _same(lazy, eager):
    pd.testing.assert_frame_equal(lazy.requests, eager.requests, check_exact=True)
    pd.testing.assert_frame_equal(lazy.preemptions, eager.preemptions, check_exact=True)
    pd.testing.assert_frame_equal(lazy.iterations, eager.iterations, check_exact=True)
    np.testing.assert_array_equal(lazy.itl_samples(), eager.itl_samples())
    assert lazy.summary() == eager.summary() or str(lazy.summary()) == str(eager.summary())


@pytest.mark.parametrize("name", sorted(CASES))
def test_lazy_requests_give_the_frames_of_request_objects(name):
    lazy, eager = _both(CASES[name])
    _same(lazy, eager)
    assert len(lazy.requests) == CASES[name]["num_requests"]


def test_lazy_path_keeps_tenants_priorities_rejections_and_pending_requests():
    table = pd.DataFrame({"arrival_at": [0.0, 0.1, 0.1, 0.3, 50.0],
                          "num_prompt_tokens": [40, 9000, 30, 20, 10],
                          "num_output_tokens": [30, 10, 300, 40, 5],
                          "priority": [1, 0, 2, 0, 1], "tenant": ["a", "b", None, "a", "b"]})
    with pytest.warns(UserWarning):
        lazy, eager = _both({"max_sim_time": 5.0}, table)
    _same(lazy, eager)
    statuses = lazy.requests["status"].tolist()
    assert statuses[1] == "rejected" and statuses[4] == "pending"
    assert lazy.requests["reject_reason"][1]


def test_lazy_store_holds_only_requests_in_flight():
    store = LazyRequests(np.array([0.0, 1.0]), np.array([5, 6]), np.array([2, 3]),
                         np.zeros(2, dtype=np.int64), None)
    first = next(iter(store))
    assert list(store.live) == [0]
    first.status, first.finished_at = Status.FINISHED, 1.5
    store.record(first)
    cols = store.columns()
    assert not store.live
    assert cols["status"] == ["finished", "pending"]
    assert cols["finished_at"][0] == 1.5 and np.isnan(cols["finished_at"][1])


def test_itl_percentiles_by_bisection_equal_the_joined_computation(monkeypatch):
    import math

    from simsched.analysis import itl
    from simsched.analysis.itl import ItlSamples, weighted_percentiles
    monkeypatch.setattr(itl, "BISECT_ABOVE", 0)
    rng = np.random.default_rng(0)
    qs = (0, 1, 50, 90, 95, 99, 100)
    for trial in range(200):
        n, m = int(rng.integers(0, 30)), int(rng.integers(0, 30))
        # Ties across the two parts on odd trials.
        gaps = rng.integers(0, 5, n) / 4 if trial % 2 else rng.random(n) * 10.0 ** (trial % 7 - 3)
        counts = rng.integers(0, 4, n)
        other = rng.integers(0, 5, m) / 4 if trial % 3 else rng.random(m)
        joined = weighted_percentiles(np.concatenate([gaps, other]),
                                      np.concatenate([counts, np.ones(m, dtype=np.int64)]), qs)
        got = ItlSamples(gaps, counts, other).percentiles(qs)
        assert all(a == b or (math.isnan(a) and math.isnan(b)) for a, b in zip(joined, got))


def test_sums_in_order_equal_bincount_sums():
    from simsched.analysis.replicas import _sum_in_order
    rng = np.random.default_rng(1)
    for n in (0, 1, 70_000, 200_001):      # across the chunk size
        x, k = rng.random(n) * 1e-3, rng.integers(0, 5000, n)
        zeros = np.zeros(n, dtype=np.int64)
        assert _sum_in_order(x)[0] == np.bincount(zeros, weights=x, minlength=1)[0]
        assert _sum_in_order(x, k)[0] == np.bincount(zeros, weights=k * x, minlength=1)[0]


def test_text_columns_are_stored_the_same_whatever_is_installed():
    """status and reject_reason hold Python strings (pandas 3's str dtype, python storage, or
    object before it): the frame does not depend on pyarrow, whose pool keeps a big run's memory."""
    lazy, eager = _both(CASES["replicas_shed"])
    for res in (lazy, eager):
        for name in ("status", "reject_reason"):
            dtype = res.requests[name].dtype
            if isinstance(pd.Series(["a"]).dtype, pd.StringDtype):
                assert isinstance(dtype, pd.StringDtype) and dtype.storage == "python", name
            else:
                assert dtype == object, name
    assert (lazy.requests["reject_reason"].str.startswith("shed")).any()


def test_request_frame_columns_are_the_recorded_fields_named_once():
    from simsched.cluster.records import REQUEST_FIELDS, RequestRecords
    from simsched.request import Request

    res = runner.run(SimConfig().replace(num_requests=20, rate=5.0))[0]
    recorded = [name for name, *_ in REQUEST_FIELDS]
    # Every recorded field is a column, in the table's order (derived columns interleave).
    columns = [c for c in res.requests.columns if c in recorded]
    assert columns == recorded
    # A position never recorded keeps each field's default; recorded ones take the object's.
    store = RequestRecords(3, prefix=True)
    req = Request(7, 1.5, 10, 4, priority=2, tenant="t")
    req.status, req.reject_reason = Status.REJECTED, "too long"
    store.record([req], [1])
    cols = store.columns()
    assert cols["request_id"].tolist() == [0, 7, 0]
    assert cols["tenant"] == [None, "t", None]
    assert cols["reject_reason"] == ["", "too long", ""]
    assert cols["status"] == ["pending", "rejected", "pending"]
    assert cols["session_id"].tolist() == [-1, -1, -1]      # no prompt contents
    assert np.isnan(cols["arrival_at"][[0, 2]]).all() and cols["arrival_at"][1] == 1.5
