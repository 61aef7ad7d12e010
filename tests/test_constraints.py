"""Admission constraints: each one refuses and admits as defined, the one memo of refusals re-asks
exactly when something a refusal depends on changed, and an added constraint plugs in."""

import pytest

from simsched.config import SchedulerConfig, SimConfig
from simsched.api import make_requests
from simsched.cluster.cluster import Cluster
from simsched.cost.base import UnitCostModel
from simsched.engine.scheduler.constraints import (AdmissionConstraint, KVBlocks, PrefillSlots, SeqSlots,
                                         TokenBudget)
from simsched.engine.kv.cache import KVCacheManager
from simsched.engine.scheduler.core import Scheduler
from simsched.request import Request, Status


def make(num_blocks=1000, block_size=16, watermark=0.0, **cfg):
    cfg.setdefault("max_num_seqs", 8)
    kv = KVCacheManager(num_blocks, block_size, watermark)
    return Scheduler(SchedulerConfig(**cfg), kv), kv


def step(sched, now):
    batch = sched.schedule(now)
    sched.commit(now + 1.0)
    return batch


class Gate(AdmissionConstraint):
    """A constraint the test opens and closes; ``version`` says when its state changed."""

    def __init__(self, stamped=True):
        self.open = False
        self.version = 0
        self.stamped = stamped
        self.asked = 0

    def admits(self, sched, req, need):
        self.asked += 1
        return self.open

    def stamp(self, sched):
        return self.version if self.stamped else None

    def still_blocked(self, sched, stamp):
        return stamp == self.version


class MaxRunningPerTenant(AdmissionConstraint):
    """A toy constraint: at most ``limit`` running requests per tenant, until the running set
    changes."""

    name = "max_running_per_tenant"

    def __init__(self, limit):
        self.limit = limit
        self.asked = 0

    def admits(self, sched, req, need):
        self.asked += 1
        return sum(r.tenant == req.tenant for r in sched.running.values()) < self.limit

    def stamp(self, sched):
        return sched.running_version

    def still_blocked(self, sched, stamp):
        return sched.running_version == stamp


# ----------------------------------------------------------------------- each constraint
def test_seq_slots_admit_up_to_max_num_seqs_then_one_per_finish():
    sched, _ = make(max_num_seqs=2, max_num_batched_tokens=64)
    reqs = [Request(i, 0.0, 10, 3 + i) for i in range(3)]
    for r in reqs:
        sched.add(r, 0.0)
    step(sched, 0.0)
    assert [r.status for r in reqs] == [Status.RUNNING, Status.RUNNING, Status.WAITING]
    assert not SeqSlots(2).admits(sched, reqs[2], 0) and SeqSlots(3).admits(sched, reqs[2], 0)
    step(sched, 1.0)
    step(sched, 2.0)                        # request 0 finishes (3 tokens)
    assert reqs[0].status is Status.FINISHED and reqs[2].status is Status.WAITING
    step(sched, 3.0)
    assert reqs[2].status is Status.RUNNING


def test_prefill_slots_cap_the_prefills_of_an_iteration():
    sched, _ = make(max_num_prefills=1, max_num_batched_tokens=256)
    reqs = [Request(i, 0.0, 20, 5) for i in range(2)]
    for r in reqs:
        sched.add(r, 0.0)
    assert sched.schedule(0.0).prefill_new_tokens == [20]
    assert reqs[1].status is Status.WAITING
    assert not PrefillSlots(1).admits(sched, reqs[1], 0) and PrefillSlots(2).admits(sched, None, 0)
    sched.commit(1.0)
    assert step(sched, 1.0).prefill_new_tokens == [20]
    assert reqs[1].status is Status.RUNNING


def test_token_budget_refuses_once_spent_and_an_unchunked_prompt_waits_for_room():
    sched, _ = make(max_num_batched_tokens=64)
    a, b = Request(0, 0.0, 64, 5), Request(1, 0.0, 10, 5)
    sched.add(a, 0.0)
    sched.add(b, 0.0)
    batch = sched.schedule(0.0)
    assert batch.prefill_new_tokens == [64] and b.status is Status.WAITING
    assert sched.budget_left() == 0 and not TokenBudget().admits(sched, b, 0)
    sched.commit(1.0)
    # unchunked: 1 decode leaves 63 tokens, too few for a 64-token prompt, enough for 10
    sched, _ = make(max_num_batched_tokens=64, enable_chunked_prefill=False)
    a, b, c = Request(0, 0.0, 10, 9), Request(1, 0.1, 64, 5), Request(2, 0.2, 10, 5)
    sched.add(a, 0.0)
    step(sched, 0.0)
    sched.add(b, 0.5)
    sched.add(c, 0.5)
    batch = step(sched, 1.0)
    assert batch.num_decode_seqs == 1 and batch.prefill_new_tokens == []
    assert b.status is Status.WAITING and c.status is Status.WAITING   # FCFS: c stays behind b


