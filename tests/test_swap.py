"""Swap preemption: transfer time, progress kept across a swap, and the recompute fallback."""

import pytest

from simsched.cost import hardware
from simsched.api import make_requests
from simsched.config import SimConfig
from simsched.cost.base import UnitCostModel
from simsched.cluster.cluster import Cluster
from simsched.request import Status

BLOCKS = 60


def run(swap_space_gib=1.0, bandwidth=10.0, n=24, style="stall_free"):
    table = [(0.01 * i, 40 + 7 * i, 120 + 3 * i) for i in range(n)]
    config = SimConfig(check_invariants=True).replace(
        preemption_mode="swap", style=style, max_num_seqs=16, max_num_batched_tokens=256,
        **{"cache.num_blocks": BLOCKS, "cache.swap_space_gib": swap_space_gib,
           "cache.swap_bandwidth_gbps": bandwidth})
    reqs = make_requests(table)
    engine = Cluster(config, reqs, UnitCostModel(0.01), BLOCKS)
    engine.run()
    return engine, reqs


def test_swap_time_is_bytes_over_bandwidth():
    engine, reqs = run(bandwidth=10.0)
    swap_time = sum(row[-1] for row in engine.replicas[0].iteration_rows)
    moved = sum(r.swapped_bytes for r in reqs)          # out and back in
    assert moved > 0
    assert swap_time == pytest.approx(moved / 10e9)
    per_block = hardware.kv_bytes_per_token(engine.config.hardware) * 16
    assert all(r.swapped_bytes % per_block == 0 for r in reqs)
    # every iteration's duration is the cost model's 0.01 s plus its swap time
    assert all(row[1] == pytest.approx(0.01 + row[-1]) for row in engine.replicas[0].iteration_rows)


def test_swap_in_restores_progress_without_recomputation():
    engine, reqs = run()
    swapped = [r for r in reqs if r.num_swaps]
    assert swapped
    assert all(r.status is Status.FINISHED and r.num_generated == r.num_output_tokens
               for r in reqs)
    assert sum(r.num_recomputed_tokens for r in reqs) == 0
    # decode work equals exactly the tokens needed: nothing was computed twice
    prefill = sum(row[2] for row in engine.replicas[0].iteration_rows)
    decode = sum(row[3] for row in engine.replicas[0].iteration_rows)
    assert prefill + decode == sum(r.num_prompt_tokens + r.num_output_tokens - 1 for r in reqs)
    causes = [c for r in swapped for c in r.causes]
    assert causes and all(c.mode == "swap" and c.num_lost_tokens == 0 for c in causes)
    assert engine.scheduler.swap.used_bytes == 0 and not engine.scheduler.swapped


def test_full_swap_space_falls_back_to_recompute():
    engine, reqs = run(swap_space_gib=0.0)
    assert sum(r.num_swaps for r in reqs) == 0
    assert sum(r.num_preemptions for r in reqs) > 0
    assert sum(r.num_recomputed_tokens for r in reqs) > 0
    assert all(c.mode == "recompute" for r in reqs for c in r.causes)
    # a space for about one request's KV: some swaps, the rest recomputed
    per_block = hardware.kv_bytes_per_token(engine.config.hardware) * 16
    engine, reqs = run(swap_space_gib=20 * per_block / 2**30)
    modes = {c.mode for r in reqs for c in r.causes}
    assert modes == {"swap", "recompute"}
    assert all(r.status is Status.FINISHED for r in reqs)


@pytest.mark.parametrize("style", ["prefill_first", "static"])
def test_swap_works_with_every_style(style):
    engine, reqs = run(style=style)
    assert all(r.status is Status.FINISHED for r in reqs)
    assert sum(r.num_recomputed_tokens for r in reqs) == 0
