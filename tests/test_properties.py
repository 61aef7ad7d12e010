"""Property-based tests: random configurations x adversarial workloads, every invariant on.

The long campaign (10,000+ cases) is ``python -m benchmarks.fuzz``; this is its fast CI slice.
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.fuzz import livelock_guard
from simsched.config import (PREEMPTION_MODES, SCHEDULER_STYLES, CacheConfig, HardwareConfig,
                             SchedulerConfig, SimConfig)
from simsched.api import simulate_checked
from simsched.engine.invariants import check_final_state
from simsched.engine.result_checks import check_results
from simsched.policies import QUEUE_POLICIES, VICTIM_POLICIES



@st.composite
def cases(draw):
    """A (config, requests) pair: small budgets and caches, bursts, boundary lengths."""
    max_num_seqs = draw(st.integers(1, 8))
    budget = draw(st.one_of(st.just(max_num_seqs), st.integers(max_num_seqs, 128)))
    block_size = draw(st.integers(1, 32))
    n = draw(st.integers(1, 12))
    base = draw(st.integers(0, 8))
    # Dyadic times (k / 64): see test_reliability.test_request_never_starts_before_it_arrives.
    gaps = draw(st.lists(st.one_of(st.just(0), st.integers(0, 256)), min_size=n, max_size=n))
    times = [(base * 64 + sum(gaps[:i + 1])) / 64 for i in range(n)]
    length = st.one_of(st.just(1), st.just(budget), st.just(block_size),
                       st.just(block_size + 1), st.integers(1, 160))
    prompts = draw(st.lists(length, min_size=n, max_size=n))
    outputs = draw(st.lists(st.one_of(st.just(1), st.integers(1, 60)), min_size=n, max_size=n))
    priorities = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    peak = max(p + o - 1 for p, o in zip(prompts, outputs))
    fit = -(-peak // block_size)
    watermark = draw(st.one_of(st.just(0.0), st.floats(0.0, 0.2)))
    num_blocks = fit + draw(st.one_of(st.just(0), st.integers(0, 40)))
    num_blocks += math.ceil(watermark * num_blocks) + 1 if watermark else 0
    impossible = draw(st.lists(st.integers(0, n - 1), max_size=2))
    for i in impossible:   # more than the whole cache: must be rejected, never retried
        prompts[i] = num_blocks * block_size + 1
    sched = SchedulerConfig(
        style=draw(st.sampled_from(SCHEDULER_STYLES)),
        policy=draw(st.sampled_from(sorted(QUEUE_POLICIES))),
        victim_policy=draw(st.sampled_from(sorted(VICTIM_POLICIES))),
        preemption=draw(st.booleans()), preemption_mode=draw(st.sampled_from(PREEMPTION_MODES)),
        max_num_batched_tokens=budget, max_num_seqs=max_num_seqs,
        max_num_prefills=draw(st.one_of(st.none(), st.integers(1, 3))),
        enable_chunked_prefill=draw(st.booleans()),
        max_num_preemptions=draw(st.integers(0, 4)))
    cfg = SimConfig(scheduler=sched,
                    cache=CacheConfig(block_size=block_size, num_blocks=num_blocks,
                                      watermark=watermark),
                    hardware=HardwareConfig(cost_model=draw(st.sampled_from(["unit", "linear"]))))
    requests = list(zip(times, prompts, outputs, priorities))
    return cfg, requests, set(impossible)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_every_request_finishes_or_is_rejected(case):
    cfg, requests, impossible = case
    limited = cfg.replace(max_sim_time=livelock_guard(cfg, requests))
    res, engine = simulate_checked(limited, requests)
    df = res.requests
    assert res.summary()["num_unfinished"] == 0, "livelock: unfinished at the guard time"
    check_final_state(engine)       # nothing waiting or running, KV all free
    check_results(res)              # statuses, complete outputs, ordered timestamps, work
    assert engine.kv.num_free == engine.kv.num_blocks
    # Rows are sorted by arrival; map the impossible requests' input rows to request ids.
    order = sorted(range(len(requests)), key=lambda i: (requests[i][0], i))
    rejected = {rid for rid, i in enumerate(order) if i in impossible}
    assert set(df.loc[df["status"] == "rejected", "request_id"]) >= rejected
    done = df[df["status"] == "finished"]
    assert (done["num_generated_tokens"] == done["num_output_tokens"]).all()
    assert (done["ttft"] >= 0).all()
    assert res.summary()["num_finished"] + res.summary()["num_rejected"] == len(requests)
    it = res.iterations
    assert len(it) >= (done["num_output_tokens"].max() if len(done) else 0)
    assert (it["num_seqs"] <= cfg.scheduler.max_num_seqs).all()
    assert (it["kv_blocks_used"] <= engine.kv.num_blocks).all()


def test_fuzz_cluster_slice():
    """A slice of the fuzz campaign's cluster cases (routers, stale load, shedding, prefill/
    decode roles, shared prefixes with prefix caching), every invariant on, none failing."""
    import warnings

    from benchmarks.fuzz import run_one

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        errors = [run_one((7, index, 1.0, 0.0)) for index in range(60)]
    assert [e for e in errors if e[1]] == []
