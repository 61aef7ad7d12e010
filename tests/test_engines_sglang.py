"""SGLang's scheduler (simsched.engine.engines): its distinguishing decisions, by hand."""

import math

import pytest

from simsched.config import SchedulerConfig
from simsched.cost.base import UnitCostModel
from simsched.engine.engines.radix_cache import RadixCache
from simsched.engine.engines.sglang import SGLangScheduler
from simsched.engine.kv.prefix_cache import PrefixCache
from simsched.request import Content, Request, Status


def sched_of(num_tokens, policy="fcfs", disable=False, options=None, **fields):
    fields.setdefault("max_num_batched_tokens", 8192)
    fields.setdefault("max_num_seqs", 64)
    cfg = SchedulerConfig(engine="sglang", engine_options={"schedule_policy": policy,
                                                           **(options or {})}, **fields)
    return SGLangScheduler(cfg, RadixCache(num_tokens, disable=disable))


def req(i, prompt, output, segments=None, at=0.0):
    content = Content.from_segments(segments, ("out", i)) if segments else None
    return Request(i, at, prompt, output, content=content)


def step(sched, now):
    """One schedule/commit pair; returns (prefill grants {id: tokens}, decoders, finished ids)."""
    batch = sched.schedule(now)
    grants = {rid: chunk for rid, (_, chunk) in sched.planned.items()}
    decoders = batch.num_decode_seqs
    _, finished = sched.commit(now + 0.01)
    return grants, decoders, [r.id for r in finished]


def drain(sched, now=0.0, limit=10_000):
    for _ in range(limit):
        if not sched.has_work():
            return now
        step(sched, now)
        now += 0.01
    raise AssertionError("did not drain")


def test_prefill_and_decode_run_in_separate_batches():
    sched = sched_of(10_000)
    sched.add(req(0, 100, 5), 0.0)
    grants, decoders, _ = step(sched, 0.0)
    assert grants == {0: 100} and decoders == 0
    sched.add(req(1, 50, 5), 0.0)
    grants, decoders, _ = step(sched, 0.01)         # a prefill step: request 0 does not decode
    assert grants == {1: 50} and decoders == 0
    grants, decoders, _ = step(sched, 0.02)
    assert grants == {} and decoders == 2


def test_mixed_chunk_decodes_the_running_requests_in_the_prefill_batch():
    sched = sched_of(10_000, options={"enable_mixed_chunk": True})
    sched.add(req(0, 100, 5), 0.0)
    grants, decoders, _ = step(sched, 0.0)
    assert grants == {0: 100} and decoders == 0     # nothing running yet: a plain prefill
    sched.add(req(1, 50, 5), 0.0)
    grants, decoders, _ = step(sched, 0.01)         # mixed: request 0 decodes alongside
    assert grants == {1: 50} and decoders == 1
    assert sched.num_generated(sched.running[0]) == 2      # its first token and this step's
    grants, decoders, _ = step(sched, 0.02)
    assert grants == {} and decoders == 2
    assert sched.new_token_ratio < sched.init_new_token_ratio    # decays on decode steps only


def test_mixed_chunk_takes_the_decode_tokens_from_the_prefill_budget():
    # max_prefill_tokens 60 less 5 running decodes leaves 55: a 50-token prompt, then an
    # 8-token one only without mixing; a 40-token chunk becomes 35 (chunk None: unchunked).
    def admitted(mixed, chunk):
        sched = sched_of(10_000, options={"enable_mixed_chunk": mixed, "max_prefill_tokens": 60},
                         max_num_batched_tokens=chunk or 8192, max_num_seqs=16,
                         enable_chunked_prefill=chunk is not None)
        for i in range(5):
            sched.add(req(i, 2, 50), 0.0)
        step(sched, 0.0)
        sched.add(req(5, 50, 5), 0.0)
        sched.add(req(6, 8, 5), 0.0)
        return step(sched, 0.01)[:2]

    assert admitted(False, 8192) == ({5: 50, 6: 8}, 0)
    assert admitted(True, 8192) == ({5: 50}, 5)
    assert admitted(False, 40) == ({5: 40}, 0)
    assert admitted(True, 40) == ({5: 35}, 5)
    # SGLang mixes only with chunked prefill on (Scheduler.is_mixed_chunk).
    assert admitted(True, None) == ({5: 50, 6: 8}, 0)


def test_mixed_chunk_keeps_decodes_going_under_a_stream_of_prefills():
    # Requests keep arriving: without mixing the running ones stall behind every prefill.
    def max_gap(mixed):
        sched = sched_of(100_000, options={"enable_mixed_chunk": mixed, "max_prefill_tokens": 100},
                         max_num_batched_tokens=100)
        sched.add(req(0, 10, 20), 0.0)
        gaps, last, now = [], None, 0.0
        for i in range(1, 15):
            sched.add(req(i, 100, 200), now)
            before = sched.num_generated(sched.running[0]) if 0 in sched.running else None
            step(sched, now)
            after = sched.num_generated(sched.running[0]) if 0 in sched.running else None
            if before is not None and after is not None:
                gaps.append(after - before)
            now += 0.01
        return gaps

    assert max_gap(True) and all(g == 1 for g in max_gap(True))
    assert all(g == 0 for g in max_gap(False)[1:])


