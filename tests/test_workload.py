"""Tests of workloads: arrival processes, length distributions, trace loading and replay."""

from __future__ import annotations

import dataclasses
import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simsched.workloads import arrivals
from simsched.workloads import lengths
from simsched.workloads import traces
from simsched.workloads.traces import TraceFormatError, TraceWarning
from simsched.workloads.workload import REQUEST_COLUMNS, WORKLOADS, WorkloadConfig, describe, generate

FIXTURES = Path(__file__).parent / "fixtures" / "traces"
AZURE_SRC = Path("/work/shared/data/traces/azure-llm-2023")


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def cv_of(times: np.ndarray) -> float:
    gaps = np.diff(times)
    return gaps.std() / gaps.mean()


# ---------------------------------------------------------------- arrival processes

@pytest.mark.parametrize("rate", [0.5, 8.0, 100.0])
def test_poisson_rate_and_cv(rate):
    times = arrivals.poisson(rng(1), rate, n=40_000)
    assert np.all(np.diff(times) > 0)
    assert arrivals.recorded_rate(times) == pytest.approx(rate, rel=0.03)
    assert cv_of(times) == pytest.approx(1.0, abs=0.03)


@pytest.mark.parametrize("cv", [0.3, 1.0, 4.0])
def test_gamma_rate_and_cv(cv):
    times = arrivals.gamma(rng(2), 5.0, cv, n=100_000)
    assert arrivals.recorded_rate(times) == pytest.approx(5.0, rel=0.05)
    assert cv_of(times) == pytest.approx(cv, rel=0.06)


def test_duration_bounds_and_bursty_fill():
    # CV 13 needs more gaps than the first batch: the fill loop must cover the whole window.
    times = arrivals.gamma(rng(3), 10.0, 13.0, duration=200.0)
    assert times.max() < 200.0
    counts = [len(arrivals.gamma(rng(s), 10.0, 13.0, duration=200.0)) for s in range(30)]
    assert np.mean(counts) == pytest.approx(2000, rel=0.35)


def test_deterministic():
    times = arrivals.deterministic(4.0, n=5)
    np.testing.assert_allclose(times, [0.25, 0.5, 0.75, 1.0, 1.25])
    assert len(arrivals.deterministic(4.0, duration=10.0)) == 39   # 0.25 .. 9.75
    assert cv_of(arrivals.deterministic(4.0, n=100)) == pytest.approx(0.0, abs=1e-9)


def test_piecewise_schedule_rates():
    schedule = ((10.0, 2.0), (10.0, 20.0), (5.0, 0.0))
    times = arrivals.piecewise(rng(4), schedule, duration=25_000.0)
    phase = times % 25.0
    assert not np.any(phase >= 20.0)          # the zero-rate segment stays silent
    cycles = 1000
    assert np.sum(phase < 10) / (10 * cycles) == pytest.approx(2.0, rel=0.05)
    assert np.sum((phase >= 10) & (phase < 20)) / (10 * cycles) == pytest.approx(20.0, rel=0.03)
    scaled = arrivals.piecewise(rng(4), schedule, n=50_000, rate=3.0)
    assert arrivals.recorded_rate(scaled) == pytest.approx(3.0, rel=0.03)


def test_onoff_mean_rate_and_burstiness():
    times = arrivals.onoff(rng(5), 4.0, on_seconds=5.0, off_seconds=15.0, n=40_000)
    assert arrivals.recorded_rate(times) == pytest.approx(4.0, rel=0.05)
    assert not np.any(times % 20.0 >= 5.0)
    assert cv_of(times) > 1.5


def test_rescale_to_speedup_and_rate():
    times = np.array([10.0, 11.0, 13.0, 20.0])
    np.testing.assert_allclose(arrivals.rescale(times, speedup=2.0, origin=10.0), [0, .5, 1.5, 5])
    out = arrivals.rescale(times, rate=3.0, origin=10.0)
    assert arrivals.recorded_rate(out) == pytest.approx(3.0)


# ---------------------------------------------------------------- lengths

