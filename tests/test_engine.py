"""The SimPy engine end to end: interrupts, completion, timestamps, metrics, determinism."""

import numpy as np
import pandas as pd
import pytest
import simpy

import simsched
from simsched import SimConfig, UnitCostModel
from simsched.api import make_requests
from simsched.cluster.cluster import Cluster
from simsched.request import PreemptionCause


def pressured_config(**changes):
    """A small KV cache under load: preemptions are certain."""
    return SimConfig(check_invariants=True).replace(
        num_blocks=40, max_num_seqs=8, max_num_batched_tokens=256, rate=40.0, num_requests=150,
        cost_model="linear", **changes)


def test_preempted_process_receives_interrupt_with_cause_and_finishes():
    cfg = pressured_config(policy="spf", preemption=True)
    reqs = make_requests(simsched.workloads.workload.generate(cfg.workload, np.random.default_rng(0)))
    engine = Cluster(cfg, reqs, simsched.LinearCostModel(), num_blocks=40)
    engine.run()
    victims = [r for r in reqs if r.causes]
    assert victims, "the scenario must preempt"
    for req in victims:
        assert all(isinstance(c, PreemptionCause) and c.request_id == req.id for c in req.causes)
        assert len(req.causes) == req.num_preemptions
        assert {c.reason for c in req.causes} <= {"kv_full", "admission"}
        assert all(req.arrival_at <= c.at <= req.finished_at for c in req.causes)
        assert req.status.value == "finished" and req.num_generated == req.num_output_tokens
    reasons = {c.reason for r in victims for c in r.causes}
    assert "admission" in reasons
    assert sum(c.num_lost_tokens for r in victims for c in r.causes) == \
        sum(r.num_recomputed_tokens for r in reqs)


def test_request_processes_end_like_simpy_processes_without_an_event_nobody_needs():
    """A request's process (``RequestProcess``) takes interrupts as SimPy's do; its end makes
    no event unless a process waits for it, and one that waits is resumed with its value."""
    from simsched.engine.simpy_fast import RequestProcess
    env = simpy.Environment()
    seen = []

    def life(wait):
        try:
            yield env.timeout(wait)
        except simpy.Interrupt as interrupt:
            seen.append(("interrupted", env.now, interrupt.cause))
            yield env.timeout(1.0)
        return env.now

    alone = RequestProcess(env, life(5.0))
    waited = RequestProcess(env, life(2.0))

    def waiter():
        seen.append(("joined", (yield waited)))

    def interrupter():
        yield env.timeout(0.5)
        alone.interrupt("kv_full")

    env.process(waiter())
    env.process(interrupter())
    scheduled, schedule = [], env.schedule

    def noting_schedule(event, priority=1, delay=0):
        scheduled.append(event)
        schedule(event, priority, delay)

    env.schedule = noting_schedule
    env.run()
    assert seen == [("interrupted", 0.5, "kv_full"), ("joined", 2.0)]
    assert alone.processed and alone.ok and alone.value == 1.5
    assert waited.processed and waited.value == 2.0
    assert alone not in scheduled and waited in scheduled   # only the waited-for end is an event


def test_every_request_finishes_once_with_ordered_timestamps():
    res = simsched.simulate(pressured_config())
    df = res.requests
    assert df["request_id"].is_unique and len(df) == 150
    assert (df["status"] == "finished").all()
    assert (df["num_generated_tokens"] == df["num_output_tokens"]).all()
    assert (df["arrival_at"] <= df["first_scheduled_at"]).all()
    assert (df["first_scheduled_at"] <= df["first_token_at"]).all()
    assert (df["first_token_at"] <= df["finished_at"]).all()
    assert res.summary()["num_preemptions"] == df["num_preemptions"].sum() > 0
    assert len(res.preemptions) == df["num_preemptions"].sum()


def test_unit_cost_single_request_timeline():
    res = simsched.simulate(SimConfig(), requests=[(0.0, 10, 5)], cost_model=UnitCostModel())
    row = res.requests.iloc[0]
    # prefill iteration [0, 1) emits token 1; decodes emit tokens 2..5 at t = 2..5
    assert row["ttft"] == 1.0 and row["e2el"] == 5.0 and row["tpot"] == 1.0
    assert list(res.itl_samples()) == [1.0, 1.0, 1.0, 1.0]
    assert len(res.iterations) == 5
    assert list(res.iterations["num_decode_tokens"]) == [0, 1, 1, 1, 1]


