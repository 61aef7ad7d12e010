"""The scheduler as a plain object: ordering, budgets, chunking, preemption triggers, victims."""

import math

import pytest

from simsched.config import SchedulerConfig
from simsched.engine.kv.cache import KVCacheManager
from simsched.request import Request, Status
from simsched.engine.scheduler.core import Scheduler


def make(num_blocks=1000, block_size=16, **cfg):
    kv = KVCacheManager(num_blocks, block_size)
    return Scheduler(SchedulerConfig(**cfg), kv), kv


def run_iteration(sched, now):
    batch = sched.schedule(now)
    firsts, finished = sched.commit(now + 1.0)
    return batch, firsts, finished


def test_decodes_first_then_partial_prefill_then_admission():
    sched, _ = make(max_num_batched_tokens=100, max_num_seqs=8)
    a = Request(0, 0.0, 50, 5)
    b = Request(1, 0.0, 150, 5)
    sched.add(a, 0.0)
    sched.add(b, 0.0)
    batch, firsts, _ = run_iteration(sched, 0.0)
    # a's whole prompt (50) and a 50-token chunk of b fill the 100-token budget
    assert batch.prefill_new_tokens == [50, 50] and batch.num_decode_seqs == 0
    assert firsts == [a]
    c = Request(2, 0.5, 30, 5)
    sched.add(c, 0.5)
    batch, _, _ = run_iteration(sched, 1.0)
    # a decodes first (1 token), b continues with 99 of its remaining 100, c gets nothing
    assert batch.num_decode_seqs == 1
    assert batch.prefill_new_tokens == [99]
    assert batch.prefill_cached_tokens == [50]
    assert c.status is Status.WAITING
    assert batch.num_tokens <= 100


def test_token_budget_and_max_num_seqs_respected():
    sched, _ = make(max_num_batched_tokens=64, max_num_seqs=3)
    for i in range(6):
        sched.add(Request(i, 0.0, 10, 20), 0.0)
    now = 0.0
    for _ in range(30):
        batch = sched.schedule(now)
        assert batch.num_tokens <= 64
        assert len(sched.running) <= 3
        sched.commit(now + 1)
        now += 1


def test_chunked_prefill_splits_long_prompt():
    sched, _ = make(max_num_batched_tokens=512, max_num_seqs=4)
    req = Request(0, 0.0, 1300, 3)
    sched.add(req, 0.0)
    chunks = []
    for t in range(3):
        batch, firsts, _ = run_iteration(sched, float(t))
        chunks.extend(batch.prefill_new_tokens)
    assert chunks == [512, 512, 276]
    assert req.first_token_at == 3.0        # the iteration finishing the prefill emits a token


def test_without_chunking_prompt_waits_for_a_whole_budget():
    sched, _ = make(max_num_batched_tokens=100, max_num_seqs=4, enable_chunked_prefill=False)
    sched.add(Request(0, 0.0, 60, 3), 0.0)
    sched.add(Request(1, 0.0, 60, 3), 0.0)
    batch, _, _ = run_iteration(sched, 0.0)
    assert batch.prefill_new_tokens == [60]


@pytest.mark.parametrize("policy,expected", [
    ("fcfs", [0, 1, 2]), ("spf", [2, 1, 0]), ("priority", [1, 2, 0])])
def test_admission_follows_policy_order(policy, expected):
    sched, _ = make(max_num_batched_tokens=1000, max_num_seqs=1, policy=policy)
    reqs = [Request(0, 0.0, 300, 1, priority=2), Request(1, 0.1, 200, 1, priority=0),
            Request(2, 0.2, 100, 1, priority=1)]
    for r in reqs:
        sched.add(r, 0.3)
    order = []
    for t in range(3):
        _, _, finished = run_iteration(sched, float(t))
        order.extend(r.id for r in finished)
    assert order == expected


def test_decode_out_of_blocks_preempts_fewest_generated():
    # 4 blocks of 4 tokens; two requests with 4-token prompts grow until the cache is full
    sched, kv = make(num_blocks=4, block_size=4, max_num_batched_tokens=64, max_num_seqs=4)
    a = Request(0, 0.0, 4, 12)          # 15 tokens at most: fits the 16-token cache alone
    sched.add(a, 0.0)
    run_iteration(sched, 0.0)
    run_iteration(sched, 1.0)            # a has 2 tokens
    b = Request(1, 2.0, 4, 12)
    assert sched.add(b, 2.0)
    now = 2.0
    victims = []
    for _ in range(20):
        sched.schedule(now)
        victims = list(sched.preempted)
        if victims:
            break
        sched.commit(now + 1)
        now += 1
    assert victims
    victim, cause = victims[0]
    assert victim is b                   # b generated fewer tokens than a
    assert cause.reason == "kv_full" and cause.preempted_by is None
    assert b.status is Status.WAITING and kv.num_held(b.id) == 0
    assert cause.num_lost_tokens > 0 and b.num_recomputed_tokens == cause.num_lost_tokens
    # recompute: the re-prefill covers prompt + every token generated so far
    assert b.prefill_target == b.num_prompt_tokens + b.num_generated


