"""The prefix cache: hit accounting, reference counts, LRU eviction, preemption and sessions."""

from __future__ import annotations

import pytest

from simsched.api import simulate_checked
from simsched.config import CacheConfig, HardwareConfig, SchedulerConfig, SimConfig
from simsched.engine.invariants import check_final_state
from simsched.engine.result_checks import check_results
from simsched.engine.kv.cache import KVCacheError
from simsched.engine.kv.prefix_cache import PrefixCache
from simsched.engine.scheduler.core import Scheduler
from simsched.request import Content, Request

B = 16


def req(rid: int, segments, output: int = 5) -> Request:
    """A request whose prompt is ``segments`` [(content id, tokens), ...]."""
    content = Content.from_segments(segments, (0, rid))
    return Request(rid, 0.0, content.num_tokens, output, content=content)


def admit(kv: PrefixCache, r: Request, num_tokens: int | None = None) -> int:
    """Admit ``r`` as the scheduler does: take its hit, allocate the rest; return cached tokens."""
    cached, hit, _ = kv.match(r)
    kv.acquire(r, hit)
    kv.allocate(r.id, num_tokens if num_tokens is not None else r.num_prompt_tokens)
    return cached


def cfg(num_blocks=64, block_size=B, **changes) -> SimConfig:
    # The classic preset: these tests are of the segments prefix cache (PrefixCache) under
    # simsched's rules before issue 40 (test_vllm_rules.py has vLLM's, the defaults now).
    base = SimConfig.preset(
        "classic", check_invariants=True,
        cache=CacheConfig(block_size=block_size, num_blocks=num_blocks,
                          enable_prefix_caching=True),
        hardware=HardwareConfig(cost_model="unit"))
    return base.replace(**changes) if changes else base


# ----------------------------------------------------------------------- the cache alone
def test_two_requests_sharing_k_blocks_hit_exactly_k_blocks():
    kv = PrefixCache(100, B)
    a = req(0, [(1, 3 * B + 5), (10, 40)])     # 3 full blocks of the shared prefix, then its own
    b = req(1, [(1, 3 * B + 5), (11, 40)])
    assert admit(kv, a) == 0
    assert kv.match(b) == (3 * B, 3, 0)          # the block straddling into a's own part differs
    assert admit(kv, b) == 3 * B
    # 4 + 6 blocks held, 3 of them shared: 7 distinct in use
    assert kv.num_held(0) == 6 and kv.num_held(1) == 6 and kv.num_used == 9


def test_a_fully_cached_prompt_computes_exactly_one_token():
    kv = PrefixCache(100, B)
    a, b = req(0, [(7, 4 * B)]), req(1, [(7, 4 * B)])
    admit(kv, a)
    assert kv.match(b)[0] == 4 * B - 1            # every block cached: all tokens but one
    c = req(2, [(7, 4 * B + 3)])                  # same blocks plus 3 tokens: those 3 computed
    assert kv.match(c)[0] == 4 * B
    tiny = PrefixCache(20, 1)                     # one-token blocks: the last one is computed
    admit(tiny, req(3, [(7, 5)]))
    assert tiny.match(req(4, [(7, 5)])) == (4, 4, 0)


def test_one_computed_token_in_a_run():
    config = cfg(max_num_batched_tokens=256)
    rows = [{"arrival_at": t, "num_prompt_tokens": 64, "num_output_tokens": 3, "hash_ids": [5]}
            for t in (0.0, 50.0)]
    res, _ = simulate_checked(config, rows)
    assert res.requests["num_cached_tokens"].tolist() == [0, 63]
    it = res.iterations
    second = it[it["started_at"] >= 50.0]
    assert second["num_prefill_tokens"].iloc[0] == 1
    assert second["num_cached_tokens"].iloc[0] == 63


def test_a_shared_block_is_freed_only_when_its_last_reference_drops():
    kv = PrefixCache(20, B)
    a, b = req(0, [(1, 2 * B)]), req(1, [(1, 2 * B)])
    admit(kv, a)
    admit(kv, b)                                  # b references a's first block, recomputes one
    assert kv.num_used == 2 and kv.num_evictable == 0
    kv.free(0, 2 * B)
    assert kv.num_used == 2 and kv.num_evictable == 0 and kv.num_free == 18
    kv.free(1, 2 * B)
    assert kv.num_used == 0 and kv.num_evictable == 2 and kv.num_free == 20