def test_length_distributions():
    p, o = lengths.lognormal(rng(0), 10_000)
    assert p.min() >= 10 and p.max() <= 512 and o.min() >= 10 and o.max() <= 512
    p, o = lengths.fixed(3, 7, 9)
    assert list(p) == [7, 7, 7] and list(o) == [9, 9, 9]
    p, o = lengths.uniform(rng(0), 20_000, (5, 8), (100, 100))
    assert set(p) == {5, 6, 7, 8} and set(o) == {100}


def test_empirical_keeps_pairs():
    prompt = np.array([10, 1000, 50])
    output = np.array([500, 3, 77])
    p, o = lengths.empirical(rng(0), 5000, prompt, output)
    pairs = set(zip(prompt, output))
    assert set(zip(p, o)) == pairs
    cfg = WorkloadConfig(name="custom", lengths="empirical",
                         lengths_path=str(FIXTURES / "lengths_pairs.csv"))
    frame = generate(cfg, rng(0))
    assert set(zip(frame.num_prompt_tokens, frame.num_output_tokens)) == {(10, 100), (1000, 5)}


def test_sharegpt_workload_resamples_bundled_pairs():
    all_pairs, _ = traces.read_trace(traces.bundled_path("sharegpt"), require_times=False)
    assert len(all_pairs) == 30_731
    known = set(zip(all_pairs.num_prompt_tokens, all_pairs.num_output_tokens))
    frame = generate(WorkloadConfig(name="sharegpt", num_requests=2000), rng(0))
    assert set(zip(frame.num_prompt_tokens, frame.num_output_tokens)) <= known
    assert np.corrcoef(frame.num_prompt_tokens, frame.num_output_tokens)[0, 1] == pytest.approx(
        np.corrcoef(all_pairs.num_prompt_tokens, all_pairs.num_output_tokens)[0, 1], abs=0.08)


# ---------------------------------------------------------------- Azure traces

@pytest.mark.parametrize("name,count,first,last", [
    ("azure-code", 8819, (4808, 10), (549, 173)),
    ("azure-conv", 19366, (374, 44), (197, 183)),
])
def test_bundled_azure_counts_and_rows(name, count, first, last):
    frame = traces.load_trace(traces.bundled_path(name))
    assert len(frame) == count
    assert tuple(frame[["num_prompt_tokens", "num_output_tokens"]].iloc[0]) == first
    assert tuple(frame[["num_prompt_tokens", "num_output_tokens"]].iloc[-1]) == last
    assert frame.arrival_at.iloc[0] == 0.0 and frame.arrival_at.is_monotonic_increasing
    report = frame.attrs["load_report"]
    assert report.num_rows == count and report.num_unsorted == 0


def test_azure_timestamps_exact():
    frame = traces.load_trace(FIXTURES / "azure_ok.csv")
    # 7 fractional digits: 18:17:03.9799600 -> 18:17:04.0319600 is 52 ms.
    np.testing.assert_allclose(frame.arrival_at, [0.0, 0.052, 1.52004, 10.0], atol=1e-9)
    assert list(frame.num_output_tokens) == [10, 20, 30, 40]


@pytest.mark.skipif(not AZURE_SRC.exists(), reason="shared data not mounted")
def test_bundled_matches_published_csv():
    raw = pd.read_csv(AZURE_SRC / "AzureLLMInferenceTrace_conv.csv")
    stamps = pd.to_datetime(raw.TIMESTAMP)
    expected = (stamps - stamps.iloc[0]).dt.total_seconds().to_numpy()
    frame = traces.load_trace(traces.bundled_path("azure-conv"))
    np.testing.assert_allclose(frame.arrival_at, expected, atol=1e-6)
    np.testing.assert_array_equal(frame.num_prompt_tokens, raw.ContextTokens)


