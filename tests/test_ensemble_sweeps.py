"""A calibrated profile's intervals carried into sweeps and plans (``ensemble=N``)."""

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from simsched import SimConfig, simulate, sweep
from simsched.analysis import plots
from simsched.analysis.plan import Candidate, plan
from simsched.cost import deployment, factory, vllm_v1
from simsched.workloads.workload import WorkloadConfig

DELAY = vllm_v1.terms()["output_delay"]
# Posterior standard deviations in the fit's coordinates (log scales, seconds).
SD = np.array([0.15, 0.2, 0.2, 0.5e-3, 5e-6, 3e-3])


def _profile(path, gpu="h100-sxm"):
    """A profile document written by hand: known centre, covariance and discrepancy."""
    terms = dict(deployment.neutral_terms(DELAY), gemm_scale=1.2, step_time=0.5e-3)
    doc = {"format": deployment.FORMAT, "version": deployment.VERSION,
           "engine_overhead": "vllm_silicon", "gpus": [gpu], "models": ["llama-2-7b"],
           "terms": terms, "center": deployment.to_coordinates(terms).tolist(),
           "covariance": np.diag(SD ** 2).tolist(),
           "discrepancy": {"ttft_mean": 0.1, "e2el_mean": 0.04}}
    path.write_text(json.dumps(doc))
    return str(path)


def _config(profile):
    return SimConfig().replace(model="llama-2-7b", gpu="h100-sxm", profile=profile,
                               workload=WorkloadConfig(num_requests=24, rate=4.0,
                                                       lengths="fixed", prompt_len=400,
                                                       output_len=60))


def test_sweep_ensemble_carries_each_metrics_interval(tmp_path):
    cfg = _config(_profile(tmp_path / "p.json"))
    res = sweep(cfg, ensemble=3, rate=[2.0, 8.0], executor="serial", progress=False)
    assert list(res.runs["rate"]) == [2.0, 8.0] and list(res.runs["num_draws"]) == [3, 3]
    assert len(res.draws) == 6 and list(res.draws["seed"]) == [0, 1, 2] * 2
    # Draw k of every point: seed + k and the k-th coefficient set of the profile.
    drawn = deployment.load(tmp_path / "p.json").draw(3, seed=0)
    for k, terms in enumerate(drawn):
        rows = res.draws[res.draws["draw"] == k]
        assert (rows["term_gemm_scale"] == terms["gemm_scale"]).all()
    # A draw's row is that simulation's summary.
    one = simulate(cfg.replace(rate=8.0, seed=1),
                   cost_model=factory.adjusted_cost_model(cfg.hardware, drawn[1])).summary()
    row = res.draws[(res.draws["run_id"] == 1) & (res.draws["draw"] == 1)].iloc[0]
    assert row["e2el_mean"] == one["e2el_mean"] and row["ttft_p99"] == one["ttft_p99"]
    # Central value: the mean over the point's draws; the interval around it is the
    # ensemble's own (simulate(..., ensemble=N)), discrepancy included.
    for run_id, rate in enumerate((2.0, 8.0)):
        point = res.runs.iloc[run_id]
        mine = res.draws[res.draws["run_id"] == run_id]
        ens = simulate(cfg.replace(rate=rate), ensemble=3)
        for m in ("ttft_mean", "e2el_mean", "tpot_p99"):
            assert point[m] == pytest.approx(mine[m].mean())
            mean, lo, hi = ens.interval(m)
            assert (point[m], point[f"{m}_lo"], point[f"{m}_hi"]) == pytest.approx((mean, lo, hi))
            assert point[f"{m}_lo"] < point[m] < point[f"{m}_hi"]
    # The per-run frames keep every draw, led by run_id and draw.
    reqs = res.requests
    assert list(reqs.columns[:3]) == ["run_id", "draw", "rate"]
    assert reqs.groupby(["run_id", "draw"]).size().tolist() == [24] * 6
    # Written with the others.
    written = {p.name for p in res.to_csv(tmp_path / "out")}
    assert {"runs.csv", "draws.csv", "requests.csv"} <= written


