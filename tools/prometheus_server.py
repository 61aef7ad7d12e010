"""A real Prometheus over a run's metrics, for tests and docs figures: backfill an OpenMetrics
file with ``promtool`` into a fresh TSDB, serve it on a free loopback port, answer PromQL."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path


def available() -> bool:
    """Whether Debian's prometheus package (promtool and the server) is installed."""
    return bool(shutil.which("promtool") and shutil.which("prometheus"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(metrics_file: Path, workdir: Path, ready_within: float = 60.0):
    """Backfill ``metrics_file`` into ``workdir/data`` and yield the server's base URL; the
    server is stopped on exit."""
    subprocess.run([shutil.which("promtool"), "tsdb", "create-blocks-from", "openmetrics",
                    str(metrics_file), str(workdir / "data")], check=True, capture_output=True,
                   timeout=120)
    (workdir / "prometheus.yml").write_text("global: {}\n")
    port = _free_port()
    proc = subprocess.Popen([shutil.which("prometheus"),
                             f"--config.file={workdir / 'prometheus.yml'}",
                             f"--storage.tsdb.path={workdir / 'data'}",
                             "--storage.tsdb.retention.time=100y",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_within
        while True:
            try:
                with urllib.request.urlopen(base + "/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"Prometheus did not start within {ready_within:.0f} s")
            time.sleep(0.3)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def query(base: str, expr: str, at: float) -> list:
    """An instant PromQL query's result vector."""
    return _get(base, "query", {"query": expr, "time": repr(at)})


def query_range(base: str, expr: str, start: float, end: float, step: float) -> list:
    """A range PromQL query's result matrix."""
    return _get(base, "query_range", {"query": expr, "start": start, "end": end, "step": step})


def _get(base: str, endpoint: str, params: dict) -> list:
    url = f"{base}/api/v1/{endpoint}?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=20) as resp:
        body = json.loads(resp.read())
    if body.get("status") != "success":
        raise RuntimeError(f"PromQL {params.get('query')!r}: {body}")
    return body["data"]["result"]
