"""Queue and victim policies: orderings on hand-built queues, MLFQ, fair share, full runs."""


import numpy as np
import pytest

import simsched
from simsched.api import make_requests
from simsched.config import SchedulerConfig, SimConfig
from simsched.cluster.cluster import Cluster
from simsched.engine.kv.cache import KVCacheManager
from simsched.policies import QUEUE_POLICIES, VICTIM_POLICIES, make_queue
from simsched.request import Request, Status
from simsched.engine.scheduler.core import Scheduler
from simsched.workloads.workload import WorkloadConfig

NEW_POLICIES = ("sjf_oracle", "predicted_sjf", "mlfq", "fair", "edf", "spf_aging",
                "priority_aging")


def order(queue, now=0.0):
    if hasattr(queue, "update"):
        queue.update(now)
    out = []
    while len(queue):
        out.append(queue.pop().id)
    return out


def test_sjf_oracle_orders_by_remaining_prefill_plus_output():
    q = make_queue("sjf_oracle", {})
    q.push(Request(0, 0.0, 100, 500), 0.0)     # 600
    q.push(Request(1, 0.1, 400, 10), 0.1)      # 410
    q.push(Request(2, 0.2, 10, 50), 0.2)       # 60
    resumed = Request(3, 0.3, 10, 1000)
    resumed.num_generated, resumed.prefill_target = 990, 1000  # preempted late: 1000 + 10 left
    q.push(resumed, 0.3)
    assert order(q) == [2, 1, 0, 3]


def test_predicted_sjf_exact_predictor_matches_oracle_and_noise_is_seeded():
    reqs = [(i, 10 * (i % 3), 5 + 37 * i % 200) for i in range(20)]

    def ranked(name, opts, seed):
        q = make_queue(name, opts, np.random.default_rng(seed))
        for i, p, o in reqs:
            q.push(Request(i, float(i), p + 1, o), float(i))
        return order(q, 0.0)

    assert ranked("predicted_sjf", {"sigma": 0.0}, 1) == ranked("sjf_oracle", {}, 1)
    assert ranked("predicted_sjf", {"sigma": 1.0}, 7) == ranked("predicted_sjf", {"sigma": 1.0}, 7)
    assert ranked("predicted_sjf", {"sigma": 1.0}, 7) != ranked("sjf_oracle", {}, 7)


def test_predicted_sjf_promotes_a_request_waiting_past_max_wait():
    q = make_queue("predicted_sjf", {"sigma": 0.0, "max_wait": 5.0})
    q.push(Request(0, 0.0, 1000, 1000), 0.0)
    q.push(Request(1, 4.0, 10, 10), 4.0)
    q.update(4.0)
    assert q.peek().id == 1
    q.update(6.0)                               # request 0 has waited 6 s > 5 s
    assert q.peek().id == 0
    assert order(q, 6.0) == [0, 1]


def test_spf_aging_lets_an_old_long_prompt_overtake():
    q = make_queue("spf", {"aging_rate": 100.0})
    q.push(Request(0, 0.0, 1000, 10), 0.0)
    q.push(Request(1, 5.0, 600, 10), 5.0)       # 600 + 500 > 1000: the older long one first
    q.push(Request(2, 5.0, 100, 10), 5.0)       # 100 + 500 < 1000
    assert order(q) == [2, 0, 1]
    plain = make_queue("spf", {})
    for r in (Request(0, 0.0, 1000, 10), Request(1, 5.0, 600, 10)):
        plain.push(r, r.arrival_at)
    assert order(plain) == [1, 0]


def test_priority_aging_and_plain_priority():
    def reqs():
        return [Request(0, 0.0, 10, 10, priority=2), Request(1, 15.0, 10, 10, priority=0)]

    aged = make_queue("priority_aging", {"aging_rate": 0.2})   # 2 - 0.2*15 < 0
    plain = make_queue("priority", {})
    for q in (aged, plain):
        for r in reqs():
            q.push(r, r.arrival_at)
    assert order(aged) == [0, 1]
    assert order(plain) == [1, 0]


def test_edf_orders_by_arrival_plus_class_slo():
    q = make_queue("edf", {"ttft_slo": 10.0, "ttft_slo_by_priority": {0: 0.5}})
    q.push(Request(0, 0.0, 10, 10, priority=1), 0.0)    # deadline 10
    q.push(Request(1, 2.0, 10, 10, priority=0), 2.0)    # deadline 2.5
    q.push(Request(2, 1.0, 10, 10, priority=1), 1.0)    # deadline 11
    assert order(q) == [1, 0, 2]


def test_fair_serves_least_served_tenant_and_lifts_newly_backlogged():
    q = make_queue("fair", {})
    meter = q.meter
    a = [Request(i, float(i), 100, 10, tenant="a") for i in range(3)]
    q.push(a[0], 0.0)
    q.push(a[1], 1.0)
    assert q.pop() is a[0]
    meter.prefill(a[0], 100)                             # tenant a has been served 100
    b = Request(5, 5.0, 100, 10, tenant="b")
    q.push(b, 5.0)                                       # b becomes backlogged: lifted to 100
    assert q.counter("b") == pytest.approx(100.0)
    meter.prefill(b, 10)                                 # b: 110 > a: 100
    assert q.peek().id == 1
    assert q.ranks_below(b, a[1])
    meter.prefill(a[1], 50)
    assert q.pop().id == 5                               # now b (110) < a (150)


