"""Reliability: invariant checking, determinism, overload, impossible requests, livelock."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import simsched
from simsched.config import CacheConfig, HardwareConfig, SchedulerConfig, SimConfig
from simsched.api import simulate_checked
from simsched.engine.invariants import InvariantError
from simsched.engine.kv.cache import KVCacheManager
from simsched.policies import VICTIM_POLICIES
from simsched.engine.scheduler.core import Scheduler
from simsched.workloads.workload import WorkloadConfig


def small_config(**changes) -> SimConfig:
    """A small, fast configuration: unit cost model and a 64-block cache of 4-token blocks."""
    base = SimConfig(scheduler=SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=4),
                     cache=CacheConfig(block_size=4, num_blocks=64, watermark=0.0),
                     hardware=HardwareConfig(cost_model="unit"), check_invariants=True)
    return base.replace(**changes)


REQUESTS = [(0.0, 10, 6), (0.0, 7, 9), (0.5, 30, 3), (1.0, 3, 12), (2.0, 17, 1), (2.0, 9, 7)]


# --------------------------------------------------------------------------- invariants
def test_clean_run_passes_every_check():
    res, engine = simulate_checked(small_config(), REQUESTS)
    assert (res.requests["status"] == "finished").all()
    assert engine.kv.num_free == engine.kv.num_blocks


def _leak_one_block(monkeypatch):
    original = KVCacheManager.free

    def free(self, req_id):
        n = original(self, req_id)
        if n:
            self.num_free -= 1          # one block never comes back
        return n
    monkeypatch.setattr(KVCacheManager, "free", free)


def _keep_holding(monkeypatch):
    monkeypatch.setattr(KVCacheManager, "free", lambda self, req_id: 0)


def _wrap_schedule(monkeypatch, corrupt):
    original = Scheduler.schedule

    def schedule(self, now):
        batch = original(self, now)
        corrupt(self, batch)
        return batch
    monkeypatch.setattr(Scheduler, "schedule", schedule)


def _wrap_commit(monkeypatch, corrupt):
    original = Scheduler.commit

    def commit(self, now):
        firsts, finished = original(self, now)
        corrupt(self, finished)
        return firsts, finished
    monkeypatch.setattr(Scheduler, "commit", commit)


def _extra_block(sched, batch):
    if sched.running:
        rid = next(iter(sched.running))
        sched.kv._held[rid] += 1
        sched.kv.num_free -= 1


def _over_budget(sched, batch):
    if batch.prefill_new_tokens or batch.num_decode_seqs:
        batch.prefill_new_tokens.append(sched.cfg.max_num_batched_tokens)
        batch.prefill_cached_tokens.append(0)


def _queue_running(sched, finished):
    if sched.running:
        sched.queue.push(next(iter(sched.running.values())), sched.now)


def _overshoot(sched, finished):
    for req in finished:
        req.num_generated += 1


def _time_travel(sched, finished):
    for req in finished:
        req.first_token_at = req.arrival_at - 1.0


def _drop_waiting(monkeypatch):
    original = Scheduler.add

    def add(self, req, now):
        ok = original(self, req, now)
        if ok and req.id == 1:
            self.queue = type(self.queue)(self.queue._key)  # forget everything queued
        return ok
    monkeypatch.setattr(Scheduler, "add", add)


def _queue_twice(monkeypatch):
    original = Scheduler.add

    def add(self, req, now):
        ok = original(self, req, now)
        if ok:
            self._requeue.append(req)   # also in the re-queue list: queued twice
        return ok
    monkeypatch.setattr(Scheduler, "add", add)


CORRUPTIONS = {
    "kv_conservation": _leak_one_block,
    "kv_leak": _keep_holding,
    "kv_exact_blocks": lambda mp: _wrap_schedule(mp, _extra_block),
    "token_budget": lambda mp: _wrap_schedule(mp, _over_budget),
    "waiting_xor_running": lambda mp: _wrap_commit(mp, _queue_running),
    "finished_complete": lambda mp: _wrap_commit(mp, _overshoot),
    "monotone_timestamps": lambda mp: _wrap_commit(mp, _time_travel),
    "nothing_lost": _drop_waiting,
    "unique_waiting": _queue_twice,
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_corrupted_state_is_caught_with_the_invariant_name(monkeypatch, name):
    CORRUPTIONS[name](monkeypatch)
    with pytest.raises(InvariantError) as info:
        simsched.simulate(small_config(), requests=REQUESTS)
    err = info.value
    assert err.invariant == name
    assert f"'{name}'" in str(err) and "t=" in str(err)
    assert err.at >= 0
    if name not in ("kv_conservation", "token_budget"):
        assert err.request_id is not None and f"request {err.request_id}" in str(err)


def test_corruption_goes_unnoticed_without_checking(monkeypatch):
    _wrap_commit(monkeypatch, _overshoot)
    res = simsched.simulate(small_config(check_invariants=False), requests=REQUESTS)
    assert (res.requests["num_generated_tokens"] > res.requests["num_output_tokens"]).any()


# --------------------------------------------------------------------------- determinism
def _frames(res):
    return res.requests, res.iterations, res.preemptions


@pytest.mark.parametrize("cost_model", ["calibrated", "linear"])
def test_same_config_and_seed_give_identical_frames(cost_model):
    cfg = SimConfig(workload=WorkloadConfig(num_requests=150, rate=60.0, num_priorities=2),
                    scheduler=SchedulerConfig(policy="priority", preemption=True),
                    cache=CacheConfig(num_blocks=100), seed=7).replace(cost_model=cost_model)
    first, second = simsched.simulate(cfg), simsched.simulate(cfg)
    for a, b in zip(_frames(first), _frames(second)):
        pd.testing.assert_frame_equal(a, b)
    assert first.summary() == pytest.approx(second.summary(), nan_ok=True)
    assert len(first.preemptions) > 0  # the run exercised preemption
    other = simsched.simulate(cfg.replace(seed=8))
    assert not np.array_equal(first.requests["arrival_at"], other.requests["arrival_at"])


# --------------------------------------------------------------------------- overload
def test_overload_stops_at_the_time_limit_and_reports_the_backlog():
    n = 3000
    cfg = SimConfig(workload=WorkloadConfig(num_requests=n, rate=2000.0),
                    hardware=HardwareConfig(cost_model="linear"), max_sim_time=3.0)
    res = simsched.simulate(cfg)
    df, s = res.requests, res.summary()
    assert res.sim_time == 3.0
    assert len(df) == n
    counts = df["status"].value_counts()
    assert counts.get("waiting", 0) > 0 and counts.get("running", 0) > 0
    assert res.info["num_waiting_at_end"] == counts["waiting"]
    assert res.info["num_running_at_end"] == counts["running"]
    assert s["num_unfinished"] == n - s["num_finished"] - s["num_rejected"]
    assert s["num_unfinished"] >= counts["waiting"] + counts["running"]
    # Bounded memory: one row per request and per iteration, the queue never above n.
    assert res.iterations["num_waiting"].max() <= n
    assert (res.iterations["kv_blocks_used"] <= res.info["num_blocks"]).all()
    assert res.iterations["started_at"].max() < 3.0
    running = df[df["status"] == "running"]
    assert (running["num_generated_tokens"] < running["num_output_tokens"]).all()
    waiting = df[df["status"] == "waiting"]
    assert waiting["finished_at"].isna().all()


def test_overload_with_invariants_keeps_every_request_accounted():
    reqs = [(i / 512, 20 + i % 40, 5 + i % 30) for i in range(400)]
    res, engine = simulate_checked(small_config(max_sim_time=40.0, preemption=True), reqs)
    statuses = set(res.requests["status"])
    assert statuses <= {"finished", "waiting", "running", "pending"}
    assert "waiting" in statuses
    assert engine.kv.num_used == sum(engine.kv.holders().values())


def test_nothing_schedulable_ends_the_run():
    # Every request is larger than the cache: all rejected at arrival, no iteration, no hang.
    reqs = [(float(i), 300, 10) for i in range(5)]
    res, engine = simulate_checked(small_config(), reqs)
    assert (res.requests["status"] == "rejected").all()
    assert len(res.iterations) == 0
    assert res.sim_time == 4.0
    assert res.summary()["num_rejected"] == 5


# --------------------------------------------------------------------------- impossible requests
def test_impossible_requests_are_rejected_with_a_reason():
    cfg = small_config(cost_model="unit", max_model_len=200, num_blocks=40)
    reqs = [(0.0, 10, 5),
            (0.0, 150, 100),      # 250 tokens > max_model_len 200
            (0.1, 170, 20),       # 190 tokens <= 200, but 47 blocks > the cache's 40
            (0.2, 12, 4)]
    res, _ = simulate_checked(cfg, reqs)
    df = res.requests.set_index("request_id")
    assert list(df["status"]) == ["finished", "rejected", "rejected", "finished"]
    assert "max_model_len" in df.loc[1, "reject_reason"]
    assert "KV blocks" in df.loc[2, "reject_reason"]
    assert df.loc[[0, 3], "reject_reason"].eq("").all()
    assert df.loc[[1, 2], "first_scheduled_at"].isna().all()
    assert res.summary()["num_rejected"] == 2 and res.summary()["num_finished"] == 2


def test_model_context_rejects_without_explicit_limit():
    cfg = SimConfig(hardware=HardwareConfig(cost_model="unit"))
    res = simsched.simulate(cfg, requests=[(0.0, 4000, 200), (0.0, 100, 10)])
    assert list(res.requests["status"]) == ["rejected", "finished"]
    assert "4096" in res.requests.loc[0, "reject_reason"]


def test_request_exactly_filling_the_cache_runs():
    # 4-token blocks, 10 blocks: 40 cached tokens; the last output token's KV is never written.
    cfg = small_config(num_blocks=10, max_num_batched_tokens=64)
    res, _ = simulate_checked(cfg, [(0.0, 30, 11), (0.0, 30, 12)])
    assert list(res.requests["status"]) == ["finished", "rejected"]


# --------------------------------------------------------------------------- livelock
def _thrash_requests(n: int = 24, seed: int = 0) -> list[tuple]:
    rng = np.random.default_rng(seed)
    return [(i / 64, int(rng.integers(8, 40)), int(rng.integers(20, 60)),
             int(rng.integers(0, 3))) for i in range(n)]


@pytest.mark.parametrize("victim, cap", [(v, c) for v in sorted(VICTIM_POLICIES) for c in (0, 2)])
def test_heavy_memory_pressure_always_makes_progress(monkeypatch, victim, cap):
    """Every admitted request finishes; the cap strictly bounds admission preemptions, and a
    request at the cap is chosen as a victim only when every running request is at the cap."""
    policy = "priority"
    original = Scheduler._preempt
    events = []

    def preempt(self, victim_req, reason, by, **kwargs):
        capped = victim_req.num_preemptions >= cap
        all_capped = all(r.num_preemptions >= cap for r in self.running.values())
        events.append((reason, capped, all_capped))
        original(self, victim_req, reason, by, **kwargs)
    monkeypatch.setattr(Scheduler, "_preempt", preempt)
    cfg = small_config(policy=policy, victim_policy=victim, preemption=True,
                       max_num_preemptions=cap, num_blocks=24, max_num_seqs=12,
                       max_num_batched_tokens=48, max_sim_time=3000.0)  # ~300 needed
    res, _ = simulate_checked(cfg, _thrash_requests())
    assert (res.requests["status"] == "finished").all()
    assert len(events) > 10, "the workload must actually thrash"
    assert not any(reason == "admission" and capped for reason, capped, _ in events)
    assert all(all_capped for _, capped, all_capped in events if capped)
    per_request = res.preemptions.groupby("request_id")["reason"]
    admissions = per_request.apply(lambda r: int((r == "admission").sum()))
    assert (admissions <= cap).all()
    assert res.requests["num_preemptions"].sum() == len(events) == len(res.preemptions)


def test_largest_kv_victim_does_not_livelock():
    """largest_kv always evicts the most advanced request; once every running request is at the
    cap the newest is evicted instead, so the oldest finishes and the run progresses."""
    cfg = small_config(policy="priority", victim_policy="largest_kv", preemption=True,
                       max_num_preemptions=0, num_blocks=24, max_num_seqs=12,
                       max_num_batched_tokens=48, max_sim_time=3000.0)
    res, _ = simulate_checked(cfg, _thrash_requests())
    assert (res.requests["status"] == "finished").all()


# --------------------------------------------------------------------------- arrivals
def test_request_never_starts_before_it_arrives():
    # env.now + (arrival_at - env.now) can round one ulp below arrival_at; the engine then
    # records the arrival at env.now, so queue time is never negative.
    res = simsched.simulate(SimConfig(hardware=HardwareConfig(cost_model="unit")),
                            requests=[(1.4945232759918547, 10, 1), (6.370537609705518, 10, 1)])
    assert (res.requests["queue_time"] >= 0).all()



def test_watermark_never_blocks_a_request_that_fits_an_empty_engine():
    # Fuzz case 1063: static batching reserves a whole prompt's blocks; with a 17 % watermark a
    # 279-token prompt fitted the 332-block cache but never the admissible 275, so nothing ran.
    cfg = SimConfig(check_invariants=True).replace(
        style="static", policy="spf_aging", preemption=True, max_num_batched_tokens=56,
        max_num_seqs=6, max_num_preemptions=4, block_size=1, num_blocks=332,
        watermark=0.17463681621228092, cost_model="linear")
    requests = [(1.6689453125, 155, 1, 2), (1.6689453125, 1, 4, 0), (1.6689453125, 279, 1, 1),
                (1.6689453125, 41, 84, 2), (1.6689453125, 15, 78, 0)]
    res = simsched.simulate(cfg, requests=requests)
    assert (res.requests["status"] == "finished").all()
