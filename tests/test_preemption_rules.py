"""Admission in a step that preempted (vLLM V1 vs V0, issue 17 item 22)."""

import numpy as np
import pytest

import simsched
from simsched import SimConfig, UnitCostModel

ISSUE_CASE = [(0.0, 2, 4), (0.0, 2, 4), (0.5, 2, 1)]


def _issue_run(admit_after_preemption):
    cfg = SimConfig(check_invariants=True).replace(
        num_blocks=5, block_size=1, watermark=0.0, victim_policy="newest",
        admit_after_preemption=admit_after_preemption)
    return simsched.simulate(cfg, requests=ISSUE_CASE, cost_model=UnitCostModel())


def test_default_is_vllm_v1_no_admission_in_a_step_that_preempted():
    assert SimConfig().scheduler.admit_after_preemption is False
    res = _issue_run(False)
    df = res.requests.set_index("request_id")
    assert list(res.preemptions["at"]) == [1.0]      # request 1 preempted at t=1
    assert list(res.preemptions["request_id"]) == [1]
    # Request 2 (arrived at 0.5) does not take the victim's blocks at t=1 ...
    assert res.iterations.loc[1, "num_seqs"] == 1
    assert df.loc[2, "first_scheduled_at"] > 1.0
    # ... and the victim, ahead of it in FCFS order, is not overtaken.
    assert df.loc[2, "first_scheduled_at"] >= 4.0


def test_v0_rule_admits_into_the_freed_blocks():
    res = _issue_run(True)
    df = res.requests.set_index("request_id")
    assert list(res.preemptions["at"]) == [1.0]
    assert df.loc[2, "first_scheduled_at"] == 1.0     # admitted in the preempting step
    assert res.iterations.loc[1, "num_seqs"] == 2


def _random_case(seed):
    rng = np.random.default_rng(seed)
    n = 40
    arrivals = np.sort(rng.uniform(0, 10, n))
    return [(float(a), int(p), int(o)) for a, p, o in
            zip(arrivals, rng.integers(1, 21, n), rng.integers(1, 26, n))]


def test_rules_differ_in_more_than_half_of_preemption_heavy_cases():
    differ = preempting = 0
    num_cases = 12
    for seed in range(num_cases):
        frames = []
        for v0 in (False, True):
            cfg = SimConfig(check_invariants=True).replace(
                num_blocks=12, block_size=4, max_num_seqs=8, max_num_batched_tokens=64,
                admit_after_preemption=v0)
            res = simsched.simulate(cfg, requests=_random_case(seed), cost_model=UnitCostModel())
            assert (res.requests["status"] == "finished").all()
            preempting += res.summary()["num_preemptions"] > 0
            frames.append(res.requests[["first_scheduled_at", "finished_at"]].to_numpy())
        differ += not np.array_equal(*frames)
    assert preempting == 2 * num_cases
    assert differ > num_cases / 2


@pytest.mark.parametrize("style", ["static", "prefill_first"])
def test_both_rules_run_every_style(style):
    for v0 in (False, True):
        cfg = SimConfig(check_invariants=True).replace(
            num_blocks=12, block_size=4, max_num_seqs=8, max_num_batched_tokens=64,
            style=style, admit_after_preemption=v0)
        res = simsched.simulate(cfg, requests=_random_case(1), cost_model=UnitCostModel())
        assert (res.requests["status"] == "finished").all()


# ---------------------------------------------------------------- preemption storms (section 3)

from simsched.config import SchedulerConfig  # noqa: E402
from simsched.engine.kv.cache import KVCacheManager  # noqa: E402
from simsched.engine.scheduler.core import Scheduler  # noqa: E402
from simsched.policies import make_queue  # noqa: E402
from simsched.policies.mlfq import MLFQueue  # noqa: E402
from simsched.request import Request, Status  # noqa: E402


def _steps(sched, now, n):
    for _ in range(n):
        sched.schedule(now)
        sched.commit(now + 1)
        now += 1
    return now


