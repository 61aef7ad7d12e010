"""The per-user coefficient cache: written once, read back bit for bit, keyed by the data."""

from __future__ import annotations

import json

import pytest

from simsched.cost import calibration as cal
from simsched.cost import coefcache


def test_cache_roundtrip_is_exact(tmp_path, monkeypatch):
    monkeypatch.setenv("SIMSCHED_CACHE_DIR", str(tmp_path))
    calls = []

    def fit():
        calls.append(1)
        return cal.fit_all()

    first = coefcache.cached("a100-test", fit)
    second = coefcache.cached("a100-test", fit)
    assert len(calls) == 1
    assert second == first == json.loads(json.dumps(cal.fit_all()))
    files = list(tmp_path.glob("a100-test-*.json"))
    assert len(files) == 1 and coefcache.data_hash() in files[0].name


def test_torn_file_is_refitted(tmp_path, monkeypatch):
    monkeypatch.setenv("SIMSCHED_CACHE_DIR", str(tmp_path))
    coefcache.cached("x", lambda: {"a": 1.5})
    path = next(tmp_path.glob("x-*.json"))
    path.write_text("{not json")
    assert coefcache.cached("x", lambda: {"a": 2.5}) == {"a": 2.5}
    assert json.loads(path.read_text()) == {"a": 2.5}


@pytest.mark.parametrize("value", ["off", "", "0"])
def test_cache_can_be_switched_off(tmp_path, monkeypatch, value):
    monkeypatch.setenv("SIMSCHED_CACHE_DIR", value)
    assert coefcache.cache_dir() is None
    assert coefcache.cached("y", lambda: {"b": 1}) == {"b": 1}


def test_unwritable_cache_falls_back(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SIMSCHED_CACHE_DIR", str(blocker / "sub"))  # a folder under a file
    assert coefcache.cached("z", lambda: {"c": 3}) == {"c": 3}


def test_key_changes_with_the_data(tmp_path):
    a = tmp_path / "a.csv"
    a.write_text("x\n1\n")
    before = coefcache.hash_files([a], tmp_path)
    a.write_text("x\n2\n")
    assert coefcache.hash_files([a], tmp_path) != before
    assert len(coefcache.data_hash()) == 16


def test_anchor_coefficients_cover_every_anchor():
    coef = coefcache.kernel_coefficients()
    assert set(coef) == {"a100-80gb", "h200"}
    assert coef["a100-80gb"] == json.loads(json.dumps(cal.fit_all()))
    with pytest.raises(ValueError, match="anchor"):
        coefcache.anchor_coefficients("tpu")
