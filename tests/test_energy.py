"""The GPU power model and a run's energy (issue 46, item 3)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import simsched
from simsched import SimConfig
from simsched.config import ClusterConfig
from simsched.cost.power import POWER_SPECS, capped, power_model, shipped_fit
from simsched.cli import main

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "real-serving" / "splitwise-perf-model.csv"


@pytest.fixture(scope="module")
def run():
    return simsched.simulate(SimConfig().replace(num_requests=200, rate=20.0, seed=2,
                                                 cluster=ClusterConfig(num_replicas=2)))


def test_energy_adds_up(run):
    e = run.energy()
    its = run.iterations
    assert len(e.iterations) == len(its)
    tdp = POWER_SPECS["a100-80gb"].tdp_watts
    assert (e.iterations["power_watts"] <= tdp + 1e-9).all()
    floor = power_model().active_floor * tdp
    assert (e.iterations["power_watts"] >= floor - 1e-9).all()
    busy = (e.iterations["power_watts"] * e.iterations["duration"]
            * e.iterations["cap_slowdown"]).sum()
    assert e.summary["busy_energy_joules"] == pytest.approx(busy)
    idle_time = 2 * run.sim_time - its["duration"].sum()
    assert e.summary["idle_energy_joules"] == pytest.approx(
        idle_time * POWER_SPECS["a100-80gb"].idle_watts)
    assert e.summary["energy_joules"] == pytest.approx(busy + e.summary["idle_energy_joules"])
    assert e.summary["joules_per_output_token"] == pytest.approx(
        e.summary["energy_joules"] / run.requests["num_generated_tokens"].sum())
    assert e.summary["power_mean_watts"] == pytest.approx(e.summary["energy_joules"] / run.sim_time)
    # the fleet's peak is at least one replica's peak plus the other's idle draw, at most both peaks
    peaks = e.replicas["power_peak_watts"]
    assert peaks.max() + POWER_SPECS["a100-80gb"].idle_watts - 1e-9 <= \
        e.summary["power_peak_watts"] <= peaks.sum() + 1e-9


def test_decode_steps_are_memory_bound_and_prefill_compute_heavy(run):
    e = run.energy().iterations
    its = run.iterations
    decode_only = (its["num_prefill_tokens"] == 0).to_numpy()
    assert e["memory_util"][decode_only].median() > 5 * e["compute_util"][decode_only].median()
    big = (its["num_prefill_tokens"] >= 200).to_numpy()
    assert e["compute_util"][big].median() > e["compute_util"][decode_only].median()


def test_a_power_cap_clips_draw_and_slows_hard_steps(run):
    free, capped_run = run.energy(), run.energy(power_cap_watts=250.0)
    assert (capped_run.iterations["power_watts"] <= 250.0 + 1e-9).all()
    over = (free.iterations["power_watts"] > 250.0).to_numpy()
    assert over.any()
    assert (capped_run.iterations["cap_slowdown"][over] > 1).all()
    assert (capped_run.iterations["cap_slowdown"][~over] == 1).all()
    assert capped_run.summary["num_capped_iterations"] >= over.sum()


def test_capped_follows_the_cube_rule():
    drawn, factor = capped(np.array([0.5, 0.9]), 0.6, 0.3)
    assert drawn.tolist() == [0.5, 0.6]
    assert factor[0] == 1.0 and factor[1] == pytest.approx(2.0 ** (1 / 3))
    with pytest.raises(ValueError, match="active floor"):
        capped(np.array([0.5]), 0.2, 0.3)


def test_carbon_from_a_series(run):
    constant = run.energy(carbon_intensity=400.0).summary["co2_grams"]
    assert constant == pytest.approx(run.energy().summary["energy_joules"] / 3.6e6 * 400.0)
    doubled = run.energy(carbon_intensity=[(0.0, 800.0)]).summary["co2_grams"]
    assert doubled == pytest.approx(2 * constant)
    with pytest.raises(ValueError, match="increase"):
        run.energy(carbon_intensity=[(5.0, 1.0), (1.0, 2.0)])


def test_unknown_gpu_power_is_named():
    from simsched.cost.power import power_spec

    with pytest.raises(ValueError, match="no power figures for GPU 'nope'"):
        power_spec("nope")


def test_shipped_fit_is_the_fit_of_the_data():
    if not DATA.is_file():
        pytest.skip("the shared data folder is not beside the project")
    from experiments.calibrate_power import result

    fresh, shipped = result(DATA), shipped_fit()
    assert fresh["data_sha256_16"] == shipped["data_sha256_16"]
    for key, value in shipped["coefficients"].items():
        assert fresh["coefficients"][key] == pytest.approx(value, rel=1e-9)
    assert fresh["loo_joules_per_token_error_median"] == shipped["loo_joules_per_token_error_median"]
    assert shipped["loo_joules_per_token_error_median"] <= 0.15


def test_cli_energy(tmp_path, capsys):
    out = tmp_path / "e"
    assert main(["run", "--num-requests", "20", "--power-cap", "300", "--out", str(out)]) == 0
    import pandas as pd

    summary = pd.read_csv(out / "summary.csv").iloc[0]
    assert summary["energy_joules"] > 0 and not math.isnan(summary["joules_per_output_token"])
    assert (pd.read_csv(out / "energy.csv")["power_peak_watts"] <= 300 + 1e-9).all()
    assert main(["run", "--num-requests", "5", "--power-cap", "-1", "--out", str(out)]) == 2


def test_docs_quote_the_shipped_fit():
    text = (ROOT / "docs" / "energy.md").read_text()
    fit = shipped_fit()
    c = fit["coefficients"]
    assert f"{c['active_floor']:.3f}, {c['compute_weight']:.3f}, {c['memory_weight']:.3f}" in text
    assert f"| {100 * fit['loo_joules_per_token_error_median']:.1f} % |" in text
    assert f"| {100 * fit['loo_joules_per_token_error_max']:.1f} % |" in text
    assert f"{fit['num_configurations']} configurations" in text