def test_mlfq_guard_protects_a_request_for_min_quantum_tokens_after_admission():
    cfg = SchedulerConfig(policy="mlfq", max_num_seqs=1, max_num_batched_tokens=64,
                          policy_options={"quantum": 2, "prefill_tokens_per_unit": 1000,
                                          "min_quantum": 10})
    sched = Scheduler(cfg, KVCacheManager(100, 16))
    long = Request(0, 0.0, 8, 40)
    sched.add(long, 0.0)
    now = _steps(sched, 0.0, 6)               # prefill + 5 decodes: demoted to level >= 1
    assert sched.queue.level(long, sched.num_generated(long)) >= 1
    new = Request(1, now, 8, 5)
    sched.add(new, now)
    for _ in range(5):                        # 5..9 tokens decoded since admission: protected
        sched.schedule(now)
        assert not sched.preempted and new.status is Status.WAITING
        sched.commit(now + 1)
        now += 1
    sched.schedule(now)                       # 10 tokens: the level-0 request may preempt it
    assert [(v.id, c.reason) for v, c in sched.preempted] == [(0, "admission")]
    assert new.status is Status.RUNNING
    assert make_queue("mlfq", {}).min_quantum == 64  # the documented default


def test_mlfq_ranks_lazily_and_recomputes_a_level_only_when_it_changes():
    calls = []
    original = MLFQueue._key_at

    def counting(self, req, g):
        calls.append(req.id)
        return original(self, req, g)

    MLFQueue._key_at = counting
    try:
        rng = np.random.default_rng(0)
        n = 120
        table = [(0.0, int(p), int(o)) for p, o in
                 zip(rng.integers(5, 200, n), rng.integers(50, 400, n))]
        cfg = SimConfig(check_invariants=True).replace(
            policy="mlfq", max_num_seqs=64, max_num_batched_tokens=512,
            **{"cache.num_blocks": 400})
        res = simsched.simulate(cfg, requests=table, cost_model=UnitCostModel())
    finally:
        MLFQueue._key_at = original
    s = res.summary()
    assert s["num_finished"] == n
    running_steps = int(res.iterations["num_seqs"].sum())
    # Each call is an enqueue or a level change (8 levels): bounded per request, far below
    # one per running request per iteration as the old per-iteration refresh made.
    pushes = n + s["num_preemptions"]
    assert len(calls) <= pushes + 8 * n
    assert len(calls) < running_steps / 5


def _all_at_once(n, seed=0):
    rng = np.random.default_rng(seed)
    return [(0.0, int(p), int(o)) for p, o in
            zip(rng.integers(5, 60, n), rng.integers(10, 80, n))]


def _overload(n, **changes):
    """An all-at-once backlog on a small engine, stopped at a fixed simulated time."""
    cfg = SimConfig(max_sim_time=300.0).replace(
        max_num_seqs=16, max_num_batched_tokens=256, **{"cache.num_blocks": 60}, **changes)
    s = simsched.simulate(cfg, requests=_all_at_once(n), cost_model=UnitCostModel()).summary()
    return s["num_preemptions"], s["num_finished"]


def test_mlfq_does_not_collapse_as_the_backlog_deepens():
    # Without the guard, a deep backlog of fresh level-0 requests preempts every demoted
    # request: the same 300 iterations finish 57 requests with 100 waiting and none with 3,000.
    off_small = _overload(100, policy="mlfq", policy_options={"min_quantum": 0})
    off_large = _overload(3000, policy="mlfq", policy_options={"min_quantum": 0})
    assert off_large[1] < 0.2 * off_small[1] and off_large[0] > 3 * off_small[0]
    on_small, on_large = _overload(100, policy="mlfq"), _overload(3000, policy="mlfq")
    assert on_large[1] >= 0.7 * on_small[1]
    assert on_large[0] / on_large[1] <= 1.5 * on_small[0] / on_small[1]


def test_fair_tenants_do_not_preempt_each_other_back_and_forth():
    rng = np.random.default_rng(1)
    n = 300
    table = [(0.0, int(rng.integers(50, 400)), int(rng.integers(10, 100)), 0, f"t{i % 4}")
             for i in range(n)]
    cfg = SimConfig(check_invariants=True, max_sim_time=300.0).replace(
        policy="fair", preemption=True, max_num_seqs=16, max_num_batched_tokens=512,
        **{"cache.num_blocks": 150})
    res = simsched.simulate(cfg, requests=table, cost_model=UnitCostModel())
    s = res.summary()
    admission = int((res.preemptions["reason"] == "admission").sum())
    # Without the guard: 249 admission preemptions in 299 iterations, 9 per finished request,
    # victims bounced up to the cap (8); with it: 24, and 1.1 per finished request.
    assert admission <= 0.15 * len(res.iterations)
    assert s["num_preemptions"] <= 2 * s["num_finished"]


