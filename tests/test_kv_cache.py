"""The paged KV block manager: exact block counts, no leaks, never negative."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simsched.engine.kv.cache import KVCacheError, KVCacheManager


def test_blocks_are_ceil_of_tokens():
    kv = KVCacheManager(num_blocks=10, block_size=16)
    assert kv.allocate(1, 1) == 1
    assert kv.allocate(1, 16) == 0          # still fits in the first block
    assert kv.allocate(1, 17) == 1          # the 17th token opens a second block
    assert kv.num_held(1) == 2 and kv.num_free == 8 and kv.num_used == 2
    assert kv.free(1) == 2 and kv.num_free == 10


def test_allocation_beyond_capacity_fails_without_side_effects():
    kv = KVCacheManager(num_blocks=3, block_size=4)
    kv.allocate(1, 8)
    with pytest.raises(KVCacheError):
        kv.allocate(2, 5)                   # needs 2 blocks, 1 free
    assert kv.num_free == 1 and kv.num_held(2) == 0


def test_watermark_is_kept_back_from_admission_only():
    kv = KVCacheManager(num_blocks=100, block_size=16, watermark=0.05)
    assert kv.watermark_blocks == 5
    assert kv.can_allocate(95, use_watermark=True)
    assert not kv.can_allocate(96, use_watermark=True)
    assert kv.can_allocate(100)


@settings(max_examples=200, deadline=None)
@given(block_size=st.integers(1, 32), num_blocks=st.integers(1, 64),
       ops=st.lists(st.tuples(st.sampled_from(["alloc", "append", "free"]), st.integers(0, 5),
                              st.integers(1, 300)), max_size=60))
def test_random_operations_keep_exact_counts(block_size, num_blocks, ops):
    kv = KVCacheManager(num_blocks, block_size)
    tokens: dict[int, int] = {}
    for op, rid, n in ops:
        if op == "free":
            kv.free(rid)
            tokens.pop(rid, None)
            continue
        want = n if op == "alloc" else tokens.get(rid, 0) + 1
        want = max(want, tokens.get(rid, 0))
        need = math.ceil(want / block_size) - math.ceil(tokens.get(rid, 0) / block_size)
        if need > kv.num_free:
            with pytest.raises(KVCacheError):
                kv.allocate(rid, want)
        else:
            kv.allocate(rid, want)
            tokens[rid] = want
        assert kv.num_free >= 0
        for r, t in tokens.items():
            assert kv.num_held(r) == math.ceil(t / block_size)
        assert kv.num_free + sum(kv.holders().values()) == num_blocks
    for rid in list(tokens):
        kv.free(rid)
    assert kv.num_free == num_blocks and not kv.holders()


def test_group_growth_counts_each_member_exactly():
    """A group grows in one call; every member's count catches up when read, freed or moved."""
    kv = KVCacheManager(num_blocks=20, block_size=4)
    for rid in (1, 2, 3):
        kv.allocate(rid, 4)                     # one block each
    kv.join_group(1, 2)
    kv.join_group(2, 2)
    kv.join_group(3, 5)
    kv.grow_group(2, 2)
    assert kv.num_free == 15 and kv.num_held(1) == 2 and kv.num_held(2) == 2
    assert kv.num_held(3) == 1
    kv.grow_group(5, 1)
    kv.grow_group(2, 2)
    assert kv.holders() == {1: 3, 2: 3, 3: 2} and kv.num_free == 12
    kv.leave_group(2)                           # counted now; later growth passes it by
    kv.grow_group(2, 1)
    assert kv.num_held(2) == 3 and kv.num_held(1) == 4
    kv.join_group(2, 3)                         # a member joins with what it holds
    kv.grow_group(3, 1)
    assert kv.num_held(2) == 4
    assert kv.free(1) == 4 and kv.free(2) == 4 and kv.free(3) == 2
    assert kv.num_free == 20 and not kv.holders()
    kv.allocate(4, 4 * 18)                      # 18 of the 20 blocks
    kv.join_group(4, 0)
    assert not kv.grow_group(0, 3) and kv.num_free == 2     # refused: nothing granted
    assert kv.grow_group(0, 2) and kv.num_held(4) == 19 and kv.num_free == 0


def test_hold_gives_a_request_without_blocks_its_first_chunk():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    kv.hold(7, 3)
    assert kv.num_held(7) == 3 and kv.num_free == 7
    with pytest.raises(KVCacheError, match="needs 8 blocks, 7 free"):
        kv.hold(8, 8)
    assert kv.num_free == 7 and kv.num_held(8) == 0      # nothing taken
    assert kv.allocate(7, 13) == 1 and kv.num_held(7) == 4  # grows like any holding
    assert kv.free(7) == 4 and kv.num_free == 10