def test_mixed_chunk_option_is_checked():
    with pytest.raises(ValueError, match="enable_mixed_chunk must be true or false"):
        SchedulerConfig(engine="sglang", engine_options={"enable_mixed_chunk": 1})


def test_lpm_orders_the_queue_by_longest_cached_prefix_fcfs_by_arrival():
    def first_admitted(policy):
        sched = sched_of(10_000, policy, max_num_seqs=2)
        sched.add(req(0, 500, 2, [("doc", 500)]), 0.0)
        drain(sched)                                 # its tokens are in the radix tree now
        sched.add(req(1, 300, 2, [("other", 300)]), 1.0)         # arrives first, no hit
        sched.add(req(2, 520, 2, [("doc", 500), ("q", 20)]), 1.0)  # shares 500 tokens
        sched.add(req(3, 300, 2, [("third", 300)]), 1.0)
        grants, _, _ = step(sched, 1.0)
        return grants, sched
    grants, sched = first_admitted("fcfs")
    assert list(grants) == [1, 2]                    # arrival order, two slots
    grants, sched = first_admitted("lpm")
    assert list(grants) == [2, 1]                    # the 500-token match first
    assert grants[2] == 20                           # token-granular: only the new tokens
    assert sched.num_cached_tokens == 500


def test_lpm_falls_back_to_fcfs_on_a_long_queue():
    sched = sched_of(100_000, "lpm", max_num_seqs=1)
    sched.add(req(0, 500, 2, [("doc", 500)]), 0.0)
    drain(sched)
    for i in range(1, 130):
        sched.add(req(i, 40, 2, [(("x", i), 40)]), 1.0)
    sched.add(req(200, 510, 2, [("doc", 500), ("q", 10)]), 1.0)
    grants, _, _ = step(sched, 1.0)
    assert list(grants) == [1]                       # 130 waiting > 128: fcfs


def test_in_batch_prefix_check_puts_off_a_second_request_of_a_new_shared_prefix():
    sched = sched_of(100_000, "lpm", max_num_seqs=2)
    sched.add(req(0, 400, 2, [("new", 300), ("a", 100)]), 0.0)
    sched.add(req(1, 400, 2, [("new", 300), ("b", 100)]), 0.0)   # shares 300 with 0
    sched.add(req(2, 200, 2, [("solo", 200)]), 0.0)
    grants, _, _ = step(sched, 0.0)
    assert list(grants) == [0, 2]                    # 1 waits to hit what 0 computes
    step(sched, 0.01)
    for _ in range(3):
        grants, _, _ = step(sched, 0.02)
        if grants:
            break
    assert grants == {1: 100}                        # its 300 shared tokens are a hit


def test_token_granular_hits_where_vllm_rounds_down_to_blocks():
    radix = RadixCache(10_000)
    prefix = PrefixCache(10_000, block_size=16, hit_rule="block")
    old = req(0, 100, 1, [("sys", 100)])
    new = req(1, 130, 1, [("sys", 100), ("user", 30)])
    radix.insert(radix.stream(old, 100))
    assert radix.match(new)[0] == 100
    prefix.acquire(old, 0, 100)
    prefix.free(old.id, 100)
    assert prefix.match(new)[0] == 96                # 6 whole blocks of 16


def test_radix_cache_evicts_unlocked_leaves_least_recently_used_first():
    tree = RadixCache(1_000)
    a, b, c = (req(i, 100, 1, [("root", 50), ((i,), 50)]) for i in range(3))
    for r in (a, b, c):
        tree.insert(tree.stream(r, 100))
    assert tree.evictable_size() == 50 + 3 * 50      # the shared 50 once
    tree.match_prefix(tree.stream(a, 100))           # a is now the most recent
    n, node = tree.match_prefix(tree.stream(c, 100))
    tree.inc_lock_ref(node)                          # c is locked: not evictable
    assert tree.evict(60) == 100                     # b's leaf (50), then a's (50)
    assert tree.peek_prefix(tree.stream(b, 100)) == 50
    assert tree.peek_prefix(tree.stream(a, 100)) == 50
    assert tree.peek_prefix(tree.stream(c, 100)) == 100
    assert tree.evict(1000) == 0                     # the rest is locked (c's path)
    tree.dec_lock_ref(node)
    assert tree.evict(1000) == 100                   # c's leaf, then the shared root piece


def test_match_splits_a_node_where_the_match_ends():
    tree = RadixCache(1_000)
    long = req(0, 100, 1, [("s", 100)])
    tree.insert(tree.stream(long, 100))
    short = req(1, 40, 1, [("s", 100)])
    n, node = tree.match_prefix(tree.stream(short, 39))
    assert n == 39 and len(node) == 39 and len(next(iter(node.children.values()))) == 61


