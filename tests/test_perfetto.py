"""The Chrome/Perfetto trace of a run: valid trace-event JSON whose spans nest and whose times are
the frames' (issue 46, item 1)."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest

import simsched
from simsched import SimConfig
from simsched.analysis.perfetto import TraceWindowWarning, chrome_trace


@pytest.fixture(scope="module")
def run():
    cfg = SimConfig().replace(rate=30.0, num_requests=60, seed=3, preemption=True, num_blocks=24,
                              check_invariants=True)
    return simsched.simulate(cfg, record_steps=True)


def _spans(trace):
    by_track = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            by_track[(e["pid"], e["tid"])].append(e)
    return by_track


def _assert_nested(spans):
    """Spans on one track form a forest: each one lies inside the last open one or after it."""
    stack = []
    for e in sorted(spans, key=lambda e: (e["ts"], -e["dur"])):
        start, end = e["ts"], e["ts"] + e["dur"]
        while stack and stack[-1][1] <= start + 1e-6:
            stack.pop()
        if stack:
            assert end <= stack[-1][1] + 1e-6, f"{e['name']} at {start} overlaps its parent"
        stack.append((start, end))


def test_trace_is_valid_json_and_spans_nest(run, tmp_path):
    path = run.to_perfetto(tmp_path / "run.json")
    trace = json.loads(path.read_text())
    assert trace["displayTimeUnit"] == "ms"
    for e in trace["traceEvents"]:
        assert e["ph"] in {"X", "i", "C", "M"}
        assert isinstance(e["pid"], int)
        if e["ph"] != "M":
            assert e["ts"] >= 0
        if e["ph"] == "X":
            assert e["dur"] >= 0
    for track, spans in _spans(trace).items():
        _assert_nested(spans)


def test_trace_times_and_counts_are_the_frames(run):
    trace = chrome_trace(run)
    events = trace["traceEvents"]
    iterations = [e for e in events if e["ph"] == "X" and e["cat"] == "iteration"]
    assert len(iterations) == len(run.iterations)
    its = run.iterations
    assert sorted(e["ts"] for e in iterations) == pytest.approx(
        sorted(its["started_at"].to_numpy() * 1e6), abs=1e-3)
    assert sum(e["args"]["num_decode_tokens"] for e in iterations) == its["num_decode_tokens"].sum()
    requests = {e["args"]["request_id"]: e for e in events if e["ph"] == "X" and e["name"] == "request"}
    served = run.requests[run.requests["status"] != "rejected"]
    assert len(requests) == len(served)
    rejected = [e for e in events if e["name"] == "rejected"]
    assert len(rejected) == (run.requests["status"] == "rejected").sum() == 1
    assert "KV blocks" in rejected[0]["args"]["reason"]
    for row in served.itertuples():
        span = requests[row.request_id]
        assert span["ts"] == pytest.approx(row.arrival_at * 1e6, abs=1e-3)
        assert span["ts"] + span["dur"] == pytest.approx(row.finished_at * 1e6, abs=2e-3)
        assert span["pid"] == row.replica + 1 and span["tid"] == row.request_id + 1
    preempted = [e for e in events if e["name"] == "preempted"]
    assert len(preempted) == len(run.preemptions) > 0
    steps = [e for e in events if e["name"] == "step"]
    # every recorded step of a request lies in one of its phases and is drawn
    assert len(steps) == len(run.steps)
    routes = [e for e in events if e["name"] == "route"]
    assert len(routes) == len(served)


def test_phases_follow_the_request(run):
    events = chrome_trace(run)["traceEvents"]
    row = run.requests.iloc[5]
    mine = {e["name"]: e for e in events if e["ph"] == "X" and e["tid"] == row.request_id + 1
            and e["name"] != "step"}
    assert mine["queued"]["ts"] == pytest.approx(row.arrival_at * 1e6, abs=1e-3)
    assert mine["prefill"]["ts"] == pytest.approx(row.first_scheduled_at * 1e6, abs=1e-3)
    assert mine["decode"]["ts"] == pytest.approx(row.engine_first_token_at * 1e6, abs=1e-3)
    assert mine["output"]["ts"] + mine["output"]["dur"] == pytest.approx(
        row.finished_at * 1e6, abs=2e-3)


def test_window_and_caps_bound_the_trace(run):
    with pytest.warns(TraceWindowWarning, match="max_num_requests=10"):
        trace = chrome_trace(run, max_num_requests=10)
    assert trace["otherData"]["num_requests"] == 10
    cut = trace["otherData"]["end_at"]
    started = [e["ts"] for e in trace["traceEvents"] if e.get("cat") == "iteration"]
    assert max(started) < cut * 1e6
    part = chrome_trace(run, start_at=0.5, end_at=1.0)
    arrivals = run.requests["arrival_at"].to_numpy()
    assert part["otherData"]["num_requests"] == int(((arrivals >= 0.5) & (arrivals < 1.0)).sum())
    with pytest.warns(TraceWindowWarning, match="max_num_iterations=50"):
        small = chrome_trace(run, max_num_iterations=50)
    assert small["otherData"]["num_iterations"] == 50


@pytest.mark.parametrize("kwargs, field", [({"max_num_requests": 0}, "max_num_requests"),
                                           ({"max_num_iterations": 1.5}, "max_num_iterations"),
                                           ({"start_at": "0"}, "start_at"),
                                           ({"start_at": 2.0, "end_at": 1.0}, "end_at")])
def test_bad_window_is_refused_naming_the_field(run, kwargs, field):
    with pytest.raises(ValueError, match=field):
        chrome_trace(run, **kwargs)


def test_bad_paths_are_refused_before_the_work(run, tmp_path):
    afile = tmp_path / "f"
    afile.write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        run.to_perfetto(afile / "t.json")
    with pytest.raises(ValueError, match="directory"):
        run.to_perfetto(tmp_path)
    with pytest.raises(TypeError, match="file path"):
        run.to_perfetto(5)


def test_disaggregated_run_draws_kv_transfers():
    from simsched.config import ClusterConfig

    cfg = SimConfig().replace(rate=20.0, num_requests=30, seed=2,
                              cluster=ClusterConfig(num_replicas=2, num_prefill_replicas=1,
                                                    num_decode_replicas=1))
    res = simsched.simulate(cfg)
    trace = chrome_trace(res)
    transfers = [e for e in trace["traceEvents"] if e["name"] == "kv_transfer"]
    assert transfers and all(e["dur"] > 0 for e in transfers)
    for spans in _spans(trace).values():
        _assert_nested(spans)
    assert np.isfinite(res.requests["kv_transfer_time"]).all()