def test_azure_replay_reproduces_arrivals_up_to_scaling():
    full = generate(WorkloadConfig.preset("azure-code"), rng(0))
    fast = generate(WorkloadConfig.preset("azure-code", speedup=4.0), rng(1))
    np.testing.assert_allclose(fast.arrival_at, full.arrival_at / 4.0)
    np.testing.assert_array_equal(fast.num_prompt_tokens, full.num_prompt_tokens)
    rated = generate(WorkloadConfig.preset("azure-code", rate=10.0), rng(0))
    assert describe(rated)["rate"] == pytest.approx(10.0)
    np.testing.assert_allclose(rated.arrival_at / rated.arrival_at.iloc[-1],
                               full.arrival_at / full.arrival_at.iloc[-1])
    assert describe(full)["interarrival_cv"] == pytest.approx(13.15, abs=0.05)


def test_window_limit_and_speedup():
    full = traces.load_trace(traces.bundled_path("azure-conv"))
    cfg = WorkloadConfig.preset("azure-conv", start=600.0, duration=300.0, speedup=2.0)
    frame = generate(cfg, rng(0))
    inside = full[(full.arrival_at >= 600) & (full.arrival_at < 900)]
    assert len(frame) == len(inside) > 100
    np.testing.assert_allclose(frame.arrival_at, (inside.arrival_at - 600) / 2.0)
    assert frame.arrival_at.max() < 150.0
    limited = generate(dataclasses.replace(cfg, num_requests=50), rng(0))
    assert len(limited) == 50
    np.testing.assert_allclose(limited.arrival_at, frame.arrival_at[:50])
    report = limited.attrs["load_report"]
    assert report.num_in_window == len(inside) and report.num_returned == 50


def test_default_direct_config_replays_as_recorded():
    # WorkloadConfig(name="azure-conv") is the preset: the whole trace at its recorded rate.
    frame = generate(WorkloadConfig(name="azure-conv"), rng(0))
    full = traces.load_trace(traces.bundled_path("azure-conv"))
    np.testing.assert_array_equal(frame.arrival_at, full.arrival_at)
    assert WorkloadConfig(name="azure-conv") == WorkloadConfig.preset("azure-conv")
    # Asking for a rate or a count still rescales and caps.
    frame = generate(WorkloadConfig(name="azure-conv", rate=8.0, num_requests=500), rng(0))
    assert len(frame) == 500
    assert describe(frame)["rate"] == pytest.approx(8.0)


def test_synthetic_defaults_resolve_to_8_per_second_and_500_requests():
    cfg = WorkloadConfig()
    assert (cfg.resolved_rate, cfg.resolved_num_requests) == (8.0, 500)
    assert len(generate(cfg, rng(0))) == 500
    assert WorkloadConfig(duration=10.0).resolved_num_requests is None
    piecewise = WorkloadConfig(arrival="piecewise", rate_schedule=((5, 1), (5, 10)))
    assert piecewise.resolved_rate is None          # a schedule is used as given


ISSUE_TRACE = "arrival_at,num_prompt_tokens,num_output_tokens\n0,10,5\n0.37,10,5\n1.0,10,5\n5.0,10,5\n"


def test_trace_replays_as_recorded_through_api_and_cli(tmp_path):
    # Issue 17 item 4: the API rescaled [0, 0.37, 1, 5] to the default 8 req/s; the CLI did not.
    from simsched import SimConfig, UnitCostModel, simulate
    from simsched.cli import build_config

    path = tmp_path / "t.csv"
    path.write_text(ISSUE_TRACE)
    api = SimConfig().replace(name="trace", trace_path=str(path))
    cli = build_config({"name": "trace", "trace_path": str(path)})
    assert api.workload == cli.workload
    res = simulate(api, cost_model=UnitCostModel())
    assert list(res.requests["arrival_at"]) == [0.0, 0.37, 1.0, 5.0]
    assert list(generate(cli.workload, rng(0))["arrival_at"]) == [0.0, 0.37, 1.0, 5.0]
    # A rate or speed-up is applied only when asked for, the same way on both paths.
    fast = SimConfig().replace(name="trace", trace_path=str(path), rate=None, speedup=2.0)
    assert list(generate(fast.workload, rng(0))["arrival_at"]) == [0.0, 0.185, 0.5, 2.5]
    rated = build_config({"name": "trace", "trace_path": str(path), "rate": 3.0})
    assert describe(generate(rated.workload, rng(0)))["rate"] == pytest.approx(3.0)