@pytest.mark.parametrize("watermark", [0.0, 0.2])
def test_kv_blocks_refuse_a_chunk_that_does_not_fit_beyond_the_watermark(watermark):
    reserve = int(10 * watermark)

    def scenario(num_blocks_wanted):
        sched, kv = make(num_blocks=10, block_size=16, watermark=watermark,
                         max_num_batched_tokens=512)
        a = Request(0, 0.0, 16 * 6, 4)      # 6 of the 10 blocks, 7 from its first decode on
        sched.add(a, 0.0)
        step(sched, 0.0)
        assert kv.num_free == 4 and KVBlocks().admits(sched, None, 4 - reserve) \
            and not KVBlocks().admits(sched, None, 5 - reserve)
        b = Request(1, 1.0, 16 * num_blocks_wanted, 2)
        sched.add(b, 1.0)
        step(sched, 1.0)                     # a takes its 7th block first: 3 free
        return sched, a, b

    assert scenario(3 - reserve)[2].status is Status.RUNNING
    sched, a, b = scenario(4 - reserve)
    assert b.status is Status.WAITING
    for t in range(2, 6):
        step(sched, float(t))
    assert a.status is Status.FINISHED and b.first_scheduled_at == a.finished_at  # once free


def test_the_scheduler_lists_its_constraints_in_the_order_asked():
    sched, _ = make()
    assert [type(c) for c in sched.constraints] == [SeqSlots, PrefillSlots, TokenBudget, KVBlocks]
    static, _ = make(style="static")
    assert TokenBudget not in [type(c) for c in static.constraints]
    gate = Gate()
    sched.add_constraint(gate)
    assert sched.constraints[-2:] == [gate, sched.constraints[-1]]
    assert isinstance(sched.constraints[-1], KVBlocks)


# ----------------------------------------------------------------------- the memo
def test_a_kv_refusal_skips_the_scan_until_blocks_are_freed():
    sched, kv = make(num_blocks=10, block_size=16, max_num_batched_tokens=512)
    a = Request(0, 0.0, 16 * 6, 12)
    sched.add(a, 0.0)
    step(sched, 0.0)
    b = Request(1, 1.0, 16 * 6, 2)           # 6 blocks, 3 free at most while a runs
    sched.add(b, 1.0)
    scans = []
    admit = sched._admit
    sched._admit = lambda: (scans.append(1), admit())[1]
    sched.schedule(1.0)
    # the refusal's stamp, made inline by _admit, is the one KVBlocks.stamp defines
    assert sched._blocked[0] is sched.constraints[-1]
    assert sched._blocked[4] == sched.constraints[-1].stamp(sched)
    sched.commit(2.0)
    now = 2.0
    while a.status is Status.RUNNING:
        step(sched, now)
        now += 1
    assert len(scans) == 1                   # refused once; later iterations asked the memo
    assert isinstance(sched._blocked[0], KVBlocks)
    step(sched, now)                         # a's blocks are free: asked again, admitted
    assert len(scans) == 2 and b.status is Status.RUNNING


def test_a_kv_refusal_is_asked_again_when_a_new_request_heads_the_queue():
    sched, kv = make(num_blocks=10, block_size=16, max_num_batched_tokens=512, policy="spf")
    a = Request(0, 0.0, 16 * 6, 20)
    sched.add(a, 0.0)
    step(sched, 0.0)
    big = Request(1, 1.0, 16 * 6, 2)
    sched.add(big, 1.0)
    step(sched, 1.0)
    step(sched, 2.0)
    assert big.status is Status.WAITING and sched._blocked is not None
    small = Request(2, 3.0, 10, 2)           # shorter: heads the SPF queue, and fits
    sched.add(small, 3.0)
    step(sched, 3.0)
    assert small.status is not Status.WAITING and big.status is Status.WAITING


def test_kv_blocks_stamp_covers_free_blocks_budget_and_watermark():
    sched, kv = make(num_blocks=10, block_size=16, max_num_batched_tokens=512)
    kv_blocks = KVBlocks()
    stamp = kv_blocks.stamp(sched)
    assert stamp == (10, 512, False) and kv_blocks.still_blocked(sched, stamp)
    assert not kv_blocks.still_blocked(sched, (9, 512, False))       # more blocks free now
    assert kv_blocks.still_blocked(sched, (11, 512, False))          # fewer: still refused
    assert not kv_blocks.still_blocked(sched, (10, 600, False))      # a smaller budget now
    assert kv_blocks.still_blocked(sched, (10, 400, False))          # a larger one: no help
    assert not kv_blocks.still_blocked(sched, (10, 512, True))       # watermark applies anew
    assert KVBlocks(memoise=False).stamp(sched) is None


