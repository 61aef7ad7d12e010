"""The one-page HTML report (issue 46, item 5): self-contained, rendered by headless Chromium
without script errors, with every figure decoded and the run's numbers on it."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

import simsched
from simsched import SimConfig
from simsched.analysis.report import report_from_dir
from simsched.cli import main

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    assert main(["run", "--num-requests", "60", "--rate", "25", "--seeds", "2",
                 "--out", str(out)]) == 0
    return out


def test_report_is_self_contained_and_holds_the_run(run_dir):
    page = report_from_dir(run_dir).read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert not re.search(r'(src|href)="(?!data:)', page), "the page links outside itself"
    assert page.count('src="data:image/png;base64,') == 2          # timeline and CDFs
    for section in ("Summary", "Timeline", "Latency distributions", "Replicas", "Config"):
        assert f"<h2>{section}</h2>" in page
    assert "over 2 seeds" in page and "ci_low" in page


def test_report_from_results(tmp_path):
    res = simsched.simulate(SimConfig().replace(num_requests=20, rate=20.0))
    page = res.to_report(tmp_path / "r.html").read_text()
    assert f"<td>{res.summary()['num_finished']}</td>" in page


def test_report_refuses_what_is_not_a_run(tmp_path):
    with pytest.raises(ValueError, match="lacks summary.csv"):
        report_from_dir(tmp_path)
    with pytest.raises(ValueError, match="not a directory"):
        report_from_dir(tmp_path / "nope")
    assert main(["report", str(tmp_path)]) == 2


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("Chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)")


def test_chromium_renders_the_report_without_script_errors(run_dir, tmp_path):
    browser = _chromium()
    page = report_from_dir(run_dir)
    dom = subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'u1'}",
                          "--virtual-time-budget=10000", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert 'data-rendered="ok"' in body, body
    assert 'data-images="2/2"' in body, body
    assert "data-error" not in re.search(r"<html[^>]*>", dom).group(0)
    shot = tmp_path / "report.png"
    subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'u2'}",
                    "--window-size=1200,1600", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_a_script_error_would_be_seen(tmp_path):
    browser = _chromium()
    bad = tmp_path / "bad.html"
    from simsched.analysis.report import _ONERROR

    bad.write_text(f"<html><head><script>{_ONERROR}</script></head><body>"
                   "<script>undefinedFunction();</script></body></html>")
    dom = subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'u'}",
                          "--virtual-time-budget=5000", "--dump-dom", bad.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    assert "data-error" in re.search(r"<html[^>]*>", dom).group(0)
