"""Quiet decode steps in one clock event (simsched.engine.scheduler.quiet) change no result.

Each run is made twice, with quiet runs allowed (the default where the setup allows them) and
with them off (``MAX_QUIET_STEPS`` 0: one clock event per iteration, as before they existed); the
request frame, the iteration log and the summary must be equal bit for bit.
"""

from __future__ import annotations

import heapq
import itertools

import numpy as np
import pandas as pd
import pytest
import simpy

import simsched
import simsched.cluster.cluster as cluster_module
from simsched import SimConfig
from simsched.config.cluster import ClusterConfig
from simsched.cost.base import Batch, UnitCostModel, LinearCostModel
from simsched.cost.calibrated import CalibratedCostModel
from simsched.engine.scheduler import quiet
from simsched.engine.simpy_fast import LATE, iteration_clock, move_earlier
from simsched.workloads.workload import WorkloadConfig


def _run(cfg, monkeypatch, limit, **kwargs):
    """Simulate ``cfg`` with at most ``limit`` quiet steps per clock event; count the runs."""
    counts = {"runs": 0, "steps": 0, "cut": 0}
    take = quiet.QuietSteps.take
    cut = quiet.QuietSteps.cut

    def counting_take(self, run, log):
        counts["runs"] += 1
        counts["steps"] += run.num_steps
        return take(self, run, log)

    def counting_cut(self, now):
        counts["cut"] += 1
        return cut(self, now)

    monkeypatch.setattr(cluster_module, "MAX_QUIET_STEPS", limit)
    monkeypatch.setattr(quiet.QuietSteps, "take", counting_take)
    monkeypatch.setattr(quiet.QuietSteps, "cut", counting_cut)
    res = simsched.simulate(cfg, **kwargs)
    monkeypatch.undo()
    return res, counts


def _assert_same(a, b):
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.iterations, b.iterations, check_exact=True)
    sa, sb = a.summary(), b.summary()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert sa[key] == sb[key] or (sa[key] != sa[key] and sb[key] != sb[key]), key


CASES = {
    # one replica, async scheduling (the vllm_v1 profile's), by its arrival rule
    "single_async": dict(workload=WorkloadConfig(name="custom", lengths="uniform", prompt_range=(32, 2048), output_range=(16, 600), rate=8.0, duration=40.0)),
    # without async scheduling: an arrival ends the run at the next step's start
    "single_sync": dict(workload=WorkloadConfig(name="custom", lengths="uniform", prompt_range=(32, 2048), output_range=(16, 600), rate=8.0, duration=40.0),
                        async_scheduling=False),
    # four replicas: arrivals cut other replicas' runs, iteration ends interleave
    "fleet_least_tokens": dict(
        workload=WorkloadConfig(name="custom", lengths="uniform", prompt_range=(64, 1024),
                                output_range=(32, 400), rate=30.0, duration=30.0),
        cluster=ClusterConfig(num_replicas=4, router="least_tokens")),
    "fleet_round_robin_sync": dict(
        workload=WorkloadConfig(name="custom", lengths="uniform", prompt_range=(64, 1024),
                                output_range=(32, 400), rate=30.0, duration=30.0),
        cluster=ClusterConfig(num_replicas=3, router="round_robin"),
        async_scheduling=False),
    # a small KV cache without preemption: the queue's head waits for blocks between runs
    "kv_blocked_queue": dict(
        workload=WorkloadConfig(name="custom", lengths="uniform", prompt_range=(256, 1024),
                                output_range=(200, 600), rate=20.0, duration=20.0),
        num_blocks=400),
    "kv_blocked_queue_sync": dict(
        workload=WorkloadConfig(name="custom", lengths="uniform", prompt_range=(256, 1024),
                                output_range=(200, 600), rate=20.0, duration=20.0),
        num_blocks=400, async_scheduling=False),
    # a small KV cache: growth groups run out of blocks, runs stop before them (preemption on)
    "kv_pressure": dict(
        workload=WorkloadConfig(name="custom", lengths="uniform", prompt_range=(256, 1024),
                                output_range=(200, 600), rate=20.0, duration=20.0),
        num_blocks=400, preemption=True),
}


def _config(case):
    # The classic preset: its async replicas apply the arrival rule, where quiet runs are taken;
    # a replica that plans ahead (the default since issue 40) takes none (quiet.py).
    return SimConfig.preset("classic").replace(**CASES[case])


@pytest.mark.parametrize("case", sorted(CASES))
def test_quiet_runs_change_nothing(case, monkeypatch):
    cfg = _config(case)
    fused, counts = _run(cfg, monkeypatch, quiet.MAX_QUIET_STEPS)
    plain, none = _run(cfg, monkeypatch, 0)
    assert none["runs"] == 0
    # The fast path is taken, and most runs are whole: it is what is being compared.
    assert counts["runs"] > 10 and counts["steps"] > 2 * counts["runs"]
    _assert_same(fused, plain)


def test_arrivals_cut_runs_and_change_nothing(monkeypatch):
    """Arrivals at a busy replica of a fleet end runs early (the cut path is exercised)."""
    cfg = _config("fleet_least_tokens")
    fused, counts = _run(cfg, monkeypatch, quiet.MAX_QUIET_STEPS)
    plain, _ = _run(cfg, monkeypatch, 0)
    assert counts["cut"] > 10
    _assert_same(fused, plain)