def test_newest_victim_policy_picks_last_admitted():
    sched, _ = make(num_blocks=6, block_size=4, max_num_seqs=4, victim_policy="newest")
    reqs = [Request(i, 0.0, 4, 16) for i in range(3)]   # 19 tokens = 5 of the 6 blocks each
    for r in reqs:
        assert sched.add(r, 0.0)
    now = 0.0
    for _ in range(40):
        sched.schedule(now)
        if sched.preempted:
            break
        sched.commit(now + 1)
        now += 1
    assert sched.preempted and sched.preempted[0][0] is reqs[2]


def test_admission_trigger_preempts_lower_ranked_only_when_enabled():
    def scenario(preemption):
        sched, kv = make(num_blocks=8, block_size=4, max_num_batched_tokens=64, max_num_seqs=4,
                         policy="spf", preemption=preemption)
        long = Request(0, 0.0, 28, 4)            # 7 of the 8 blocks after its prefill
        sched.add(long, 0.0)
        run_iteration(sched, 0.0)
        short = Request(1, 1.0, 8, 5)            # needs 2 blocks, 1 free
        assert sched.add(short, 1.0)
        sched.schedule(1.0)
        return sched, long, short

    sched, long, short = scenario(False)
    assert not sched.preempted and short.status is Status.WAITING
    sched, long, short = scenario(True)
    assert [(v.id, c.reason, c.preempted_by) for v, c in sched.preempted] == [(0, "admission", 1)]
    assert short.status is Status.RUNNING and long.status is Status.WAITING


def test_admission_trigger_never_preempts_higher_ranked():
    sched, _ = make(num_blocks=8, block_size=4, max_num_seqs=4, policy="spf", preemption=True)
    short = Request(0, 0.0, 24, 8)                # 6 of the 8 blocks after its prefill
    sched.add(short, 0.0)
    run_iteration(sched, 0.0)
    longer = Request(1, 1.0, 30, 2)               # needs 8 blocks: fits alone, not now
    assert sched.add(longer, 1.0)
    sched.schedule(1.0)
    assert not sched.preempted and longer.status is Status.WAITING


def test_impossible_requests_are_rejected_with_reason():
    kv = KVCacheManager(10, 16)
    sched = Scheduler(SchedulerConfig(), kv, max_model_len=200)
    too_long = Request(0, 0.0, 150, 100)
    sched2 = Scheduler(SchedulerConfig(), KVCacheManager(10, 16))
    assert not sched.add(too_long, 0.0)
    assert "max_model_len" in too_long.reject_reason and too_long.status is Status.REJECTED
    assert sched2.add(Request(2, 0.0, 100, 61), 0.0)       # 160 tokens = 10 blocks: fits
    assert not sched2.add(Request(3, 0.0, 100, 62), 0.0)   # 161 tokens need 11 blocks


def test_lazy_progress_matches_iterations():
    sched, kv = make(block_size=4, max_num_seqs=4)
    req = Request(0, 0.0, 6, 10)
    sched.add(req, 0.0)
    run_iteration(sched, 0.0)
    assert sched.num_generated(req) == 1 and sched.num_cached(req) == 6
    for t in range(1, 5):
        run_iteration(sched, float(t))
        assert sched.num_generated(req) == 1 + t
        assert sched.num_cached(req) == 6 + t
        assert kv.num_held(0) == math.ceil((6 + t) / 4)
    for t in range(5, 10):
        _, _, finished = run_iteration(sched, float(t))
    assert finished == [req] and req.num_generated == 10 and kv.num_free == kv.num_blocks


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_every_scheduler_field_is_a_slot(mode):
    """Fields live in ``Scheduler.__slots__`` (an instance dict past 30 keys makes every access
    a hashed lookup): a run with preemptions, swaps and a prefix cache leaves the instance
    ``__dict__``, kept for attributes users add, empty."""
    from simsched import SimConfig
    from simsched.api import simulate_checked

    cfg = SimConfig().replace(num_blocks=40, max_num_seqs=8, max_num_batched_tokens=256,
                              rate=40.0, num_requests=80, cost_model="linear", policy="spf",
                              preemption=True, preemption_mode=mode,
                              **{"cache.enable_prefix_caching": mode == "recompute"})
    _, engine = simulate_checked(cfg)
    sched = engine.scheduler
    assert sched.step > 0 and sum(r.num_preemptions for r in engine.requests) > 0
    assert vars(sched) == {}
