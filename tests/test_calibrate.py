"""Calibrating to a deployment: the terms, the profile file, hardware.profile, the fit."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from simsched import SimConfig, calibrate, simulate
from simsched.analysis import prometheus_text
from simsched.analysis.measurements import Measured, read_vllm_bench
from simsched.cost import deployment, factory, vllm_v1
from simsched.cost.base import Batch
from simsched.cost.calibrated import CalibratedCostModel
from simsched.cost.hardware import GPUS, MODELS
from simsched.workloads.workload import WorkloadConfig

SHIPPED_DELAY = vllm_v1.terms()["output_delay"]
NEUTRAL = deployment.neutral_terms(SHIPPED_DELAY)
TRUTH = dict(NEUTRAL, gemm_scale=1.25, step_time=1e-3, output_delay=0.02)


def _batches():
    return [Batch(prefill_new_tokens=(512,), prefill_cached_tokens=(0,), num_decode_seqs=0,
                  decode_context_sum=0),
            Batch(prefill_new_tokens=(), prefill_cached_tokens=(), num_decode_seqs=32,
                  decode_context_sum=32 * 700),
            Batch(prefill_new_tokens=(256,), prefill_cached_tokens=(128,),
                  num_decode_seqs=8, decode_context_sum=8 * 300)]


def test_neutral_terms_leave_the_shipped_model_unchanged():
    for tp in (1, 2):
        plain = CalibratedCostModel(MODELS["llama-2-7b"], GPUS["h100-sxm"], tp, "llama-2-7b")
        same = CalibratedCostModel(MODELS["llama-2-7b"], GPUS["h100-sxm"], tp, "llama-2-7b",
                                   adjust=NEUTRAL)
        for b in _batches():
            assert same.iteration_time(b) == plain.iteration_time(b)
        assert same.output_delay == plain.output_delay
        assert same.decode_iteration_times(16, 4000, 5) == plain.decode_iteration_times(
            16, 4000, 5)


def test_each_term_moves_its_part():
    spec, gpu = MODELS["llama-2-7b"], GPUS["h100-sxm"]
    base = CalibratedCostModel(spec, gpu, 2, "llama-2-7b", adjust=NEUTRAL)
    b = _batches()[2]
    parts = base.breakdown(b)
    for term, part in (("gemm_scale", "linear"), ("attention_scale", "attention"),
                       ("comm_scale", "communication")):
        m = CalibratedCostModel(spec, gpu, 2, "llama-2-7b", adjust=dict(NEUTRAL, **{term: 2.0}))
        assert m.breakdown(b)[part] == pytest.approx(2 * parts[part])
    slow = CalibratedCostModel(spec, gpu, 2, "llama-2-7b",
                               adjust=dict(NEUTRAL, step_time=1e-3, seq_time=1e-5))
    assert slow.iteration_time(b) == pytest.approx(base.iteration_time(b) + 1e-3 + 9 * 1e-5)
    late = CalibratedCostModel(spec, gpu, 2, "llama-2-7b", adjust=dict(NEUTRAL, output_delay=0.05))
    assert late.output_delay == 0.05
    with pytest.raises(ValueError, match="gemm_scale must be > 0"):
        CalibratedCostModel(spec, gpu, 1, "llama-2-7b", adjust=dict(NEUTRAL, gemm_scale=0.0))
    with pytest.raises(ValueError, match="missing term 'seq_time'"):
        CalibratedCostModel(spec, gpu, 1, "llama-2-7b",
                            adjust={k: v for k, v in NEUTRAL.items() if k != "seq_time"})


def _measured_run(tmp_path, terms, n=160, seed=3):
    """A simulated run under ``terms``, written as vllm bench JSON and a /metrics scrape and
    read back as a Measured run with the server's settings."""
    cfg = SimConfig().replace(
        model="llama-2-7b", gpu="h100-sxm", seed=seed,
        workload=WorkloadConfig(num_requests=n, rate=5.0, arrival="poisson", lengths="fixed",
                                prompt_len=500, output_len=200))
    res = simulate(cfg, cost_model=factory.adjusted_cost_model(cfg.hardware, terms))
    res.to_vllm_bench(tmp_path / "bench.json", percentiles=(90, 99))
    res.to_openmetrics(tmp_path / "metrics.txt")
    bench = read_vllm_bench(tmp_path / "bench.json")
    scrape = prometheus_text.run_metrics(
        prometheus_text.scrapes(prometheus_text.read(tmp_path / "metrics.txt"))[-1])
    # The scrape's histogram means are the run's exactly (its quantiles are bucket-coarse).
    for m in ("ttft_mean", "e2el_mean", "itl_mean"):
        assert scrape[m] == pytest.approx(bench.metrics[m], rel=1e-9)
    settings = dict(bench.settings, model="llama-2-7b", gpu="h100-sxm")
    return Measured(bench.source, bench.metrics, settings)


