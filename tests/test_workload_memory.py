"""Memory of big workloads: drawn once, read in place, held compactly by a streamed run.

A streamed fleet day is tens of millions of requests; these tests hold its start-up to what it
needs (numpy's buffers are traced by tracemalloc) and check the same numbers come out.
"""

import tracemalloc

import numpy as np
import pandas as pd
import pytest

from simsched.analysis import stream
from simsched.analysis.request_table import make_requests, request_columns
from simsched.workloads import rate_schedule as rs
from simsched.workloads.workload import WorkloadConfig, generate

SCHEDULE = ((300.0, 400.0, 2.0), (300.0, 0.0), (300.0, 900.0, 0.5), (300.0, 200.0, 6.0))
BIG = WorkloadConfig(name="custom", lengths="uniform", prompt_range=(128, 2048),
                     output_range=(64, 512), arrival="windows", rate_schedule=SCHEDULE)


def reference_windowed(seed, windows, duration=None):
    """Each window drawn in turn, joined, sorted and cut (what windowed() must equal)."""
    rng = np.random.default_rng(seed)
    parts = [rs.window_arrivals(rng, start, seconds, rate, cv, family)
             for start, seconds, rate, cv, family in zip(
                 windows["start"], windows["seconds"], windows["rate"], windows["cv"],
                 windows["family"]) if duration is None or start < duration]
    times = np.sort(np.concatenate(parts))
    return times[times < duration] if duration is not None else times


@pytest.mark.parametrize("duration", [None, 750.0])
def test_windowed_draws_every_window_as_before(monkeypatch, duration):
    windows = rs.windows_from_schedule(SCHEDULE, family="weibull")
    expected = reference_windowed(4, windows, duration)
    got = rs.windowed(np.random.default_rng(4), windows, duration=duration)
    np.testing.assert_array_equal(got, expected)
    # A buffer too small for the windows (a window that needs a second batch of gaps) grows.
    monkeypatch.setattr(rs, "_capacity", lambda rows, scale, limit=None: 1)
    np.testing.assert_array_equal(
        rs.windowed(np.random.default_rng(4), windows, duration=duration), expected)


def traced_peak(fn):
    """``(result, peak bytes traced while fn ran)``."""
    tracemalloc.start()
    try:
        result = fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak


def test_generate_keeps_the_drawn_arrays_as_columns():
    frame, peak = traced_peak(lambda: generate(BIG, np.random.default_rng(0)))
    n = len(frame)
    assert n > 300_000
    # Columns: arrival 8 (in a buffer sized for the windows' first batches, ~1.2x),
    # prompt 8, output 8, priority 8, tenant 8 bytes a request. Copying them into the frame
    # (the default for arrays given to pandas) would double it.
    assert peak < 56 * n, peak / n
    assert list(frame.columns) == ["arrival_at", "num_prompt_tokens", "num_output_tokens",
                                   "priority", "tenant"]
    assert frame["tenant"].dtype == object and frame["tenant"].isna().all()
    assert frame["arrival_at"].is_monotonic_increasing


def test_streamed_start_up_reads_columns_in_place_and_holds_13_bytes(tmp_path):
    frame = generate(BIG, np.random.default_rng(1))
    n = len(frame)

    def start_up():     # as a streamed run starts
        columns = list(request_columns(frame, 512, lazy=True, copy=False))
        assert columns.pop() is None
        return stream.StreamingRequests.taking(tmp_path, columns, prefix=False)

    store, peak = traced_peak(start_up)
    # Read in place, then stored as float64 arrival, int16 lengths, int8 priority, no tenants:
    # no list of prompts or tenants, no int64 copies.
    assert peak < 16 * n, peak / n
    assert not np.shares_memory(store.arrival, frame["arrival_at"].to_numpy())
    assert (store.prompt.dtype, store.output.dtype, store.priority.dtype) == (
        np.int16, np.int16, np.int8)
    assert store.tenant is None
    held = sum(a.nbytes for a in (store.arrival, store.prompt, store.output, store.priority))
    assert held == 13 * n
    np.testing.assert_array_equal(store.arrival, frame["arrival_at"].to_numpy())
    np.testing.assert_array_equal(store.prompt, frame["num_prompt_tokens"].to_numpy())
    np.testing.assert_array_equal(store.output, frame["num_output_tokens"].to_numpy())
    np.testing.assert_array_equal(store.priority, 0)


def test_request_columns_copy_false_views_the_table():
    frame = pd.DataFrame({"arrival_at": [0.0, 1.0, 2.5], "num_prompt_tokens": [3, 4, 5],
                          "num_output_tokens": [1, 2, 3], "priority": [0, 2, -1],
                          "tenant": [None, None, None]})
    viewed = request_columns(frame, 512, copy=False)
    copied = request_columns(frame, 512)
    for k, column in enumerate(("arrival_at", "num_prompt_tokens", "num_output_tokens",
                                "priority")):
        np.testing.assert_array_equal(viewed[k], copied[k])
        assert np.shares_memory(viewed[k], frame[column].to_numpy())
        # (copy=True may still return a view where pandas does: pandas 2 for float columns.)
    # No request has a tenant: no list of them.
    assert viewed[4] is None and copied[4] is None and viewed[5] is None


@pytest.mark.parametrize("tenant, expected", [
    ([None, None, None], None),
    ([None, float("nan"), None], [None, None, None]),   # NaN means none, as before
    ([None, "a", None], [None, "a", None]),
    ([7, 8, 9], [7, 8, 9]),
])
def test_tenant_column_without_tenants_is_none(tenant, expected):
    frame = pd.DataFrame({"arrival_at": [0.0, 1.0, 2.0], "num_prompt_tokens": [3, 4, 5],
                          "num_output_tokens": [1, 2, 3],
                          "tenant": pd.Series(tenant, dtype=object)})
    assert request_columns(frame, 512)[4] == expected
    assert [r.tenant for r in make_requests(frame)] == (expected or [None] * 3)


def test_priority_checks_hold_when_read_in_place():
    frame = pd.DataFrame({"arrival_at": [0.0, 1.0], "num_prompt_tokens": [3, 4],
                          "num_output_tokens": [1, 2],
                          "priority": np.array([1, 2**63], dtype=np.uint64)})
    with pytest.raises(ValueError, match=r"requests\[1\]\.priority"):
        request_columns(frame, 512, copy=False)
    frame["priority"] = [1.5, 2.0]
    with pytest.raises(ValueError, match=r"requests\[0\]\.priority"):
        request_columns(frame, 512, copy=False)
    frame["arrival_at"] = [0.0, np.nan]
    with pytest.raises(ValueError, match=r"requests\[1\]\.arrival_at"):
        request_columns(frame, 512, copy=False)


@pytest.mark.parametrize("values, dtype", [
    ([0, 0], np.int8), ([-128, 127], np.int8), ([128, 1], np.int16), ([1, 40_000], np.int32),
    ([1, 2**31], np.int64), ([-(2**40), 0], np.int64), ([], np.int64),
])
def test_streaming_store_narrows_integers_exactly(values, dtype):
    narrowed = stream._narrow(np.array(values, dtype=np.int64))
    assert narrowed.dtype == dtype
    np.testing.assert_array_equal(narrowed, values)