def test_mixed_trace_and_synthetic_components():
    cfg = WorkloadConfig(name="azure-conv", lengths="fixed", prompt_len=64, output_len=8,
                         rate=None, num_requests=100)
    frame = generate(cfg, rng(0))
    assert set(frame.num_prompt_tokens) == {64} and len(frame) == 100
    cfg = WorkloadConfig(name="azure-conv", arrival="gamma", cv=3.0, rate=2.0, num_requests=300)
    frame = generate(cfg, rng(0))
    full = traces.load_trace(traces.bundled_path("azure-conv"))
    np.testing.assert_array_equal(frame.num_prompt_tokens, full.num_prompt_tokens[:300])


# ---------------------------------------------------------------- generic format

@pytest.mark.parametrize("fname", ["generic_ok.csv", "generic_ok.jsonl"])
def test_generic_trace_replays_exactly(fname):
    frame = generate(WorkloadConfig.preset("trace", trace_path=str(FIXTURES / fname)), rng(0))
    raw = (pd.read_json(FIXTURES / fname, lines=True) if fname.endswith("jsonl")
           else pd.read_csv(FIXTURES / fname))
    np.testing.assert_array_equal(frame.arrival_at, raw.arrival_at)
    np.testing.assert_array_equal(frame.num_output_tokens, raw.num_output_tokens)
    assert list(frame.columns) == list(REQUEST_COLUMNS)
    if fname.endswith("csv"):
        assert list(frame.priority) == [0, 1, 0, 2]
        assert list(frame.tenant) == ["a", "b", None, "a"]


def test_unsorted_is_sorted_and_reported():
    with pytest.warns(TraceWarning, match="1 timestamps out of order"):
        frame = traces.load_trace(FIXTURES / "azure_unsorted.csv")
    assert list(frame.num_prompt_tokens) == [200, 300, 100]
    np.testing.assert_allclose(frame.arrival_at, [0.0, 1.0, 2.0])
    assert frame.attrs["load_report"].num_unsorted == 1


@pytest.mark.parametrize("fname,line,pattern", [
    ("azure_bad_time.csv", 3, "unparseable timestamp"),
    ("azure_missing_col.csv", 1, r"missing column\(s\) \['GeneratedTokens'\]"),
    ("generic_nonnumeric.csv", 3, "num_prompt_tokens .prompt. must be an integer >= 1, got 'abc'"),
    ("generic_negative.csv", 4, "num_output_tokens .output. must be an integer >= 1, got '?-3'?"),
    ("generic_zero_output.csv", 5, "num_output_tokens .output. must be an integer >= 1, got '?0'?"),
    ("generic_zero_prompt_blank_line.csv", 4, "num_prompt_tokens .prompt. must be"),
    ("generic_missing_value.csv", 3, "missing value for num_output_tokens"),
    ("generic_bad_time.csv", 3, "arrival_at must be a finite number"),
    ("generic_bad_json.jsonl", 2, "invalid JSON"),
    ("generic_zero_output.jsonl", 2, "num_output_tokens .output. must be an integer >= 1"),
])
def test_malformed_input_names_file_and_line(fname, line, pattern):
    with pytest.raises(TraceFormatError, match=rf"{fname}, line {line}: {pattern}"):
        traces.load_trace(FIXTURES / fname)


def test_lengths_only_file_cannot_be_replayed():
    with pytest.raises(TraceFormatError, match="no timestamps to replay"):
        traces.load_trace(traces.bundled_path("sharegpt"))
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        traces.load_trace(FIXTURES / "nope.csv")


# ---------------------------------------------------------------- long prompts

