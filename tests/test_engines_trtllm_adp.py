"""TensorRT-LLM's attention-DP context balancing (simsched.engine.engines.trtllm_adp)."""

import pytest

from simsched import SimConfig, simulate
from simsched.config import SchedulerConfig
from simsched.config.parallel import ParallelConfig
from simsched.engine.engines.trtllm import TRTLLMScheduler
from simsched.engine.engines.trtllm_adp import AttentionDPBalance
from simsched.engine.kv.cache import KVCacheManager
from simsched.request import Request

BALANCE = {"attention_dp_enable_balance": True, "attention_dp_timeout_iters": 3,
           "attention_dp_batching_wait_iters": 0}


def dealt(balance, *prompts):
    """Requests of these prompt lengths dealt in order; their ranks."""
    reqs = [Request(i, 0.0, p, 8) for i, p in enumerate(prompts)]
    return reqs, [balance.deal(r) for r in reqs]


def test_dealing_takes_the_rank_with_fewest_active_tokens_below_the_expected_count():
    b = AttentionDPBalance(2, 16, 8192, 50, 0)
    reqs, ranks = dealt(b, 100, 10, 10)
    # Both empty: rank 0; then rank 1 (rank 0 is at the expected count 1); then both hold one
    # and the expected count is 2: rank 1, with fewer tokens (10 against 100).
    assert ranks == [0, 1, 1]
    assert b.num_active == [1, 2] and b.num_active_tokens == [100, 20]
    b.leave(reqs[0])
    assert b.num_active == [0, 2] and b.num_active_tokens == [0, 20]
    assert dealt(b, 5)[1] == [0]


def test_contexts_wait_until_every_rank_has_one_or_the_count_times_out():
    b = AttentionDPBalance(2, 16, 8192, 3, 0)
    (c0, c1, g0, g1), _ = dealt(b, 10, 10, 10, 10)       # ranks 0, 1, 0, 1
    gen = [g0, g1]
    # Only rank 0 has a context, both ranks generate: held for 2 steps, run at the third.
    assert [b.admits([(c0, 10)], gen) for _ in range(3)] == [False, False, True]
    assert b.num_held_steps == 2
    # Both ranks have one: runs at once, and the count restarts.
    b.admits([], gen)
    assert b.waiting_iters == 1
    assert b.admits([(c0, 10), (c1, 10)], gen) and b.waiting_iters == 0


def test_the_count_advances_without_contexts_so_a_context_waits_out_the_rest():
    b = AttentionDPBalance(2, 16, 8192, 4, 0)
    (c0, g0, g1), _ = dealt(b, 10, 10, 10)                # ranks 0, 1, 0
    gen = [g0, g1]
    assert not b.admits([], gen) and not b.admits([], gen)
    assert [b.admits([(c0, 10)], gen) for _ in range(2)] == [False, True]


def test_contexts_run_when_a_rank_has_nothing_to_generate():
    b = AttentionDPBalance(2, 16, 8192, 50, 0)
    (c0, g0), _ = dealt(b, 10, 10)                        # ranks 0, 1
    assert b.admits([(c0, 10)], [g0])                     # rank 0 generates nothing
    assert b.admits([(c0, 10)], [])


def test_batching_wait_holds_balanced_contexts_while_every_rank_generates():
    b = AttentionDPBalance(2, 16, 8192, 50, 2)
    (c0, c1, g0, g1), _ = dealt(b, 10, 10, 10, 10)
    ctx, gen = [(c0, 10), (c1, 10)], [g0, g1]
    assert [b.admits(ctx, gen) for _ in range(4)] == [False, False, True, False]


def test_a_rank_at_its_batch_limit_keeps_the_contexts_waiting():
    b = AttentionDPBalance(2, 2, 8192, 50, 0)             # one request per rank
    (c0, c1, g0, g1), _ = dealt(b, 10, 10, 10, 10)
    assert not b.admits([(c0, 10), (c1, 10)], [g0, g1])


