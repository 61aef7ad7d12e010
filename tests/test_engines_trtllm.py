"""TensorRT-LLM's capacity and micro-batch schedulers (simsched.engine.engines.trtllm), by hand."""

import pytest

from simsched.config import SchedulerConfig
from simsched.engine.engines.trtllm import TRTLLMScheduler
from simsched.engine.kv.cache import KVCacheManager
from simsched.engine.kv.prefix_cache import PrefixCache
from simsched.request import Content, Request, Status


def sched_of(num_blocks, policy="GUARANTEED_NO_EVICT", block_size=4, reuse=False, **fields):
    fields.setdefault("max_num_batched_tokens", 8192)
    fields.setdefault("max_num_seqs", 64)
    fields.setdefault("enable_chunked_prefill", False)
    cfg = SchedulerConfig(engine="trtllm",
                          engine_options={"capacity_scheduler_policy": policy}, **fields)
    kv = PrefixCache(num_blocks, block_size, hit_rule="block") if reuse \
        else KVCacheManager(num_blocks, block_size)
    return TRTLLMScheduler(cfg, kv)


def req(i, prompt, output, segments=None):
    content = Content.from_segments(segments, ("out", i)) if segments else None
    return Request(i, 0.0, prompt, output, content=content)


def step(sched, now):
    batch = sched.schedule(now)
    grants = {rid: chunk for rid, (_, chunk) in sched.planned.items()}
    paused = [r.id for r, _ in sched.preempted]
    _, finished = sched.commit(now + 0.01)
    return grants, batch.num_decode_seqs, paused, [r.id for r in finished]


def run(sched, steps):
    out = []
    for k in range(steps):
        out.append(step(sched, 0.01 * k))
        if not sched.has_work():
            break
    return out


def test_guaranteed_no_evict_refuses_what_max_utilization_admits_and_later_pauses():
    # 20 blocks of 4 tokens; each request wants 8 + 32 tokens = 10 blocks to finish.
    def first_steps(policy):
        sched = sched_of(20, policy)
        for i in range(3):
            sched.add(req(i, 8, 32), 0.0)
        return sched, run(sched, 60)
    gne, steps = first_steps("GUARANTEED_NO_EVICT")
    assert steps[0][0] == {0: 8, 1: 8}              # the third's 10 blocks are not free
    assert all(not paused for _, _, paused, _ in steps)
    assert gne.num_paused == 0
    mu, steps = first_steps("MAX_UTILIZATION")
    assert steps[0][0] == {0: 8, 1: 8, 2: 8}        # this step's blocks fit: all three
    paused = [p for _, _, ps, _ in steps for p in ps]
    assert paused and paused[0] == 2                 # the last started request goes first
    assert mu.num_paused >= 1


def test_a_paused_request_keeps_its_place_in_the_active_list():
    sched = sched_of(20, "MAX_UTILIZATION")
    for i in range(3):
        sched.add(req(i, 8, 32), 0.0)
    pause_at = None
    for k in range(200):
        grants, _, paused, _ = step(sched, 0.01 * k)
        if paused and pause_at is None:
            pause_at = k
            sched.add(req(9, 8, 4), 0.01 * k)        # a newer arrival, after the pause
        if pause_at is not None and grants:
            break
    assert pause_at is not None
    assert list(grants)[0] == 2                      # the paused one first, in arrival order
    assert [r.id for r in sched.active].index(2) < [r.id for r in sched.active].index(9)
    victim = next(r for r in sched.active if r.id == 2)
    # It re-prefilled its prompt and output so far, then emitted one more token.
    assert victim.prefill_target == 8 + victim.num_generated - 1 and victim.num_preemptions == 1


def test_guaranteed_no_evict_blocks_head_of_line():
    sched = sched_of(20)
    sched.add(req(0, 8, 32), 0.0)                    # 10 blocks
    sched.add(req(1, 40, 32), 0.0)                   # 18 blocks: does not fit next to 0
    sched.add(req(2, 4, 4), 0.0)                     # 2 blocks would fit, but waits its turn
    grants, _, _, _ = step(sched, 0.0)
    assert grants == {0: 8}


def test_micro_batch_token_budget_without_chunking_ends_at_the_first_misfit():
    sched = sched_of(1000, max_num_batched_tokens=100, max_num_seqs=64)
    sched.add(req(0, 60, 4), 0.0)
    sched.add(req(1, 50, 4), 0.0)                    # 60 + 50 > 100
    sched.add(req(2, 10, 4), 0.0)                    # would fit, but the scan ended
    grants, _, _, _ = step(sched, 0.0)
    assert grants == {0: 60}
    grants, decoders, _, _ = step(sched, 0.01)       # context and generation together
    assert grants == {1: 50, 2: 10} and decoders == 1


def test_unchunked_prompt_over_max_num_tokens_is_rejected():
    sched = sched_of(1000, max_num_batched_tokens=100)
    long = req(0, 101, 4)
    assert not sched.add(long, 0.0) and "max_num_tokens" in long.reject_reason


def test_chunked_context_is_cut_first_come_first_served_to_whole_blocks():
    sched = sched_of(1000, max_num_batched_tokens=64, enable_chunked_prefill=True)
    sched.add(req(0, 50, 4), 0.0)
    sched.add(req(1, 50, 4), 0.0)
    grants, _, _, _ = step(sched, 0.0)
    assert grants == {0: 50, 1: 12}                  # 64 tokens: 0 whole, 1 cut to 3 blocks
    grants, decoders, _, _ = step(sched, 0.01)
    assert grants == {1: 38} and decoders == 1       # 0 generates beside 1's last chunk


def test_block_reuse_hits_whole_blocks_and_skips_a_context_another_computes():
    sched = sched_of(1000, reuse=True, max_num_seqs=8)
    sched.add(req(0, 30, 1, [("doc", 30)]), 0.0)
    run(sched, 5)                                    # finished: its blocks stay cached
    sched.add(req(1, 40, 1, [("doc", 30), ("a", 10)]), 0.0)
    grants, _, _, _ = step(sched, 1.0)
    assert grants == {1: 12}                         # 28 of 30 shared tokens: 7 whole blocks
    # Two new requests sharing a new prefix: the second waits to reuse the first's blocks.
    sched.add(req(2, 40, 1, [("new", 36), ("x", 4)]), 0.0)
    sched.add(req(3, 40, 1, [("new", 36), ("y", 4)]), 0.0)
    grants, _, _, _ = step(sched, 1.01)
    assert 2 in grants and 3 not in grants
    for k in range(5):
        grants, _, _, _ = step(sched, 1.02 + 0.01 * k)
        if 3 in grants:
            break
    assert grants.get(3) == 4                        # 36 shared tokens reused: 9 blocks


@pytest.mark.parametrize("policy", ["GUARANTEED_NO_EVICT", "MAX_UTILIZATION"])
def test_every_request_finishes_and_the_pool_is_all_free(policy):
    sched = sched_of(30, policy)
    reqs = [req(i, 4 + 3 * i, 10 + 7 * i) for i in range(8)]
    for r in reqs:
        assert sched.add(r, 0.0)
    run(sched, 2_000)
    assert all(r.status is Status.FINISHED and r.num_generated == r.num_output_tokens
               for r in reqs)
    assert sched.kv.num_free == 30 and not sched.kv.holders()