def test_long_prompt_clip_drop_error():
    path = FIXTURES / "azure_ok.csv"     # prompts 100, 200, 300, 5000
    base = WorkloadConfig.preset("trace", trace_path=str(path), max_prompt_tokens=250)
    with pytest.raises(ValueError, match=r"2 prompt\(s\) longer than max_prompt_tokens=250 "
                                         r"\(first at line 4: 300 tokens\)"):
        generate(base, rng(0))
    with pytest.warns(TraceWarning, match="2 prompt"):
        clipped = generate(dataclasses.replace(base, long_prompt_policy="clip"), rng(0))
    assert list(clipped.num_prompt_tokens) == [100, 200, 250, 250]
    assert clipped.attrs["load_report"].num_clipped == 2
    with pytest.warns(TraceWarning):
        dropped = generate(dataclasses.replace(base, long_prompt_policy="drop"), rng(0))
    assert list(dropped.num_prompt_tokens) == [100, 200]
    report = dropped.attrs["load_report"]
    assert report.num_dropped == 2 and report.num_long_prompts == 2 and "2 dropped" in str(report)


def test_long_prompt_policy_on_synthetic_lengths():
    cfg = WorkloadConfig(max_prompt_tokens=50, long_prompt_policy="drop", num_requests=2000)
    with pytest.warns(TraceWarning):
        frame = generate(cfg, rng(0))
    assert frame.num_prompt_tokens.max() <= 50
    assert frame.attrs["load_report"].num_dropped == 2000 - len(frame) > 0


def test_azure_conv_long_prompts_reported():
    cfg = WorkloadConfig.preset("azure-conv", max_prompt_tokens=4096, long_prompt_policy="clip")
    with pytest.warns(TraceWarning):
        frame = generate(cfg, rng(0))
    assert frame.num_prompt_tokens.max() == 4096
    assert frame.attrs["load_report"].num_clipped == 402


# ---------------------------------------------------------------- config, mix, determinism

