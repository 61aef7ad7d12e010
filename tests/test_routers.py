"""Routers on hand-built replica states, the load views they read, and admission's token bucket."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simsched.cluster.routers import ROUTERS, _cached_tokens, check_router, make_router
from simsched.cluster.state import MinIndex, ReplicaLoad, Snapshot, TokenBucket
from simsched.engine.kv.cache import KVCacheManager
from simsched.engine.kv.prefix_cache import PrefixCache
from simsched.request import Content, Request


class FakeKV:
    """A prefix cache that reports a fixed number of cached tokens for every request."""

    def __init__(self, cached: int) -> None:
        self.cached = cached

    def num_cached_prefix_tokens(self, block_hashes) -> int:
        return self.cached


class FakeReplica:
    def __init__(self, cached: int = 0) -> None:
        self.kv = FakeKV(cached)


class FakeView:
    """Replica state set by hand: outstanding requests, tokens, KV use and cached prefixes."""

    def __init__(self, outstanding, tokens=None, kv_use=None, cached=None) -> None:
        n = len(outstanding)
        self.num_replicas = n
        self.outstanding = list(outstanding)
        self.tokens = list(tokens if tokens is not None else [0] * n)
        self.kv_use = list(kv_use if kv_use is not None else [0.0] * n)
        self.total_outstanding = sum(self.outstanding)
        self.replicas = [FakeReplica(c) for c in (cached or [0] * n)]

    def least(self, metric: str) -> int:
        values = getattr(self, metric)
        return min(range(self.num_replicas), key=values.__getitem__)


def request(prompt: int = 100, output: int = 10, hashes=None, session=None) -> Request:
    """A request; ``hashes`` give it prompt segments of 16 tokens each, ``session`` a session."""
    content = None
    if hashes is not None:
        content = Content.from_segments([(h, 16) for h in hashes], ("out", 0),
                                        -1 if session is None else session)
    elif session is not None:
        content = Content(session_id=session)
    return Request(0, 0.0, prompt, output, content=content)


def router(name: str, n: int, seed: int = 0, **options):
    return make_router(name, options, n, np.random.default_rng(seed))


def test_registry_has_every_router_the_issue_names():
    assert set(ROUTERS) >= {"round_robin", "random", "jsq", "least_tokens", "least_kv",
                            "power_of_two", "prefix_affinity", "session_affinity", "weighted"}


def test_round_robin_cycles():
    r = router("round_robin", 3)
    view = FakeView([9, 0, 0])
    assert [r.choose(view, request()) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_random_is_uniform_and_seeded():
    r = router("random", 4, seed=1)
    many = [r.choose(FakeView([0] * 4), request()) for _ in range(4000)]
    again = router("random", 4, seed=1)
    assert [again.choose(FakeView([0] * 4), request()) for _ in range(4000)] == many
    counts = np.bincount(many, minlength=4)
    assert counts.min() > 900 and counts.max() < 1100


def test_jsq_picks_fewest_outstanding_lowest_index_on_ties():
    r = router("jsq", 4)
    assert r.choose(FakeView([3, 1, 2, 1]), request()) == 1
    assert r.choose(FakeView([0, 0, 0, 0]), request()) == 0


def test_least_tokens_and_least_kv_read_their_own_figure():
    view = FakeView([0, 5, 9], tokens=[900, 100, 400], kv_use=[0.5, 0.9, 0.1])
    assert router("least_tokens", 3).choose(view, request()) == 1
    assert router("least_kv", 3).choose(view, request()) == 2


def test_power_of_two_takes_the_less_loaded_of_two_distinct_samples():
    r = router("power_of_two", 2)
    # With two replicas the sample is always both: the less loaded wins every time.
    assert {r.choose(FakeView([5, 1]), request()) for _ in range(50)} == {1}
    assert {r.choose(FakeView([0, 7]), request()) for _ in range(50)} == {0}
    # With many replicas the most loaded one is never chosen (it always loses its pair).
    r = router("power_of_two", 5, seed=3)
    picks = [r.choose(FakeView([1, 1, 1, 1, 9]), request()) for _ in range(500)]
    assert 4 not in picks and len(set(picks)) == 4
    with pytest.raises(ValueError, match="metric"):
        router("power_of_two", 3, metric="vibes")


def test_power_of_two_kv_metric_never_picks_the_fullest():
    r = router("power_of_two", 3, metric="kv_use", seed=2)
    picks = {r.choose(FakeView([0, 0, 0], kv_use=[0.2, 0.1, 0.9]), request()) for _ in range(200)}
    assert 2 not in picks and picks == {0, 1}


def test_prefix_affinity_prefers_the_longest_cached_prefix():
    r = router("prefix_affinity", 3)
    view = FakeView([2, 2, 2], cached=[0, 64, 32])
    assert r.choose(view, request(hashes=(1, 2, 3, 4))) == 1
    # Without block hashes (or without any hit) it balances load.
    assert r.choose(FakeView([3, 1, 2], cached=[64, 0, 0]), request()) == 1
    assert r.choose(FakeView([3, 1, 2], cached=[0, 0, 0]), request(hashes=(1,))) == 1


def test_prefix_affinity_load_cap_stops_a_hot_prefix_swamping_a_replica():
    r = router("prefix_affinity", 3, max_load_ratio=1.5, load_slack=0)
    # Replica 0 caches the prefix but holds 10 of 12 outstanding (mean 4, cap 6): skip it.
    view = FakeView([10, 1, 1], cached=[512, 16, 0])
    assert r.choose(view, request(hashes=(1, 2))) == 1
    # Nothing under the cap has a hit: the least loaded replica.
    assert r.choose(FakeView([10, 2, 0], cached=[512, 0, 0]), request(hashes=(1,))) == 2
    # A generous cap keeps the affinity.
    loose = router("prefix_affinity", 3, max_load_ratio=4.0, load_slack=0)
    assert loose.choose(view, request(hashes=(1, 2))) == 0


def test_session_affinity_is_sticky_and_spreads_new_sessions():
    r = router("session_affinity", 3)
    assert r.choose(FakeView([2, 0, 1]), request(session=1)) == 1
    assert r.choose(FakeView([2, 5, 0]), request(session=1)) == 1      # sticky despite load
    assert r.choose(FakeView([2, 5, 0]), request(session=2)) == 2      # new session: least
    assert r.choose(FakeView([0, 5, 3]), request()) == 0                 # no session: least
    capped = router("session_affinity", 3, max_load_ratio=1.0, load_slack=0)
    assert capped.choose(FakeView([0, 1, 1]), request(session=3)) == 0
    assert capped.choose(FakeView([9, 1, 2]), request(session=3)) == 1  # home overloaded
    assert capped.choose(FakeView([0, 1, 9]), request(session=3)) == 1  # new home sticks


def test_weighted_sums_normalised_scores():
    view = FakeView([4, 0, 2], kv_use=[0.0, 0.8, 0.4], cached=[0, 0, 100])
    req = request(prompt=100, hashes=(1, 2))
    # queue scores 0, 1, 0.5; kv scores 1, 0.2, 0.6; prefix scores 0, 0, 1.
    assert router("weighted", 3, weights={"queue": 1.0}).choose(view, req) == 1
    assert router("weighted", 3, weights={"kv": 1.0}).choose(view, req) == 0
    assert router("weighted", 3, weights={"prefix": 1.0}).choose(view, req) == 2
    assert router("weighted", 3).choose(view, req) == 2          # 0+1+0, 1+0.2+0, 0.5+0.6+1
    assert router("weighted", 3, weights={"queue": 1.0, "kv": 1.0}).choose(view, req) == 1
    # All queues equal: the queue score is 1 everywhere, KV decides.
    assert router("weighted", 3, weights={"queue": 1, "kv": 1}).choose(
        FakeView([1, 1, 1], kv_use=[0.3, 0.2, 0.5]), req) == 1
    with pytest.raises(ValueError, match="unknown scorer"):
        router("weighted", 3, weights={"latency": 1.0})


def test_cached_tokens_adapter_asks_the_replicas_kv_cache():
    assert _cached_tokens(FakeReplica(48), request(hashes=(7,))) == 48
    assert _cached_tokens(FakeReplica(48), request()) == 0          # no content identity

    class Paged:
        kv = KVCacheManager(64, 16)                                 # no prefix cache: nothing

    assert _cached_tokens(Paged(), request(hashes=(7,))) == 0

    class Prefix:
        kv = PrefixCache(64, 16)

    held = request(prompt=64, hashes=(1, 2, 3, 4))
    held.id = 5
    Prefix.kv.acquire(held, 0)
    Prefix.kv.allocate(held.id, 64)
    Prefix.kv.free(held.id, 64)                                     # cached, evictable
    # The same first three segments are served from the cache (the fourth differs).
    assert _cached_tokens(Prefix(), request(prompt=64, hashes=(1, 2, 3, 9))) == 48


def test_bad_router_names_and_options_fail_naming_the_field():
    with pytest.raises(ValueError, match=r"cluster\.router must be one of"):
        check_router("closest", {})
    with pytest.raises(ValueError, match=r"cluster\.router_options .* 'least_tokens'"):
        check_router("least_tokens", {"output_tokens": -1})
    with pytest.raises(ValueError, match="max_load_ratio"):
        check_router("prefix_affinity", {"max_load_ratio": 0.5})


# ---------------------------------------------------------------------- views
@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 20), min_size=1, max_size=40),
       st.lists(st.tuples(st.integers(0, 39), st.integers(-5, 25)), max_size=60))
def test_min_index_matches_a_scan(values, updates):
    index = MinIndex(values)
    values = list(values)
    for i, v in updates:
        i %= len(values)
        values[i] = v
        index.update(i, v)
        assert index.argmin() == min(range(len(values)), key=values.__getitem__)
    # Stale entries are dropped as the heap grows: it stays within a bound of n.
    assert len(index._heap) <= 4 * len(values) + 16


def test_min_index_heap_is_rebuilt_and_stays_exact():
    """Many updates to a few values: the lazy heap is rebuilt, ties go to the lowest index."""
    index = MinIndex([5, 5, 5])
    rng = np.random.default_rng(3)
    values = [5, 5, 5]
    for _ in range(500):
        i, v = int(rng.integers(3)), int(rng.integers(0, 4))
        values[i] = v
        index.update(i, v)
        assert index.argmin() == values.index(min(values))
        assert len(index._heap) <= 4 * 3 + 16


def test_replica_load_tracks_routing_first_token_and_finish():
    load = ReplicaLoad([None, None], ordered=("outstanding", "tokens", "kv_use"))
    a, b = Request(0, 0.0, 100, 10), Request(1, 0.0, 30, 5)
    load.routed(0, a)
    load.routed(1, b)
    assert load.outstanding == [1, 1] and load.tokens == [110, 35]
    assert load.least("tokens") == 1
    load.first_token(0, a)
    assert load.tokens == [10, 35] and load.least("tokens") == 0
    load.finished(0, a)
    assert load.outstanding == [0, 1] and load.tokens == [0, 35] and load.total_outstanding == 1
    assert load.least("outstanding") == 0
    load.kv_changed(0, 50, 100)
    assert load.kv_use == [0.5, 0.0] and load.least("kv_use") == 1
    fixed = ReplicaLoad([None], output_tokens=64)
    fixed.routed(0, a)
    assert fixed.tokens == [164]


def test_snapshot_is_stale_until_refreshed():
    load = ReplicaLoad([None, None, None], ordered=("outstanding",))
    snap = Snapshot(load)
    for k in range(5):
        load.routed(0, Request(k, 0.0, 10, 10))
    assert load.least("outstanding") == 1
    assert snap.least("outstanding") == 0 and snap.outstanding == [0, 0, 0]   # old scrape
    snap.refresh(1.0)
    assert snap.outstanding == [5, 0, 0] and snap.least("outstanding") == 1
    assert snap.taken_at == 1.0


def test_token_bucket_admits_rate_times_time_plus_burst():
    bucket = TokenBucket(rate=2.0, burst=3.0)
    assert [bucket.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert bucket.take(0.5)           # one token refilled after 0.5 s
    assert not bucket.take(0.5)
    assert [bucket.take(10.0) for _ in range(4)] == [True, True, True, False]   # capped at burst
    assert TokenBucket(rate=0.5).burst == 1.0