@pytest.fixture(scope="module")
def round_trip(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("calibrate")
    run = _measured_run(tmp, TRUTH)
    return tmp, run, calibrate([run], path=tmp / "profile.json")


def test_round_trip_recovers_the_terms_within_their_intervals(round_trip):
    _, _, cal = round_trip
    terms = cal.terms.set_index("term")
    for name, value in TRUTH.items():
        scale = deployment.UNITS[name][1]
        assert terms.low_90[name] <= value * scale <= terms.high_90[name], name
    # The shipped model is far off this run; the calibrated one reproduces it within the
    # metrics' expected run-to-run error (TTFT's is 16 %, E2E's 4 %).
    rep = cal.report
    assert rep.shipped_error.abs().min() > 10
    assert rep.calibrated_error.abs().max() < 10
    assert (rep.calibrated_error.abs() < rep.shipped_error.abs() / 2).all()
    # A run this far off is no deployment like the validated ones: the wide component decides.
    weights = {c["name"]: c["weight"] for c in cal.document["components"]}
    assert weights["other"] > 0.9


def test_profile_file_loads_through_hardware_profile(round_trip, tmp_path):
    tmp, run, cal = round_trip
    path = tmp / "profile.json"
    doc = json.loads(path.read_text())
    assert doc["format"] == deployment.FORMAT and doc["version"] == deployment.VERSION
    assert doc["inputs"][0]["file_sha256"] and len(doc["covariance"]) == 6
    cfg = SimConfig().replace(model="llama-2-7b", gpu="h100-sxm", profile=str(path),
                              workload=WorkloadConfig(num_requests=40, rate=5.0, lengths="fixed", prompt_len=500,
                                                      output_len=200))
    assert SimConfig.from_json(cfg.to_json()) == cfg
    fitted = simulate(cfg).summary()
    shipped = simulate(cfg.replace(profile=None)).summary()
    assert fitted["e2el_mean"] > 1.1 * shipped["e2el_mean"]
    # The same runs give the same profile (seeded).
    again = calibrate([run])
    assert again.document["terms"] == cal.document["terms"]
    with pytest.raises(ValueError, match="hardware.profile: .*no such calibrated profile"):
        cfg.replace(profile=str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="calibrated on h100-sxm, not hardware.gpu='a100-80gb'"):
        cfg.replace(gpu="a100-80gb")
    bad = dict(doc, covariance=[[1.0]])
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="covariance must be a symmetric"):
        cfg.replace(profile=str(tmp_path / "bad.json"))
    (tmp_path / "old.json").write_text(json.dumps(dict(doc, version=99)))
    with pytest.raises(ValueError, match="version 99 is not supported"):
        cfg.replace(profile=str(tmp_path / "old.json"))


def test_one_run_moves_the_terms_less_than_many(tmp_path):
    runs = [_measured_run(tmp_path / f"r{k}", TRUTH, n=50, seed=k) for k in range(2)]
    one, two = calibrate(runs[:1]), calibrate(runs)

    def width(c):   # 90 % interval widths, each in units of its prior's
        prior = np.sqrt(np.array(c.document["prior"]["sigma"]) ** 2)
        return np.sqrt(np.diag(np.array(c.document["covariance"]))) / prior

    assert width(one).max() <= 1.0 + 1e-9          # data never widen the prior
    assert width(two).mean() < width(one).mean()


def test_ensemble_gives_every_metric_an_interval(round_trip):
    tmp, _, _ = round_trip
    cfg = SimConfig().replace(model="llama-2-7b", gpu="h100-sxm", profile=str(tmp / "profile.json"),
                              workload=WorkloadConfig(num_requests=30, rate=5.0, lengths="fixed",
                                                      prompt_len=500, output_len=200))
    ens = simulate(cfg, ensemble=3)
    assert list(ens.runs["seed"]) == [0, 1, 2] and len(set(ens.runs["term_gemm_scale"])) == 3
    mean, low, high = ens.interval("e2el_mean")
    assert low < mean < high
    # Wider than the draws alone: the profile's unexplained E2E scatter is added.
    row = ens.intervals.set_index("metric").loc["e2el_mean"]
    assert high - low > 2 * row["std"]
    again = simulate(cfg, ensemble=3)
    pd.testing.assert_frame_equal(ens.intervals, again.intervals)
    with pytest.raises(ValueError, match="ensemble needs hardware.profile"):
        simulate(cfg.replace(profile=None), ensemble=3)
    with pytest.raises(ValueError, match="ensemble must be an integer >= 2"):
        simulate(cfg, ensemble=1)


