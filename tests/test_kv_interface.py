"""One KV-manager interface with and without prefix caching: both managers implement it, the
private one never matches, and the scheduler asks a manager nothing else."""

import pytest

from simsched.config import SchedulerConfig
from simsched.engine.kv.cache import KVCacheError, KVCacheManager, KVManager
from simsched.engine.kv.prefix_cache import PrefixCache
from simsched.engine.scheduler.core import Scheduler
from simsched.request import Content, Request, Status

MANAGERS = [KVCacheManager, PrefixCache]
MEMBERS = {n for n in vars(KVManager) if not n.startswith("_")} | set(KVManager.__annotations__)


class InterfaceOnly:
    """A KV manager seen only through the members :class:`KVManager` lists."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        if name not in MEMBERS:
            raise AttributeError(f"{name!r} is not part of the KVManager interface")
        return getattr(self._inner, name)


def shared(i, prompt=40, prefix=32):
    """A request whose first ``prefix`` tokens are the same system prompt as the others'."""
    content = Content.from_segments([("system", prefix), (i, prompt - prefix)], output_id=i)
    return content


@pytest.mark.parametrize("manager", MANAGERS)
def test_both_managers_implement_the_interface(manager):
    kv = manager(20, 4)
    assert isinstance(kv, KVManager)
    assert all(hasattr(kv, name) for name in MEMBERS)


def test_private_blocks_never_match_and_acquire_takes_the_first_chunk():
    kv = KVCacheManager(10, 4)
    req = Request(1, 0.0, 30, 5, content=shared(1))
    assert kv.match(req) == (0, 0, 0) and kv.num_cached_prefix_tokens(req) == 0
    kv.acquire(req, 0, 9)                       # 9 tokens: 3 blocks
    assert kv.num_held(1) == 3 and kv.num_free == 7
    with pytest.raises(KVCacheError, match="needs 8 blocks, 7 free"):
        kv.acquire(Request(2, 0.0, 32, 5), 0, 32)
    kv.acquire(Request(3, 0.0, 8, 5), 0, 0)     # nothing yet (its chunks come later)
    assert kv.holders() == {1: 3} and kv.registered() == {}
    assert kv.free(1, 9) == 3 and kv.num_free == 10


@pytest.mark.parametrize("manager", MANAGERS)
def test_a_request_without_content_holds_private_blocks_in_either_manager(manager):
    kv = manager(12, 4)
    a, b = Request(1, 0.0, 10, 5), Request(2, 0.0, 6, 5)
    assert kv.match(a) == (0, 0, 0)
    kv.acquire(a, 0, 10)
    kv.hold(b.id, 2)
    assert kv.allocate(a.id, 13) == 1 and kv.num_held(a.id) == 4
    kv.join_group(a.id, 1)
    assert kv.grow_group(1, 1) and kv.num_held(a.id) == 5
    kv.add_block(b.id)
    assert kv.holders() == {1: 5, 2: 3} and kv.num_free == 4 and kv.num_used == 8
    assert kv.free(a.id, 17) == 5 and kv.free(b.id, 9) == 3
    assert kv.num_free == 12 and kv.num_evictable == 0 and not kv.registered()


def test_a_prefix_cache_matches_what_another_request_computed_and_hold_evicts_it_if_needed():
    kv = PrefixCache(12, 4)
    a = Request(1, 0.0, 40, 5, content=shared(1))
    assert kv.match(a) == (0, 0, 0)
    kv.acquire(a, 0, 40)                        # 10 blocks, 8 of them the shared prefix's
    b = Request(2, 0.0, 40, 5, content=shared(2))
    assert kv.match(b) == (32, 8, 0)            # the shared 32 tokens, held by a
    kv.free(a.id, 40)                           # a's blocks stay cached, evictable
    assert kv.num_free == 12 and kv.num_evictable == 10
    assert kv.match(b) == (32, 8, 8)            # taking them now uses free blocks
    kv.hold(3, 6)                               # private blocks: 2 empty ones, then 4 evicted
    assert kv.num_evictable == 6 and kv.num_free == 6 and kv.num_evicted_blocks == 4
    assert kv.match(b) == (24, 6, 6)            # the evicted tail of the prefix is gone


def drive(kv, cfg, reqs, handoff=()):
    """Run a scheduler over ``reqs`` to the end; each request's times, and the preemptions."""
    sched = Scheduler(cfg, kv, kv_bytes_per_block=1e6, swap_space_bytes=1e9)
    sched.handoff.update(handoff)
    arrivals = list(reqs)
    now, causes = 0.0, []
    while arrivals or sched.has_work() or sched.held:
        while arrivals and arrivals[0].arrival_at <= now:
            assert sched.add(arrivals.pop(0), now)
        sched.schedule(now)
        causes += [(v.id, c.reason, c.mode) for v, c in sched.preempted]
        sched.commit(now + 1.0)
        for req in list(sched.held.values()):
            sched.release_held(req)             # its KV transfer ended at once
        now += 1.0
        assert now < 10_000
    return [(r.status, r.first_token_at, r.finished_at) for r in reqs], causes


@pytest.mark.parametrize("manager", MANAGERS)
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_the_scheduler_asks_a_manager_only_what_the_interface_lists(manager, mode):
    cfg = SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=64, policy="priority",
                          preemption=True, preemption_mode=mode)

    def reqs():
        # later arrivals are more urgent: they preempt for room; a third have no content
        return [Request(i, 2.0 * i, 40 + 3 * i, 30 + 5 * i, priority=10 - i,
                        content=shared(i) if i % 3 else None) for i in range(10)]

    plain = drive(manager(40, 4), cfg, reqs(), handoff={7})
    seen = drive(InterfaceOnly(manager(40, 4)), cfg, reqs(), handoff={7})
    assert seen == plain
    times, causes = seen
    # every request finished here but the one handed off after its prefill (to decode elsewhere)
    assert [i for i, (status, _, _) in enumerate(times) if status is not Status.FINISHED] == [7]
    assert {reason for _, reason, _ in causes} == {"kv_full", "admission"}
    assert {m for _, _, m in causes} == {mode}