def test_sweep_ensemble_refusals(tmp_path):
    cfg = _config(_profile(tmp_path / "p.json"))
    with pytest.raises(ValueError, match="ensemble varies the seed itself"):
        sweep(cfg, ensemble=2, seed=[0, 1], executor="serial", progress=False)
    with pytest.raises(ValueError, match=r"sweep point \{'rate': 2.0\}: ensemble needs "
                                         "hardware.profile"):
        sweep(cfg.replace(profile=None), ensemble=2, rate=[2.0], executor="serial",
              progress=False)
    with pytest.raises(ValueError, match="ensemble must be an integer >= 2"):
        sweep(cfg, ensemble=1, rate=[2.0], executor="serial", progress=False)


def test_latency_plot_draws_the_ensembles_bands(tmp_path):
    runs = pd.DataFrame({"rate": [1.0, 2.0], "saturation": ["stable"] * 2,
                         **{m: [0.1, 0.2] for m in ("ttft_p50", "ttft_p99", "tpot_p99")},
                         **{f"{m}_lo": [0.05, 0.15] for m in ("ttft_p50", "ttft_p99",
                                                                "tpot_p99")},
                         **{f"{m}_hi": [0.3, 0.4] for m in ("ttft_p50", "ttft_p99",
                                                              "tpot_p99")}})
    fig = plots.latency_vs_load(runs, by=())
    band = fig.axes[0].collections[0].get_paths()[0].vertices
    assert band[:, 1].min() == pytest.approx(0.05) and band[:, 1].max() == pytest.approx(0.4)


def test_plan_ensemble_judges_the_mean_and_reports_intervals(tmp_path):
    cfg = _config(_profile(tmp_path / "p.json"))
    wl = dataclasses.replace(cfg.workload, num_requests=40)
    res = plan(wl, {"ttft_p99": 1.0}, [Candidate(gpu="h100-sxm", max_replicas=2)],
               rates=[4.0], base_config=cfg, ensemble=3, executor="serial")
    row = res.table.iloc[0]
    assert row["status"] == "ok" and row["num_draws"] == 3
    probes = res.runs[res.runs["num_replicas"] == row["num_replicas"]]
    assert sorted(probes["draw"]) == [0, 1, 2] and sorted(probes["seed"]) == [0, 1, 2]
    assert row["ttft_p99"] == pytest.approx(probes["ttft_p99"].mean())
    assert row["ttft_p99_lo"] < row["ttft_p99"] < row["ttft_p99_hi"]
    cols = list(res.table.columns)
    assert cols.index("ttft_p99_lo") == cols.index("ttft_p99") + 1
    fig = res.plot()
    assert fig.axes[0].containers, "the interval is drawn as an error bar"
    with pytest.raises(ValueError, match="give one seed"):
        plan(wl, {"ttft_p99": 1.0}, [Candidate(gpu="h100-sxm")], rates=[4.0],
             base_config=cfg, ensemble=2, seeds=(0, 1), executor="serial")
    with pytest.raises(ValueError, match="calibrated on h100-sxm, not hardware.gpu='a100-80gb'"):
        plan(wl, {"ttft_p99": 1.0}, [Candidate(gpu="a100-80gb")], rates=[4.0],
             base_config=cfg, ensemble=2, executor="serial")


def test_cli_sweep_and_plan_with_ensemble(tmp_path, capsys):
    from simsched.cli import main

    profile = _profile(tmp_path / "p.json")
    out = tmp_path / "sweep"
    assert main(["sweep", "--model", "llama-2-7b", "--gpu", "h100-sxm", "--profile", profile,
                 "--num-requests", "16", "--vary", "rate=2,6", "--ensemble", "2",
                 "--executor", "serial", "--quiet", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "ttft_p99_lo" in text and "draws.csv" in text
    runs = pd.read_csv(out / "runs.csv")
    assert len(runs) == 2 and (runs["e2el_mean_lo"] < runs["e2el_mean_hi"]).all()
    assert len(pd.read_csv(out / "draws.csv")) == 4
    assert (out / "latency_vs_load.png").is_file()
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text(f'''
[workload]
num_requests = 20
rate = 3.0
[hardware]
model = "llama-2-7b"
[plan]
rates = [3.0]
ensemble = 3
[target]
ttft_p99 = 1.0
[[candidates]]
gpu = "h100-sxm"
max_replicas = 2
profile = "{profile}"    # each candidate's own GPU's profile
''')
    assert main(["plan", str(plan_file), "--ensemble", "2", "--executor", "serial", "--quiet",
                 "--out", str(tmp_path / "plan")]) == 0
    table = pd.read_csv(tmp_path / "plan" / "plan.csv")
    assert list(table["num_draws"]) == [2] and "ttft_p99_hi" in capsys.readouterr().out