def test_pooled_itl_samples_are_consistent_with_request_timestamps():
    res = simsched.simulate(pressured_config(policy="spf", preemption=True))
    df = res.requests
    samples = res.itl_samples()
    assert len(samples) == (df["num_output_tokens"] - 1).sum()
    assert samples.sum() == pytest.approx((df["finished_at"] - df["first_token_at"]).sum())
    assert (samples > 0).all()
    # a stalled (preempted after its first token) request shows the stall as its largest gap
    stalled = df[(df["num_preemptions"] > 0) & (df["num_output_tokens"] > 1)]
    assert (stalled["itl_max"] >= stalled["tpot"]).all()
    assert res.summary()["itl_p99"] <= samples.max()
    # One percentile rule everywhere: numpy's default (linear), as vLLM's export uses.
    assert res.summary()["itl_p99"] == np.percentile(samples, 99)


def test_same_seed_identical_frames_different_seed_different_arrivals():
    cfg = pressured_config()
    a, b = simsched.simulate(cfg), simsched.simulate(cfg)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.iterations, b.iterations)
    c = simsched.simulate(cfg.replace(seed=1))
    assert not np.array_equal(a.requests["arrival_at"], c.requests["arrival_at"])


def test_one_output_token_request_finishes_at_prefill():
    res = simsched.simulate(SimConfig(), requests=[(0.0, 7, 1), (0.5, 3, 1)],
                            cost_model=UnitCostModel(0.25))
    df = res.requests
    assert (df["ttft"] == df["e2el"]).all() and df["tpot"].isna().all()
    assert res.iterations["started_at"].tolist() == [0.0, 0.5]   # GPU idles between arrivals


def test_max_sim_time_stops_an_overloaded_run():
    cfg = SimConfig(max_sim_time=2.0).replace(rate=500.0, num_requests=3000, max_num_seqs=4,
                                              max_num_batched_tokens=64)
    res = simsched.simulate(cfg)
    s = res.summary()
    assert res.sim_time == 2.0
    assert s["num_unfinished"] > 0 and res.info["num_waiting_at_end"] > 0
    assert set(res.requests["status"]) <= {"finished", "waiting", "running", "pending"}


def test_releasing_requests_while_building_frames_changes_nothing():
    # Without check_invariants the request objects are dropped chunk by chunk as the frame is
    # built (memory of big runs); the frames must equal those of a run that keeps them.
    cfg = pressured_config(policy="spf", preemption=True)
    kept = simsched.simulate(cfg)
    released = simsched.simulate(cfg.replace(check_invariants=False))
    pd.testing.assert_frame_equal(kept.requests, released.requests)
    pd.testing.assert_frame_equal(kept.iterations, released.iterations)
    pd.testing.assert_frame_equal(kept.preemptions, released.preemptions)
    np.testing.assert_array_equal(kept.itl_samples(), released.itl_samples())


def test_frames_do_not_depend_on_the_extraction_chunk_size(monkeypatch):
    import simsched.analysis.frames as frames
    import simsched.cluster.records as records
    from simsched.analysis import runner

    cfg = pressured_config(policy="spf", preemption=True, check_invariants=False)
    # Request objects kept to the end (keep_engine): recorded in chunks when the frame is built.
    whole, _ = runner.run(cfg, keep_engine=True)
    monkeypatch.setattr(records, "_RECORD_CHUNK", 7)     # many chunks, a ragged last one
    monkeypatch.setattr(frames, "_CHUNK", 5)
    chunked, _ = runner.run(cfg, keep_engine=True)
    lazy = simsched.simulate(cfg)                       # recorded as they end, same records
    for other in (chunked, lazy):
        pd.testing.assert_frame_equal(whole.requests, other.requests)
        pd.testing.assert_frame_equal(whole.preemptions, other.preemptions)
        np.testing.assert_array_equal(whole.itl_samples(), other.itl_samples())
    assert whole.summary()["num_preemptions"] > 0


def test_batch_from_sequences_splits_prefills_and_decodes():
    from simsched import Batch

    batch = Batch.from_sequences([(100, 0), (1, 50), (1, 30), (20, 40)])
    assert batch.prefill_new_tokens == [100, 20] and batch.prefill_cached_tokens == [0, 40]
    assert (batch.num_decode_seqs, batch.decode_context_sum) == (2, 80)
    assert batch.num_tokens == 122 and batch.num_seqs == 4
    with pytest.raises(ValueError, match="bad sequence"):
        Batch.from_sequences([(0, 5)])