def test_retraction_takes_the_fewest_generated_longest_prompt_and_requeues_it():
    sched = sched_of(2_000)
    now, retracted, before = 0.0, None, None
    for k in range(5_000):
        if k % 40 == 0 and k < 2_000:       # staggered arrivals and lengths
            i = k // 40
            sched.add(req(i, 100 + 10 * (i % 7), 200 + 137 * i % 500, at=now), now)
        snapshot = [(r.id, sched.num_generated(r), r.num_prompt_tokens)
                    for r in sched.decoding.values()]
        ratio = sched.new_token_ratio
        grants, decoders, _ = step(sched, now)
        now += 0.01
        if sched.preempted:
            retracted, before = [r.id for r, _ in sched.preempted], snapshot
            break
        if decoders:                    # a decode step without retraction decays the ratio
            assert sched.new_token_ratio == pytest.approx(
                max(ratio - sched.new_token_ratio_decay, sched.min_new_token_ratio))
    assert retracted, "the ratio decays until admissions outrun memory"
    # retract_decode: sorted by (generated, -prompt) descending, popped from the end.
    order = sorted(before, key=lambda t: (t[1], -t[2]), reverse=True)
    assert retracted == [t[0] for t in order[::-1][:len(retracted)]]
    victim = next(r for r in sched.waiting_queue if r.id == retracted[0])
    assert sched.waiting_queue[-len(retracted):] == [r for r in sched.waiting_queue
                                                    if r.id in retracted]
    assert victim.status is Status.WAITING
    assert victim.prefill_target == victim.num_prompt_tokens + victim.num_generated
    kept = list(sched.decoding.values())
    # As retract_decode saw them, before the step they then decoded.
    decoded = sum(sched.num_generated(r) for r in kept) - len(kept)
    max_new = sum(r.num_output_tokens for r in kept)
    assert sched.new_token_ratio == pytest.approx(min(1.0, (decoded + 20 * len(kept))
                                                      / (max_new + 1)))
    # Its prompt stayed in the tree (only decoded tokens were freed), unless evicted since.
    assert sched.kv.peek_prefix(sched.kv.stream(victim, victim.num_prompt_tokens)) in (
        0, victim.num_prompt_tokens)
    drain(sched, now)
    assert victim.status is Status.FINISHED and victim.num_preemptions >= 1
    assert sched.kv.num_free == 2_000 and not sched.kv.holders()


def test_no_token_marks_the_batch_full_until_a_request_leaves():
    sched = sched_of(400)
    sched.add(req(0, 100, 150), 0.0)
    step(sched, 0.0)
    # 400 free - 100 held - 149 x 0.7 predicted < 100 + 150 asked: NO_TOKEN.
    sched.add(req(1, 100, 150), 0.0)
    grants, decoders, _ = step(sched, 0.01)
    assert grants == {} and decoders == 1 and sched.batch_is_full
    now = 0.02
    while sched.decoding:
        grants, _, _ = step(sched, now)
        assert not grants                            # full: no prefill is even tried
        now += 0.01
    grants, decoders, _ = step(sched, now)           # filtering the finished one clears it
    assert grants == {} and decoders == 0 and not sched.batch_is_full
    grants, _, _ = step(sched, now + 0.01)
    assert grants == {1: 100}


def test_chunked_prefill_continues_the_chunked_request_first():
    sched = sched_of(10_000, max_num_batched_tokens=256)
    sched.add(req(0, 600, 3), 0.0)
    sched.add(req(1, 100, 3), 0.0)
    seen = [step(sched, 0.01 * k)[0] for k in range(4)]
    assert seen[0] == {0: 256} and seen[1] == {0: 256}
    assert seen[2] == {0: 88, 1: 100}                # the rest of 0, then 1 in the same budget


def test_radix_disabled_never_hits_and_lpm_is_fcfs():
    sched = sched_of(10_000, "lpm", disable=True, max_num_seqs=1)
    sched.add(req(0, 500, 2, [("doc", 500)]), 0.0)
    drain(sched)
    sched.add(req(1, 300, 2, [("o", 300)]), 1.0)
    sched.add(req(2, 520, 2, [("doc", 500), ("q", 20)]), 1.0)
    grants, _, _ = step(sched, 1.0)
    assert grants == {1: 300} and sched.num_cached_tokens == 0


def test_too_long_requests_are_rejected_with_a_reason():
    sched = sched_of(1_000)
    big = req(0, 900, 100)
    assert not sched.add(big, 0.0) and big.status is Status.REJECTED and big.reject_reason
    ok = req(1, 800, 100)
    assert sched.add(ok, 0.0)
    drain(sched)
    assert ok.status is Status.FINISHED and not math.isnan(ok.finished_at)
    assert sched.kv.num_free == 1_000 and not sched.kv.holders()