def test_fair_may_preempt_needs_a_gap_larger_than_the_preemptor_prefill():
    q = make_queue("fair", {})
    meter = q.meter
    a, b = Request(0, 0.0, 100, 10, tenant="a"), Request(1, 0.0, 100, 10, tenant="b")
    meter.prefill(Request(9, 0.0, 1, 1, tenant="a"), 150)      # a: 150, b: 0
    assert q.ranks_below(a, b)                                  # b is owed service ...
    assert q.may_preempt(a, b)                                  # ... and stays behind: 0 + 100 < 150
    meter.prefill(Request(8, 0.0, 1, 1, tenant="b"), 60)       # b: 60; 60 + 100 > 150
    assert q.ranks_below(a, b) and not q.may_preempt(a, b)     # would swap places: no
    assert not q.may_preempt(Request(2, 0.0, 5, 5, tenant="a"), a)   # never within a tenant


def test_counter_cache_follows_every_meter_change():
    q = make_queue("fair", {"tenant_weights": {"b": 2.0}})
    meter = q.meter

    class View:
        step = 0

    view = View()
    q.bind(view)
    reqs = [Request(i, 0.0, 10, 10, tenant="ab"[i % 2]) for i in range(4)]
    ops = [lambda: meter.prefill(reqs[0], 30), lambda: meter.first_token(reqs[1]),
           lambda: meter.start_decoding(reqs[2], view.step),
           lambda: setattr(view, "step", view.step + 3),
           lambda: meter.stop_decoding(reqs[2], view.step), lambda: meter.lift("a", view.step, 500.0),
           lambda: meter.prefill(reqs[1], -5)]
    for op in ops:
        q.counter("a"), q.counter("b")          # fill the cache
        op()
        for t in "ab":
            assert q.counter(t) == meter.counter(t, view.step)


def test_sjf_promotion_orders_the_queue_but_does_not_preempt():
    # Promoted requests used to outrank every running one: once the whole queue had waited
    # max_wait, each admission preempted, and re-queued victims did the same later (a storm).
    cfg = SchedulerConfig(policy="sjf_oracle", policy_options={"max_wait": 5.0},
                          preemption=True, max_num_seqs=2, max_num_batched_tokens=64)
    sched = Scheduler(cfg, KVCacheManager(4, 16, watermark=0.0))
    short = Request(0, 0.0, 4, 40)            # holds 3 of the 4 blocks while it decodes
    sched.add(short, 0.0)
    now = _steps(sched, 0.0, 30)
    long = Request(1, now, 40, 20)            # needs 3 blocks: only KV preemption admits it
    sched.add(long, now)
    now = _steps(sched, now, 8)               # long has waited 8 s > max_wait: promoted
    assert sched.queue.peek() is long and long.status is Status.WAITING
    assert short.status is Status.RUNNING and short.num_preemptions == 0


def test_sjf_ranks_a_running_request_by_its_remaining_work_now():
    cfg = SchedulerConfig(policy="sjf_oracle", preemption=True, max_num_seqs=4,
                          max_num_batched_tokens=64)
    sched = Scheduler(cfg, KVCacheManager(100, 16))
    first = Request(0, 0.0, 4, 50)            # 54 tokens at enqueue
    sched.add(first, 0.0)
    now = _steps(sched, 0.0, 40)              # prefill + 39 decodes: 40 generated, 10 left
    assert first.sort_key[0] == 54 and sched.queue.remaining(first) == 10
    newcomer, shorter = Request(1, now, 4, 20), Request(2, now, 1, 3)
    for r in (newcomer, shorter):
        sched.add(r, now)
    # 24 < 54 (its stale key) but > 10 left: the newcomer may not preempt it; 4 < 10 may.
    assert not sched.queue.ranks_below(first, newcomer)
    assert sched.queue.ranks_below(first, shorter)


def test_overload_benchmark_smoke(capsys):
    from benchmarks import overload

    frame = overload.main(["--quick", "--policies", "mlfq,fair", "--iterations", "30",
                           "--repeats", "1"])
    assert list(frame["policy"]) == ["mlfq", "mlfq", "fair", "fair"]
    assert (frame["finished_10000"] >= 0).all() and np.isfinite(frame["ratio"]).all()
    assert "worst ratio" in capsys.readouterr().out