def test_lru_evicts_the_least_recently_released_tail_first():
    kv = PrefixCache(6, B)
    rs = [req(i, [(100 + i, 2 * B)], output=1) for i in range(3)]
    for r in rs:
        admit(kv, r)
    for r in rs:                                  # released in order 0, 1, 2
        kv.free(r.id, 2 * B)
    assert kv.num_evictable == 6 and kv.num_free == 6
    kv.allocate(99, 1 * B)                        # one block: request 0's tail goes first
    probe = [req(10 + i, [(100 + i, 2 * B), (5, 1)]) for i in range(3)]
    assert [kv.match(p)[1] for p in probe] == [1, 2, 2] and kv.num_evicted_blocks == 1
    kv.allocate(99, 3 * B)                        # then its head, then request 1's tail
    assert [kv.match(p)[1] for p in probe] == [0, 1, 2] and kv.num_evicted_blocks == 3
    kv.free(99, 0)
    # hitting request 2's blocks makes them the most recently used: 1's go first now
    admit(kv, probe[2], 2 * B + 1)
    kv.free(probe[2].id, 2 * B + 1)
    kv.allocate(98, 4 * B)                        # 3 empty blocks, then 1 eviction
    assert [kv.match(p)[1] for p in probe] == [0, 0, 2]
    kv.allocate(98, 5 * B)
    assert [kv.match(p)[1] for p in probe] == [0, 0, 1]


def test_eviction_never_takes_a_referenced_block():
    kv = PrefixCache(4, B)
    a = req(0, [(1, 4 * B)])
    admit(kv, a)
    with pytest.raises(KVCacheError):
        kv.allocate(1, 1)
    kv.free(0, 4 * B)
    kv.allocate(1, 4 * B)                          # now all four cached blocks may go
    assert kv.num_evicted_blocks == 4 and kv.match(req(2, [(1, 4 * B)]))[1] == 0


def test_preempted_requests_blocks_are_reusable_until_evicted():
    kv = PrefixCache(10, B)
    a = req(0, [(1, 5 * B)], output=40)
    admit(kv, a)
    kv.free(0, 5 * B + 7)                          # preempted after 7 decoded tokens (lazy blocks)
    a.prefill_target = 5 * B + 7                   # re-prefill the prompt and the 7 tokens
    assert kv.match(a)[0] == 5 * B                 # the prompt's blocks are still cached
    kv.allocate(1, 6 * B)                          # memory needed elsewhere: 1 cached evicted
    assert kv.match(a)[0] == 4 * B
    kv.allocate(1, 10 * B)
    assert kv.match(a)[0] == 0


def test_lazy_decode_blocks_are_registered_when_the_request_stops():
    kv = PrefixCache(20, B)
    a = req(0, [(1, 2 * B)], output=30)
    admit(kv, a)
    for _ in range(2):
        kv.add_block(0)                            # decoding: blocks are not registered yet
    nxt = Content.from_segments([(2, 10)], (0, 1), parent=a.content, num_parent_output=30)
    b = Request(1, 0.0, nxt.num_tokens, 5, content=nxt)
    assert kv.match(b)[0] == 2 * B
    kv.free(0, 2 * B + 29)                         # finished: 61 tokens of KV, 3 full blocks
    assert kv.match(b)[0] == 3 * B


def test_group_growth_registers_the_same_blocks_and_never_evicts():
    """Blocks a decoder's group was granted count when it stops, as one-by-one blocks do; a
    group is refused where its blocks would have to come from evicting cached ones."""
    kv = PrefixCache(20, B)
    a = req(0, [(1, 2 * B)], output=30)
    admit(kv, a)
    kv.join_group(0, 3)
    assert kv.grow_group(3, 1) and kv.grow_group(3, 1)   # decoding: two blocks, unregistered
    assert kv.num_held(0) == 4 and kv.num_free == 16
    nxt = Content.from_segments([(2, 10)], (0, 1), parent=a.content, num_parent_output=30)
    b = Request(1, 0.0, nxt.num_tokens, 5, content=nxt)
    assert kv.match(b)[0] == 2 * B
    kv.free(0, 2 * B + 29)                         # finished: 61 tokens of KV, 3 full blocks
    assert kv.match(b)[0] == 3 * B and kv.num_evictable == 3 and kv.num_free == 20
    c = req(2, [(7, 17 * B)])
    admit(kv, c)                                    # 17 blocks: 3 free ones are cached
    kv.join_group(2, 0)
    assert not kv.grow_group(0, 1) and kv.num_evictable == 3   # would evict: refused
    kv.add_block(2)                                 # one by one, the cached tail goes
    assert kv.num_evictable == 2 and kv.num_held(2) == 18


def test_a_chunk_planned_but_never_computed_is_not_left_cached():
    kv = PrefixCache(20, B)
    a = req(0, [(1, 6 * B)])
    cached, hit, _ = kv.match(a)
    kv.acquire(a, hit)
    kv.allocate(0, 4 * B)                          # chunk of 4 blocks scheduled ...
    kv.free(0, 2 * B)                              # ... but preempted with 2 computed
    assert kv.match(req(1, [(1, 6 * B)]))[0] == 2 * B
    assert kv.num_free == 20 and kv.num_evictable == 2