def gated(stamped=True):
    """A scheduler with a closed Gate added, and one small request waiting."""
    sched, _ = make(max_num_batched_tokens=64)
    gate = Gate(stamped)
    sched.add_constraint(gate)
    req = Request(0, 0.0, 10, 2)
    sched.add(req, 0.0)
    return sched, gate, req


def test_a_constraint_refusal_is_remembered_until_its_stamp_changes():
    sched, gate, req = gated()
    for t in range(5):
        step(sched, float(t))
    assert req.status is Status.WAITING and gate.asked == 1      # later iterations: the memo
    gate.open = True
    gate.version += 1
    step(sched, 5.0)
    assert req.status is Status.RUNNING and gate.asked == 2      # stamp changed: asked, admitted


def test_the_memo_trusts_the_stamp_and_an_unstamped_refusal_is_asked_every_iteration():
    sched, gate, req = gated()
    step(sched, 0.0)
    gate.open = True                         # a change its stamp does not show: unseen
    step(sched, 1.0)
    assert req.status is Status.WAITING and gate.asked == 1
    sched, gate, req = gated(stamped=False)
    for t in range(3):
        step(sched, float(t))
    assert gate.asked == 3
    gate.open = True
    step(sched, 3.0)
    assert req.status is Status.RUNNING


def test_added_constraints_are_asked_before_preemption_lifts_kv_blocks():
    """A request an added constraint refuses preempts nobody for KV blocks."""
    sched, kv = make(num_blocks=8, block_size=4, max_num_batched_tokens=64, max_num_seqs=4,
                     policy="spf", preemption=True)
    gate = Gate()
    sched.add_constraint(gate)
    gate.open = True
    long = Request(0, 0.0, 28, 4)            # 7 of the 8 blocks
    sched.add(long, 0.0)
    step(sched, 0.0)
    gate.open = False
    gate.version += 1
    short = Request(1, 1.0, 8, 5)            # ranks above long, needs 2 blocks, 1 free
    sched.add(short, 1.0)
    sched.schedule(1.0)
    assert not sched.preempted and short.status is Status.WAITING


def test_a_preemptible_constraint_cannot_be_added():
    sched, _ = make()
    gate = Gate()
    gate.preemptible = True
    with pytest.raises(ValueError, match="preemptible"):
        sched.add_constraint(gate)


# ----------------------------------------------------------------------- a constraint added
def test_a_per_tenant_cap_plugs_in_without_editing_the_engine():
    table = [(0.01 * i, 30 + 5 * i, 20 + 3 * i, 0, "ab"[i % 2]) for i in range(24)]
    config = SimConfig(check_invariants=True).replace(
        max_num_seqs=8, max_num_batched_tokens=256, **{"cache.num_blocks": 200})
    reqs = make_requests(table)
    engine = Cluster(config, reqs, UnitCostModel(0.01), 200)
    sched = engine.scheduler
    cap = MaxRunningPerTenant(2)
    sched.add_constraint(cap)
    most = []
    commit = sched.commit

    def counting_commit(now):
        for tenant in "ab":
            most.append(sum(r.tenant == tenant for r in sched.running.values()))
        return commit(now)

    sched.commit = counting_commit
    engine.run()
    assert all(r.status is Status.FINISHED for r in reqs)
    assert max(most) == 2                    # the cap binds, and is never exceeded
    # Refused heads are remembered until the running set changes: far fewer asks than
    # iterations with a waiting queue.
    assert cap.asked < len(most) // 2


def test_a_failed_victim_search_is_asked_again_once_more_blocks_are_free():
    """A handed-off request's KV leaves (disaggregated prefill) without the running set
    changing: the blocks it frees may let preemption make room, so the remembered failure of
    the victim search must not hold."""
    sched, kv = make(num_blocks=10, block_size=4, max_num_batched_tokens=64, max_num_seqs=4,
                     policy="priority", preemption=True)
    held = Request(0, 0.0, 16, 5, priority=0)       # 4 blocks, kept for a KV transfer
    low = Request(1, 0.0, 8, 30, priority=2)        # 2 blocks, 3 once it decodes
    sched.handoff.add(held.id)
    sched.add(held, 0.0)
    sched.add(low, 0.0)
    step(sched, 0.0)
    assert held.id in sched.held and kv.num_free == 4
    urgent = Request(2, 1.0, 36, 2, priority=0)    # 9 blocks: 3 free + low's 3 are too few
    sched.add(urgent, 1.0)
    step(sched, 1.0)
    assert urgent.status is Status.WAITING and low.status is Status.RUNNING
    sched.release_held(held)                         # 7 free + low's 3: enough
    sched.schedule(2.0)
    assert [(v.id, c.reason) for v, c in sched.preempted] == [(1, "admission")]
    assert urgent.status is Status.RUNNING
