"""The host time of an engine that does not pipeline its steps (simsched.cost.host_time)."""

from __future__ import annotations

import types

import numpy as np
import pytest

from simsched import SimConfig, simulate
from simsched.config.parallel import ParallelConfig
from simsched.cost import factory, vllm_silicon
from simsched.cost.base import Batch
from experiments._silicon_recipes import vllm_async_default

HOST = {"sync_step_time": 0.8e-3, "sync_seq_time": 40e-6}


def _cfg(**extra):
    return SimConfig().replace(model="llama-3.1-8b", gpu="h100-sxm", num_requests=60,
                               rate=6.0, seed=5, **extra)


def _model(cfg, host=None):
    return factory.engine_terms_cost_model(cfg.hardware, {**vllm_silicon.terms(), **(host or {})})


def test_shipped_profiles_add_no_host_time():
    cm = factory.make_cost_model(_cfg().hardware)
    assert cm.synchronous() is cm
    assert _model(_cfg()).synchronous() is _model(_cfg())


def test_a_synchronous_step_adds_the_host_time_per_step_and_sequence():
    cm = _model(_cfg(), HOST)
    sync = cm.synchronous()
    assert sync is not cm and sync.synchronous() is sync and cm.synchronous() is sync
    for batch in (Batch(num_decode_seqs=24, decode_context_sum=24 * 900),
                  Batch([700], [0], num_decode_seqs=5, decode_context_sum=5 * 300)):
        seqs = batch.num_decode_seqs + len(batch.prefill_new_tokens)
        assert sync.iteration_time(batch) - cm.iteration_time(batch) == pytest.approx(
            HOST["sync_step_time"] + HOST["sync_seq_time"] * seqs, rel=1e-9)
        assert sum(sync.breakdown(batch).values()) == pytest.approx(sync.iteration_time(batch))
    # Quiet decode steps are timed with the same floats as one step at a time.
    times = sync.decode_iteration_times(16, 16 * 500, 5)
    assert times == [sync.iteration_time(Batch(num_decode_seqs=16,
                                               decode_context_sum=16 * 500 + 16 * i))
                     for i in range(5)]


def test_only_a_replica_that_does_not_pipeline_pays_it():
    on, off = _cfg(), _cfg(async_scheduling=False)
    tpot = {}
    for name, cfg in (("on", on), ("off", off)):
        for host in (None, HOST):
            res = simulate(cfg, cost_model=_model(cfg, host)).summary()
            tpot[name, host is not None] = res["tpot_mean"]
    assert tpot["on", True] == tpot["on", False]          # pipelined: hidden
    extra = tpot["off", True] - tpot["off", False]
    # At least the per-step part on every step, at most with a batch of every request in flight.
    assert HOST["sync_step_time"] < extra < HOST["sync_step_time"] + 60 * HOST["sync_seq_time"]


def test_a_parallel_layout_pays_it_once_per_step():
    cfg = SimConfig().replace(model="mixtral-8x7b", gpu="h100-sxm", tensor_parallel_size=2,
                              parallel=ParallelConfig(pipeline_parallel_size=2))
    cm = factory.engine_terms_cost_model(cfg.hardware, {**vllm_silicon.terms(), **HOST})
    batch = Batch(num_decode_seqs=8, decode_context_sum=8 * 400)
    sync = cm.synchronous()
    assert sync.iteration_time(batch) - cm.iteration_time(batch) == pytest.approx(
        HOST["sync_step_time"] + HOST["sync_seq_time"] * 8, rel=1e-9)
    plain = factory.make_cost_model(cfg.hardware)
    assert plain.synchronous() is plain


def test_terms_from_the_command_line():
    t = vllm_silicon.parse("fitted,sync_step_time=0.0005")
    assert t == {**vllm_silicon.terms(), "sync_step_time": 0.0005}
    assert vllm_silicon.parse("sync_seq_time=2e-5")["prefill_expert_scale"] == 1.0
    with pytest.raises(ValueError, match="sync_step_time must be a finite number >= 0"):
        vllm_silicon.parse("fitted,sync_step_time=-1")
    with pytest.raises(ValueError, match="unknown term 'sync_time'"):
        vllm_silicon.parse("neutral,sync_time=1")
    with pytest.raises(ValueError, match="engine_terms.sync_seq_time"):
        factory.engine_terms_cost_model(_cfg().hardware,
                                        {**vllm_silicon.terms(), "sync_seq_time": np.nan})


@pytest.mark.parametrize("version, source, want", [
    ("0.12.0", "", False), ("0.11.2", "", False), ("0.16.0", "", True), ("0.18.0", "", True),
    (float("nan"), "source_file=x.csv; measured=2025-10-29T00:00:00.000Z", False),
    (float("nan"), "db-dump; measured=2026-03-25T00:00:00.000Z", True),
    (float("nan"), "no date", True),
])
def test_which_vllm_versions_scheduled_asynchronously(version, source, want):
    row = types.SimpleNamespace(backend_version=version, silicon_data_source=source)
    assert vllm_async_default(row) is want
