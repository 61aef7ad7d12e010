"""Queueing theory: with one sequence at a time and fixed lengths the engine is an M/D/1 queue."""

import numpy as np
import pytest

import simsched
from simsched import LinearCostModel, SimConfig


@pytest.mark.parametrize("rho", [0.3, 0.6])
def test_md1_mean_wait_matches_pollaczek_khinchine(rho):
    prompt, output = 64, 4
    cost = LinearCostModel(overhead=1e-3, prefill_token=1e-5, prefill_attention=0.0,
                           decode_seq=2e-4, cached_token=0.0)
    # Service time D: one prefill iteration (emits token 1) plus output-1 decode iterations.
    service = (1e-3 + prompt * 1e-5) + (output - 1) * (1e-3 + 2e-4)
    rate = rho / service
    # 18,000 waits after warm-up: the sample mean's error is 2-4 % across seeds at these loads
    # (it grows as rho -> 1), hence the 5 % tolerance.
    n = 20_000
    rng = np.random.default_rng(8)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    requests = [(t, prompt, output) for t in arrivals]
    cfg = SimConfig().replace(max_num_seqs=1, max_num_batched_tokens=prompt,
                              enable_chunked_prefill=False, num_blocks=64)
    res = simsched.simulate(cfg, requests=requests, cost_model=cost)
    df = res.requests
    sojourn = (df["finished_at"] - df["first_scheduled_at"]).to_numpy()
    assert sojourn == pytest.approx(service, rel=1e-9)          # deterministic service
    wait = df["queue_time"].to_numpy()[n // 10:]                 # drop the warm-up
    expected = rate * service ** 2 / (2 * (1 - rho))
    assert wait.mean() == pytest.approx(expected, rel=0.05)
