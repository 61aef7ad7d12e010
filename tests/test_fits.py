"""Shipped fits: runs load the coefficients, never fit; the shipped files match a refit here."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import simsched
from simsched import SimConfig
from simsched.cost import factory, fits, linalg, serving, vllm_v1  # noqa: F401  (register fits)
from simsched.cost.profiles import PROFILES, get_profile

REL = 1e-9
STALE = f"shipped fits are stale: run `{fits.UPDATE_COMMAND}` and commit the files"


def _mismatches(shipped, refit, path="") -> list[str]:
    """Paths where two JSON-like values differ (floats beyond REL, anything else at all)."""
    if isinstance(shipped, dict) and isinstance(refit, dict):
        if set(shipped) != set(refit):
            return [f"{path}: keys {sorted(shipped)} vs {sorted(refit)}"]
        return [m for k in shipped for m in _mismatches(shipped[k], refit[k], f"{path}/{k}")]
    if isinstance(shipped, list) and isinstance(refit, list):
        if len(shipped) != len(refit):
            return [f"{path}: {len(shipped)} vs {len(refit)} items"]
        return [m for i, (a, b) in enumerate(zip(shipped, refit))
                for m in _mismatches(a, b, f"{path}[{i}]")]
    if isinstance(shipped, float) or isinstance(refit, float):
        if math.isclose(shipped, refit, rel_tol=REL, abs_tol=0.0) or shipped == refit:
            return []
    elif shipped == refit:
        return []
    return [f"{path}: shipped {shipped!r}, refit {refit!r}"]


@pytest.mark.parametrize("name", sorted(fits.registered()))
def test_shipped_fit_matches_a_refit(name):
    fit = fits.registered()[name]
    record = fit.read()
    assert record["source_hash"] == fit.source_hash(), \
        f"{fit.path}: data or fit code changed since it was written; {STALE}"
    refit = json.loads(json.dumps(fit.fit()))
    bad = _mismatches(record["coefficients"], refit)
    assert not bad, f"{fit.path}: {len(bad)} values differ from a refit ({bad[:3]}); {STALE}"


def test_every_profile_and_the_engine_fits_are_registered():
    # Profiles that read measured tables (AIConfigurator's) fit nothing and ship no fit file.
    fitted = {name: p for name, p in PROFILES.items() if p.fit is not None}
    assert set(fitted) >= {"a100-80gb", "h200"}
    assert set(fits.registered()) == set(fitted) | {serving.ENGINE_FIT.name, vllm_v1.FIT.name}
    for name, profile in PROFILES.items():
        assert profile.name == name
        if profile.fit is None:
            continue
        assert profile.fit.name == name
        assert profile.coefficients() is fits.coefficients(name)


def test_runs_never_fit(monkeypatch):
    # Every least-squares path a fit can take raises: a run that fitted anything would fail.
    def refuse(*args, **kwargs):
        raise AssertionError("a run must load shipped coefficients, not fit")

    for target in (linalg, np.linalg):
        for attr in ("lstsq", "solve"):
            monkeypatch.setattr(target, attr, refuse)
    fits.coefficients.cache_clear()
    factory._cached_cost_model.cache_clear()
    try:
        for gpu, overhead in (("a100-80gb", "measured_2023"), ("h200", "overlapped"),
                              ("h100-sxm", "eager_2023"), ("h100-sxm", "vllm_v1"),
                              ("b200", "vllm_v1")):
            res = simsched.simulate(SimConfig().replace(
                gpu=gpu, engine_overhead=overhead, num_requests=20, rate=5.0, seed=3))
            assert res.summary()["num_finished"] == 20
    finally:
        fits.coefficients.cache_clear()
        factory._cached_cost_model.cache_clear()


def test_missing_or_broken_file_names_the_update_command(monkeypatch, tmp_path):
    monkeypatch.setattr(fits, "FITS_DIR", tmp_path)
    fit = fits.registered()["h200"]
    with pytest.raises(ValueError, match="experiments.calibrate --update"):
        fit.read()
    (tmp_path / "h200.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON.*--update"):
        fit.read()
    (tmp_path / "h200.json").write_text(json.dumps({"format": 0, "coefficients": {}}))
    with pytest.raises(ValueError, match="format 0"):
        fit.read()


def test_written_file_reads_back_bit_for_bit(monkeypatch, tmp_path):
    monkeypatch.setattr(fits, "FITS_DIR", tmp_path)
    fit = fits.ShippedFit("demo", lambda: {"x": [0.1 + 0.2, 1 / 3, 5e-324], "k": 3},
                          sources=("linalg.py",))
    fit.write()
    record = fit.read()
    assert record["coefficients"] == {"x": [0.1 + 0.2, 1 / 3, 5e-324], "k": 3}
    assert record["source_hash"] == fit.source_hash() and len(record["source_hash"]) == 16


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match="gpu.kernels must name a calibration profile"):
        get_profile("tpu-v5")
    with pytest.raises(ValueError, match="no fit named 'nope'"):
        fits.coefficients("nope")
    with pytest.raises(ValueError, match="already registered"):
        fits.register(fits.ShippedFit("h200", lambda: {}, sources=()))


def test_linalg_matches_numpy_on_well_conditioned_problems():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(300, 5))
    y = a @ np.arange(1.0, 6.0) + 0.01 * rng.normal(size=300)
    np.testing.assert_allclose(linalg.lstsq(a, y), np.linalg.lstsq(a, y, rcond=None)[0],
                               rtol=1e-12)
    m, b = rng.normal(size=(6, 6)) + 6 * np.eye(6), rng.normal(size=6)
    np.testing.assert_allclose(linalg.solve(m, b), np.linalg.solve(m, b), rtol=1e-12)
    jtj, jtr = linalg.gram(a, y)
    np.testing.assert_allclose(jtj, a.T @ a, rtol=1e-12)
    np.testing.assert_allclose(jtr, a.T @ y, rtol=1e-12)
    with pytest.raises(ValueError, match="rank deficient"):
        linalg.lstsq(np.c_[a[:, :1], a[:, :1]], y)
    with pytest.raises(ValueError, match="singular"):
        linalg.solve(np.zeros((2, 2)), np.ones(2))


def test_bytecode_caches_in_a_source_folder_do_not_change_the_hash(tmp_path, monkeypatch):
    from simsched.cost import fits as fits_module
    monkeypatch.setattr(fits_module, "COST_DIR", tmp_path)
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "a.py").write_text("X = 1\n")
    fit = fits_module.ShippedFit("t", lambda: {}, ("profiles",))
    before = fit.source_hash()
    (tmp_path / "profiles" / "__pycache__").mkdir()
    (tmp_path / "profiles" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\x00bytecode")
    assert fit.source_hash() == before
    (tmp_path / "profiles" / "b.py").write_text("Y = 2\n")
    assert fit.source_hash() != before