def test_config_validation_messages():
    cases = [
        (dict(rate=-1), "workload.rate must be a finite number > 0, got -1"),
        (dict(name="nope"), "workload.name must be one of"),
        (dict(arrival="gamma", cv=0), "workload.cv"),
        (dict(rate=0), "workload.rate"),
        (dict(arrival="piecewise"), "workload.rate_schedule is required"),
        (dict(lengths="uniform", prompt_range=(10, 5)), "workload.prompt_range"),
        (dict(name="trace"), "workload.trace_path is required"),
        (dict(name="azure-conv", rate=4.0, speedup=2.0), "set rate=None to use speedup"),
        (dict(speedup=2.0), "speedup only applies"),
        (dict(long_prompt_policy="truncate"), "workload.long_prompt_policy"),
        (dict(num_tenants=2, tenant_weights=(1.0,)), "workload.tenant_weights"),
        (dict(num_requests=0), "workload.num_requests"),
        (dict(arrival="trace"), "has no timestamped trace"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            WorkloadConfig(**kwargs)
    assert set(WORKLOADS) >= {"lesson", "azure-code", "azure-conv", "sharegpt", "custom", "trace"}


def test_tenant_and_priority_mix():
    cfg = WorkloadConfig(num_requests=20_000, num_tenants=3, tenant_weights=(0.6, 0.3, 0.1),
                         num_priorities=2)
    frame = generate(cfg, rng(0))
    shares = frame.tenant.value_counts(normalize=True)
    assert shares["t0"] == pytest.approx(0.6, abs=0.02) and shares["t2"] == pytest.approx(0.1, abs=0.02)
    assert frame.priority.mean() == pytest.approx(0.5, abs=0.02)
    text = str(describe(frame))
    assert "tenants 3, priorities 2" in text


@pytest.mark.parametrize("kwargs", [
    dict(), dict(arrival="gamma", cv=4.0), dict(arrival="onoff", lengths="uniform"),
    dict(name="sharegpt", duration=30.0, num_requests=None),
    dict(arrival="piecewise", rate_schedule=((5, 1), (5, 10))),
])
def test_determinism(kwargs):
    cfg = WorkloadConfig(**kwargs)
    a, b, c = generate(cfg, rng(7)), generate(cfg, rng(7)), generate(cfg, rng(8))
    pd.testing.assert_frame_equal(a, b)
    assert not np.array_equal(a.arrival_at.to_numpy()[:10], c.arrival_at.to_numpy()[:10])
    assert a.arrival_at.is_monotonic_increasing and a.num_output_tokens.min() >= 1


def test_sweep_with_replace_and_describe():
    cfg = WorkloadConfig(num_requests=2000)
    for rate in (2.0, 16.0):
        d = dataclasses.replace(cfg, rate=rate, arrival="gamma", cv=2.0).describe()
        assert d["rate"] == pytest.approx(rate, rel=0.1)
        assert d["interarrival_cv"] == pytest.approx(2.0, rel=0.15)
    d = describe(generate(cfg, rng(0)))
    assert d["num_requests"] == 2000 and d["prompt_max"] <= 512 and not math.isnan(d["prompt_p99"])
    assert list(d.to_frame().index) == ["prompt", "output"]
    assert "inter-arrival CV" in str(d)


def test_simconfig_accepts_workload():
    config = pytest.importorskip("simsched.config")
    sim = config.SimConfig().replace(name="azure-conv", rate=None, num_requests=None,
                                     duration=60.0, speedup=2.0)
    assert sim.workload.speedup == 2.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        frame = generate(sim.workload, rng(sim.seed))
    assert frame.arrival_at.max() < 30.0


def test_trace_replay_experiment_smoke(tmp_path):
    pytest.importorskip("simsched.api")
    from experiments import trace_replay

    args = trace_replay.parse_args(["--duration", "20", "--speedups", "1", "--out", str(tmp_path)])
    frame = trace_replay.run(args)
    assert set(frame.variant) == set(trace_replay.VARIANTS)
    assert (tmp_path / "summary.csv").exists() and (tmp_path / "requests_spf_preempt_1x.csv").exists()


GENERIC_HEADER = "arrival_at,num_prompt_tokens,num_output_tokens\n"


@pytest.mark.parametrize("name,content,line,pattern", [
    # issue 17 item 8: a bare UnicodeDecodeError without the file name
    ("latin1.csv", GENERIC_HEADER.encode() + b"0,10,5\n1,10,\xe95\n", 3,
     r"not UTF-8 text \(byte 0xe9 at column 6\)"),
    ("latin1.jsonl", b'{"arrival_at": 0, "num_prompt_tokens": 1, "num_output_tokens": 2}\n\xff\n',
     2, "not UTF-8 text"),
    # an unknown header used to be blamed on the sharegpt format's columns
    ("foo.csv", b"foo,bar\n1,2\n", 1,
     r"unrecognised header \['foo', 'bar'\]; expected the columns of one format: azure: "
     r"TIMESTAMP, ContextTokens, GeneratedTokens; generic: arrival_at, num_prompt_tokens"),
    ("semicolons.csv", GENERIC_HEADER.replace(",", ";").encode() + b"0;10;5\n", 1,
     "unrecognised header .*; the header contains ';': traces are comma-separated"),
    # an extra field used to be blamed on num_output_tokens (first row) or left unlocated
    ("extra_first.csv", GENERIC_HEADER.encode() + b"0,10,5,7\n1,10,5\n", 2,
     r"4 fields, but the header has 3 \(arrival_at, num_prompt_tokens, num_output_tokens\) "
     r"\[generic format, expected columns: arrival_at, num_prompt_tokens, num_output_tokens"),
    ("extra_later.csv", GENERIC_HEADER.encode() + b"0,10,5\n1,10,5,\n", 3,
     "4 fields, but the header has 3"),
    ("azure_bad.csv", b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,5,x\n", 2,
     r"GeneratedTokens \(output\) must be an integer >= 1, got 'x' \[azure format, expected "
     r"columns: TIMESTAMP, ContextTokens, GeneratedTokens\]"),
])
def test_trace_errors_name_file_line_format_and_columns(tmp_path, name, content, line, pattern):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(TraceFormatError, match=rf"{name}, line {line}: {pattern}"):
        traces.load_trace(path)
