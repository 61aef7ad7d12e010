"""benchmarks/floor.py times the default's own path: its timed cost model keeps the engine
profile (async scheduling) and the promises quiet runs need, and changes no result."""

from __future__ import annotations

import pandas.testing as pdt

from benchmarks.common import TimedCostModel, timed_as_is
from simsched import SimConfig, simulate
from simsched.cost import overhead
from simsched.cost.factory import make_cost_model
from simsched.engine.scheduler.quiet import promised


def test_the_timed_copy_runs_the_default_path_and_gives_the_same_frames():
    cfg = SimConfig().replace(rate=20.0, num_requests=300, seed=3)
    model = make_cost_model(cfg.hardware)
    timed = timed_as_is(make_cost_model(cfg.hardware))
    # The plain wrapper loses both (why floor.py does not use it for simsched).
    assert not overhead.async_scheduling(cfg, TimedCostModel(model))
    assert not promised(TimedCostModel(model), "pure_iteration_time")
    assert overhead.async_scheduling(cfg, model) and overhead.async_scheduling(cfg, timed)
    assert promised(timed, "pure_iteration_time") == promised(model, "pure_iteration_time")
    plain, seen = simulate(cfg, cost_model=model), simulate(cfg, cost_model=timed)
    pdt.assert_frame_equal(plain.requests, seen.requests)
    pdt.assert_frame_equal(plain.iterations, seen.iterations)
    assert 0 < timed.num_calls <= len(seen.iterations)     # quiet runs: one call for many
    assert timed.first_at < timed.last_at