def test_cli_calibrate_and_run_ensemble(round_trip, tmp_path, capsys):
    from simsched.cli import main

    tmp, _, cal = round_trip
    out = tmp_path / "p.json"
    assert main(["calibrate", "--bench", str(tmp / "bench.json"), "--scrape",
                 str(tmp / "metrics.txt"), "--serve", "vllm serve meta-llama/Llama-2-7b-hf "
                 "--max-num-seqs 256", "--model", "llama-2-7b", "--gpu", "h100-sxm",
                 "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "gemm_scale" in text and str(out) in text
    assert deployment.load(out).gpus == ("h100-sxm",)
    assert main(["run", "--model", "llama-2-7b", "--gpu", "h100-sxm", "--profile", str(out),
                 "--ensemble", "2", "--num-requests", "20", "--rate", "4",
                 "--out", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "intervals.csv").is_file()
    assert main(["calibrate", "--runs", str(tmp / "bench.json")]) == 2
    assert "--runs and --measured go together" in capsys.readouterr().err


def test_error_model_correlates_one_runs_metrics():
    from simsched.fit.errors import SAMPLING_SHARE, correlation, run_covariance, whiten

    metrics = ["ttft_mean", "ttft_p90", "e2el_mean", "tpot_mean"]
    sigma = {"ttft_mean": 0.16, "ttft_p90": 0.2, "e2el_mean": 0.04, "tpot_mean": 0.05}
    cov = run_covariance(metrics, sigma)
    assert np.allclose(cov, cov.T) and np.linalg.eigvalsh(cov).min() > 0
    assert np.sqrt(np.diag(cov)) == pytest.approx([sigma[m] for m in metrics])
    # Two statistics of one latency move together; TTFT and E2E less so.
    corr = cov / np.outer(np.sqrt(np.diag(cov)), np.sqrt(np.diag(cov)))
    assert corr[0, 1] == pytest.approx((1 - SAMPLING_SHARE) * correlation("ttft_mean",
                                                                          "ttft_p90"))
    assert corr[0, 1] > corr[0, 2] > corr[0, 3] > 0
    # Whitening: a run's residuals equal to its sigmas along one correlated direction count
    # less than the same residuals taken as independent; a NaN row is left out.
    diff = np.array([0.16, 0.2, np.nan, 0.05])
    r, _ = whiten([[0, 1, 2, 3]], diff, None, metrics, sigma)
    assert len(r) == 3 and r @ r < 3


def test_a_run_near_the_shipped_model_moves_the_terms_little(tmp_path):
    run = _measured_run(tmp_path, dict(NEUTRAL, gemm_scale=1.04, step_time=0.2e-3), n=60)
    cal = calibrate([run])
    weights = {c["name"]: c["weight"] for c in cal.document["components"]}
    # Its errors are the size of one workload's misfit: the validated component is the more
    # probable (the far-off round trip above goes to the wide one) and the terms stay near.
    assert weights["validated"] > 0.5
    prior = cal.document["prior"]
    moved = (np.array(cal.document["center"]) - prior["center"]) / np.array(prior["sigma"])
    assert np.abs(moved).max() < 1 / 3


def test_empirical_bayes_finds_the_terms_deployments_differ_in():
    from experiments.calibrate_prior import METRICS, estimate

    # 12 deployments of 3 runs each; their errors: a shared shift of term 0 (sigma 0.5 in wide
    # units) through each run's own sensitivity, plus each run's noise as the error model has it.
    rng = np.random.default_rng(7)
    from simsched.fit.errors import METRIC_SIGMA, run_covariance

    noise = np.linalg.cholesky(run_covariance(list(METRICS), METRIC_SIGMA))
    rows, jacs = [], []
    for g in range(12):
        shift = np.zeros(6)
        shift[0] = 0.5 * rng.standard_normal()
        for r in range(3):
            jac = rng.normal(0.0, 0.3, (4, 6))
            jac[:, 0] = np.abs(jac[:, 0]) + 0.2
            err = jac @ shift + noise @ rng.standard_normal(4)
            jacs.append(jac)
            rows += [{"group": f"g{g}", "run": f"g{g}r{r}", "metric": m, "log_error": e}
                     for m, e in zip(METRICS, err)]
    shares, _ = estimate(pd.DataFrame(rows), np.vstack(jacs))
    assert 0.2 < shares[0] < 1.0                  # the term that moves between deployments
    assert shares[1:].max() < shares[0] / 2       # the others need not
