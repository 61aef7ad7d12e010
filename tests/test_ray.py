"""A tiny sweep on a local Ray instance gives the same rows as a serial sweep."""

from __future__ import annotations

import pandas as pd
import pytest

from simsched import SimConfig
from simsched.analysis.sweep import sweep

ray = pytest.importorskip("ray")


def test_ray_sweep_matches_serial():
    base = SimConfig().replace(name="lesson", num_requests=20, rate=5.0)
    kw = dict(progress=False, policy=["fcfs", "spf"])
    try:
        got = sweep(base, executor="ray", **kw)
    finally:
        ray.shutdown()
    want = sweep(base, executor="serial", **kw)
    pd.testing.assert_frame_equal(got.runs, want.runs)
    pd.testing.assert_frame_equal(got.requests, want.requests)