def test_mlfq_skip_join_and_demotion():
    q = make_queue("mlfq", {"quantum": 4, "growth": 2, "num_levels": 4,
                            "prefill_tokens_per_unit": 100})
    short, long = Request(0, 0.0, 50, 100), Request(1, 0.0, 700, 100)
    assert q.entry_level(short) == 0                     # 0.5 units < 4
    assert q.entry_level(long) == 1                      # 7 units: skips level 0 (4)
    # short leaves level 0 after 4 units of service, level 1 after 4 + 8
    assert [q.level(short, g) for g in (0, 3, 4, 11, 12, 1000)] == [0, 0, 1, 1, 2, 3]
    assert q.level(long, 0) == 1 and q.level(long, 2) == 2   # 7 + 1 < 8 <= 7 + 2


def test_victims_largest_kv_and_policy_worst():
    kv = KVCacheManager(100, 16)
    sched = Scheduler(SchedulerConfig(policy="sjf_oracle"), kv)
    reqs = [Request(0, 0.0, 64, 500), Request(1, 0.0, 200, 10), Request(2, 0.0, 16, 30)]
    for r in reqs:
        sched.add(r, 0.0)
    sched.schedule(0.0)
    sched.commit(1.0)
    assert set(sched.running) == {0, 1, 2}
    assert VICTIM_POLICIES["largest_kv"](reqs, sched).id == 1
    # SJF keys at enqueue: 564, 210, 46: request 0 is ranked last
    assert VICTIM_POLICIES["policy_worst"](reqs, sched).id == 0


def test_mlfq_preempts_a_demoted_request_for_a_new_one():
    cfg = SchedulerConfig(policy="mlfq", max_num_seqs=1, max_num_batched_tokens=64,
                          policy_options={"quantum": 2, "prefill_tokens_per_unit": 1000,
                                          "min_quantum": 4})
    sched = Scheduler(cfg, KVCacheManager(100, 16))
    long = Request(0, 0.0, 8, 40)
    sched.add(long, 0.0)
    now = 0.0
    for _ in range(6):                                   # prefill + 5 decodes: level >= 1
        sched.schedule(now)
        sched.commit(now + 1)
        now += 1
    new = Request(1, now, 8, 5)
    sched.add(new, now)
    sched.schedule(now)
    assert [(v.id, c.reason) for v, c in sched.preempted] == [(0, "admission")]
    assert new.status is Status.RUNNING and long.status is Status.WAITING


def test_fair_share_counters_stay_within_the_vtc_bound():
    """Two tenants backlogged throughout: their counters differ by at most 2 * max(w_p L, w_q M)."""
    rng = np.random.default_rng(3)
    n = 160
    table = [(0.0, int(rng.integers(20, 300)), int(rng.integers(5, 120)), 0,
              "heavy" if i % 4 else "light") for i in range(n)]
    config = SimConfig(check_invariants=True).replace(
        policy="fair", max_num_seqs=16, max_num_batched_tokens=256, cost_model="unit",
        **{"cache.num_blocks": 200})
    reqs = make_requests(table)
    engine = Cluster(config, reqs, simsched.cost.base.UnitCostModel(), 200)
    sched = engine.scheduler
    gaps = []
    commit = sched.commit

    def recording_commit(now):
        out = commit(now)
        backlogged = {r.tenant for r in sched.queue}
        if backlogged == {"heavy", "light"}:
            gaps.append(abs(sched.queue.counter("heavy") - sched.queue.counter("light")))
        return out

    sched.commit = recording_commit
    engine.run()
    assert all(r.status is Status.FINISHED for r in reqs)
    assert len(gaps) > 20
    bound = 2 * max(1.0 * 300, 2.0 * 200 * 16)           # L = longest prompt, M = KV tokens
    assert max(gaps) <= bound
    # service is balanced, not proportional to the 3:1 request mix
    meter = sched.meter
    assert meter.prompt_tokens["light"] > 0 and meter.output_tokens("light", sched.step) > 0


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("policy", NEW_POLICIES)
def test_every_new_policy_finishes_a_memory_pressured_run(policy, mode):
    workload = WorkloadConfig(name="lesson", num_requests=60, rate=40.0, lengths="uniform",
                              prompt_range=(20, 400), output_range=(10, 200), num_tenants=2,
                              num_priorities=2)
    config = SimConfig(workload=workload, check_invariants=True, seed=1).replace(
        policy=policy, preemption=True, preemption_mode=mode, max_num_seqs=32,
        max_num_batched_tokens=512, victim_policy="policy_worst",
        **{"cache.num_blocks": 120, "cache.swap_space_gib": 0.05})
    res = simsched.simulate(config)
    s = res.summary()
    assert s["num_finished"] == 60 and s["num_preemptions"] > 0


@pytest.mark.parametrize("victim", sorted(VICTIM_POLICIES))
def test_every_victim_policy_runs(victim):
    workload = WorkloadConfig(name="lesson", num_requests=40, rate=40.0, lengths="uniform",
                              prompt_range=(20, 300), output_range=(10, 150))
    config = SimConfig(workload=workload, check_invariants=True).replace(
        victim_policy=victim, policy="mlfq", max_num_seqs=32, **{"cache.num_blocks": 80})
    assert simsched.simulate(config).summary()["num_finished"] == 40


def test_bad_policy_options_name_the_option():
    with pytest.raises(ValueError, match="sigma"):
        make_queue("predicted_sjf", {"sigma": -1})
    with pytest.raises(ValueError, match="not understood"):
        make_queue("fcfs", {"aging_rate": 1})
    with pytest.raises(ValueError, match="tenant_weights"):
        make_queue("fair", {"tenant_weights": {"a": 0}})
    assert set(NEW_POLICIES) <= set(QUEUE_POLICIES)