def test_a_duplicate_computed_concurrently_is_dropped_for_the_cached_copy():
    kv = PrefixCache(20, B)
    a, b = req(0, [(1, 4 * B)]), req(1, [(1, 4 * B)])
    for r in (a, b):
        kv.acquire(r, 0)
        kv.allocate(r.id, 1)                       # both start before either registered much
    kv.allocate(0, 4 * B)
    kv.allocate(1, 4 * B)                          # b's 4 duplicate blocks are given back
    assert kv.num_used == 4 and kv.num_held(1) == 4 and kv.num_free == 16


def test_router_query_has_no_side_effects():
    kv = PrefixCache(20, B)
    a = req(0, [(1, 3 * B)])
    admit(kv, a)
    kv.free(0, 3 * B)
    before = (kv.num_free, kv.num_evictable, kv.nodes(), kv.lru_runs())
    probe = req(1, [(1, 3 * B), (2, 8)])
    assert kv.num_cached_prefix_tokens(probe) == 3 * B
    assert (kv.num_free, kv.num_evictable, kv.nodes(), kv.lru_runs()) == before
    assert kv.num_cached_prefix_tokens(Request(2, 0.0, 50, 5)) == 0   # no content: no hit


# ----------------------------------------------------------------------- the scheduler
def test_cached_tokens_stay_in_the_attention_context():
    kv = PrefixCache(100, B)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=512), kv)
    a, b = req(0, [(1, 96), (2, 10)], output=2), req(1, [(1, 96), (3, 20)], output=2)
    sched.add(a, 0.0)
    sched.schedule(0.0)
    sched.commit(1.0)
    sched.add(b, 1.0)
    batch = sched.schedule(1.0)
    assert batch.prefill_new_tokens == [20] and batch.prefill_cached_tokens == [96]
    assert b.num_cached_tokens == 96 and sched.num_cached_tokens == 96


def test_every_policy_runs_with_caching_on():
    from simsched.policies import QUEUE_POLICIES

    rows = [{"arrival_at": 0.05 * i, "num_prompt_tokens": 40 + 9 * (i % 5),
             "num_output_tokens": 4 + i % 7, "prefix_group": i % 3, "prefix_len": 32,
             "priority": i % 2} for i in range(30)]
    for policy in sorted(QUEUE_POLICIES):
        res, engine = simulate_checked(cfg(num_blocks=40, max_num_seqs=6,
                                           max_num_batched_tokens=64, policy=policy,
                                           preemption=True), rows)
        assert (res.requests["status"] == "finished").all(), policy
        assert res.summary()["prefix_hit_rate"] > 0, policy


def test_results_are_identical_with_caching_off_whatever_the_identity_columns():
    rows = [{"arrival_at": 0.1 * i, "num_prompt_tokens": 30 + i, "num_output_tokens": 6,
             "prefix_group": i % 2, "prefix_len": 24, "hash_ids": None} for i in range(25)]
    plain = [{k: v for k, v in r.items() if k.startswith(("arrival", "num_"))} for r in rows]
    config = cfg(num_blocks=30, max_num_seqs=4).replace(**{"cache.enable_prefix_caching": False})
    with_ids, _ = simulate_checked(config, rows)
    without, _ = simulate_checked(config, plain)
    assert with_ids.requests[without.requests.columns].equals(without.requests)
    assert (with_ids.requests["num_cached_tokens"] == 0).all()
    assert with_ids.iterations.equals(without.iterations)
    assert "kv_blocks_cached" not in without.iterations           # no prefix-cache columns
    assert "num_cached_tokens" not in without.requests


def test_preempted_request_hits_its_own_blocks_on_readmission():
    # Two 10-block prompts in 22 blocks: decoding runs out, one is preempted; the other's growth
    # evicts only the victim's tail, so its re-admission reuses the rest of its blocks.
    rows = [{"arrival_at": 0.0, "num_prompt_tokens": 160, "num_output_tokens": 40,
             "prefix_group": i, "prefix_len": 160} for i in range(2)]
    res, engine = simulate_checked(cfg(num_blocks=22, max_num_batched_tokens=512), rows)
    assert res.summary()["num_preemptions"] == 1
    lost = int(res.preemptions["num_lost_tokens"].iloc[0])
    it = res.iterations
    readmission = int((it["num_cached_tokens"] > 0).to_numpy().argmax())
    hits = int(it["num_cached_tokens"].iloc[readmission])
    evicted = int(it["num_evicted_blocks"].iloc[:readmission].sum())
    assert evicted > 0 and hits == (lost // B - evicted) * B > 0   # all but the evicted tail
    assert hits == int(it["num_cached_tokens"].sum())
    assert res.requests["num_cached_tokens"].sum() == 0     # first admissions had nothing
    check_final_state(engine)
    check_results(res)