@pytest.mark.parametrize("limit", [2, 3, 7, 40])
def test_any_run_length_changes_nothing(limit, monkeypatch):
    cfg = _config("single_sync")
    fused, counts = _run(cfg, monkeypatch, limit)
    plain, _ = _run(cfg, monkeypatch, 0)
    assert counts["runs"] > 0 and max(2, counts["steps"] // counts["runs"]) <= limit
    _assert_same(fused, plain)


def test_setups_that_others_read_take_no_quiet_runs(monkeypatch):
    """Where state is read between events (invariant checks, prefix caching), no run is taken."""
    cfg = _config("single_async")
    _, counts = _run(cfg.replace(check_invariants=True), monkeypatch, quiet.MAX_QUIET_STEPS)
    assert counts["runs"] == 0
    prefix = cfg.replace(enable_prefix_caching=True)
    _, counts = _run(prefix, monkeypatch, quiet.MAX_QUIET_STEPS)
    assert counts["runs"] == 0


@pytest.mark.parametrize("n", [1, 7, 64, 255, 256, 700, 3000])
def test_decode_iteration_times_are_iteration_time_bit_for_bit(n):
    from simsched.cost.factory import make_cost_model
    rng = np.random.default_rng(n)
    for overhead in ("vllm_v1", "eager_2023", "measured_2023"):
        model = make_cost_model(SimConfig().replace(engine_overhead=overhead).hardware)
        assert isinstance(model, CalibratedCostModel)
        first = int(rng.integers(n, 200 * n + 2))
        got = model.decode_iteration_times(n, first, 12)
        want = [model.iteration_time(Batch((), (), n, first + n * j)) for j in range(12)]
        assert got == want
        assert all(type(t) is float for t in got)


@pytest.mark.parametrize("gpu,tp", [("a100-80gb", 1), ("h100-sxm", 2), ("l40s", 1), ("h200", 1)])
def test_decode_iteration_times_across_floors_bit_for_bit(gpu, tp):
    """Contexts from empty to huge cross where the decode term meets its floor and where the
    iteration floor stops binding: the shortcut (no floor in range) and the step-by-step path
    both give iteration_time's floats."""
    from simsched.cost.factory import make_cost_model
    for overhead in ("vllm_v1", "eager_2023"):
        hw = SimConfig().replace(engine_overhead=overhead, gpu=gpu,
                                 tensor_parallel_size=tp).hardware
        model = make_cost_model(hw)
        for n in (1, 3, 40, 256):
            for first in [0, 1, 17] + [int(10 ** (e / 4)) for e in range(8, 30)]:
                got = model.decode_iteration_times(n, first, 16)
                want = [model.iteration_time(Batch((), (), n, first + n * j)) for j in range(16)]
                assert got == want, (overhead, n, first)


def test_the_generic_decode_times_call_iteration_time():
    model = LinearCostModel()
    got = quiet.decode_iteration_times(model, 5, 1000, 4)
    assert got == [model.iteration_time(Batch((), (), 5, 1000 + 5 * j)) for j in range(4)]
    assert quiet.decode_iteration_times(UnitCostModel(0.5), 3, 9, 3) == [0.5] * 3


def test_a_subclass_overriding_the_time_loses_the_promises():
    class Noisy(LinearCostModel):
        def iteration_time(self, batch):
            return super().iteration_time(batch) * 1.01

    class Declared(Noisy):
        pure_iteration_time = True

    assert quiet.promised(LinearCostModel(), "pure_iteration_time")
    assert not quiet.promised(Noisy(), "pure_iteration_time")
    assert quiet.promised(Declared(), "pure_iteration_time")
    assert not quiet.promised(LinearCostModel(), "decode_iteration_times")


def test_move_earlier_keeps_the_heap_and_the_event_order():
    env = simpy.Environment()
    queue, ids = [], itertools.count()
    entries = [(t, LATE, next(ids), iteration_clock(env)[2])
               for t in (5.0, 1.0, 3.0, 9.0, 7.0, 2.0)]
    for e in entries:
        heapq.heappush(queue, e)
    moved = (0.5, LATE, next(ids), entries[3][3])
    move_earlier(queue, entries[3], moved)
    order = [heapq.heappop(queue) for _ in range(len(queue))]
    assert [e[0] for e in order] == [0.5, 1.0, 2.0, 3.0, 5.0, 7.0]
    assert order[0] is moved and entries[3] not in order


def test_a_run_ends_where_the_clock_resolution_changes(monkeypatch):
    """A run whose steps would start past the next power of two (where the loop's float
    resolution bounds change) is planned up to it, not dropped: the loop takes that step."""
    truncated = []
    plan = quiet.QuietSteps.plan

    def spying_plan(self, now, ulp_below, ulp_floor):
        k = self.scheduler.quiet_steps(self.limit)
        run = plan(self, now, ulp_below, ulp_floor)
        if run is not None and run.num_planned < k:
            truncated.append((run.times[-2], run.times[-1], ulp_below, run.finishes))
        return run

    cfg = _config("single_sync")
    monkeypatch.setattr(quiet.QuietSteps, "plan", spying_plan)
    fused, counts = _run(cfg, monkeypatch, quiet.MAX_QUIET_STEPS)
    plain, _ = _run(cfg, monkeypatch, 0)
    assert truncated
    for last_start, end, ulp_below, finishes in truncated:
        assert last_start < ulp_below <= end and not finishes
    _assert_same(fused, plain)