def test_each_rank_batches_its_own_requests_within_its_share_of_the_budget():
    b = AttentionDPBalance(2, 64, 200, 50, 0)
    reqs, ranks = dealt(b, 60, 60, 60, 60)                 # ranks 0, 1, 0, 1
    ctx, gen = b.micro_batch(reqs, lambda r: False)
    # 100 tokens a rank: one 60-token prompt each; the second of each rank does not fit.
    assert [r.id for r, _ in ctx] == [0, 1] and gen == []


def test_one_rank_or_balance_off_makes_no_balancer():
    def sched(dp, options):
        cfg = SchedulerConfig(engine="trtllm", engine_options=options, max_num_seqs=64,
                              max_num_batched_tokens=8192, enable_chunked_prefill=False)
        return TRTLLMScheduler(cfg, KVCacheManager(64, 32), attention_dp_size=dp)

    assert sched(1, BALANCE).adp is None
    assert sched(4, {}).adp is None
    assert sched(4, BALANCE).adp.num_ranks == 4
    with pytest.raises(ValueError, match="attention_dp_timeout_iters must be an integer >= 0"):
        sched(4, {"attention_dp_timeout_iters": -1})
    with pytest.raises(ValueError, match="attention_dp_enable_balance must be true or false"):
        sched(4, {"attention_dp_enable_balance": 1})


def _dep_run(options):
    cfg = SimConfig.preset(
        "trtllm", model="qwen3-235b-a22b-fp8", gpu="h200", tensor_parallel_size=1,
        parallel=ParallelConfig(data_parallel_size=4, enable_expert_parallel=True),
        **{"scheduler.engine_options": options, "scheduler.enable_chunked_prefill": False,
           "workload.rate": 20.0, "workload.duration": 20.0, "seed": 3})
    return simulate(cfg)


def test_balancing_holds_prefills_back_end_to_end():
    off, on = _dep_run({}), _dep_run({**BALANCE, "attention_dp_timeout_iters": 20})
    assert len(on.requests) == len(off.requests)
    assert on.summary()["num_finished"] == off.summary()["num_finished"]
    # Prefills wait for a balanced step or the count: first tokens come later, in fewer steps
    # that run prefills.
    assert on.summary()["ttft_p50"] > 1.5 * off.summary()["ttft_p50"]
    prefill_steps = [int((r.iterations["num_prefill_tokens"] > 0).sum()) for r in (off, on)]
    assert prefill_steps[1] < prefill_steps[0]


@pytest.mark.parametrize("seed", range(4))
def test_invariants_hold_with_balancing_under_a_small_fuzz(seed):
    """KV conservation, budgets and membership after every iteration with the ranks' own
    batches and the hold; every request ends."""
    import numpy as np

    from simsched.cluster.cluster import Cluster
    from simsched.cost.base import UnitCostModel
    from simsched.engine.invariants import check_final_state
    from simsched.request import Status
    from tests.test_engines import _fuzz_requests

    rng = np.random.default_rng(seed)
    ranks = (2, 4)[seed % 2]
    policy = ("GUARANTEED_NO_EVICT", "MAX_UTILIZATION")[seed // 2]
    cfg = SimConfig.preset(
        "trtllm", model="qwen3-235b-a22b-fp8", gpu="h200", tensor_parallel_size=1,
        parallel=ParallelConfig(data_parallel_size=ranks, enable_expert_parallel=True),
        check_invariants=True, **{
            "scheduler.engine_options": {**BALANCE, "capacity_scheduler_policy": policy},
            "scheduler.enable_chunked_prefill": bool(seed % 3 == 2),
            "scheduler.max_num_batched_tokens": 2048 * ranks,
            "scheduler.max_num_seqs": 8 * ranks, "cache.enable_prefix_caching": bool(seed % 2)})
    requests = _fuzz_requests(rng, 40, shared=True)
    engine = Cluster(cfg, requests, UnitCostModel(0.01), int(rng.choice([60, 200])))
    engine.run()
    check_final_state(engine)
    assert engine.replicas[0].scheduler.adp is not None
    done = [r for r in requests if r.status is Status.FINISHED]
    assert len(done) + sum(r.status is Status.REJECTED for r in requests) == len(requests)
    assert all(r.num_generated == r.num_output_tokens for r in done)
