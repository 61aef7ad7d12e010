"""Async scheduling (vLLM V1's one-step pipeline, ``scheduler.async_scheduling``) and the
client-side output delay of the ``vllm_v1`` engine profile.

The pipeline's arrival rule is what an asynchronous replica applies with ``plan_ahead=False``,
the ``classic`` preset (the default before issue 40, when the default plans ahead instead): the
tests of that rule pin the preset (``CLASSIC``).
"""

from __future__ import annotations

import numpy as np
import pytest

import simsched
from simsched import SimConfig, UnitCostModel
from simsched.analysis.runner import RejectionWarning
from simsched.api import simulate_checked
from simsched.config import pipeline
from simsched.cost import overhead
from simsched.cost.factory import make_cost_model


CLASSIC = SimConfig.preset("classic")


class DelayedUnit(UnitCostModel):
    """Unit iterations whose tokens reach the client ``output_delay`` after the step ends."""

    def __init__(self, output_delay: float) -> None:
        super().__init__(1.0)
        self.output_delay = output_delay


def first_tokens(requests, asynchronous: bool, cost=None) -> list[float]:
    cfg = CLASSIC.replace(async_scheduling=asynchronous, num_blocks=200)
    res = simsched.simulate(cfg, requests=requests, cost_model=cost or UnitCostModel())
    return res.requests.sort_values("request_id").first_token_at.tolist()


def test_an_arrival_during_step_k_joins_step_k_plus_2():
    # Unit steps: A (t = 0) prefills in [0, 1). B arrives during that step, C exactly as the
    # next starts. Without async scheduling both join the step at t = 1 (first token at 2);
    # with it, that step was planned at t = 0: they join the step at t = 2 (first token at 3).
    reqs = [(0.0, 16, 10), (0.5, 16, 10), (1.0, 16, 10)]
    assert first_tokens(reqs, False) == [1.0, 2.0, 2.0]
    assert first_tokens(reqs, True) == [1.0, 3.0, 3.0]


def test_an_idle_engine_plans_at_once_and_an_empty_plan_is_replaced():
    # A lone arrival at an idle engine runs at once. A finishes with the step at [0, 1), so
    # the step planned for t = 1 is empty: the engine plans again at t = 1 and sees B.
    assert first_tokens([(0.0, 16, 10)], True) == [1.0]
    assert first_tokens([(0.0, 16, 1), (0.5, 16, 10)], True) == [1.0, 2.0]
    # Later arrivals at an idle engine (after A is done) also start at once.
    assert first_tokens([(0.0, 16, 1), (5.25, 16, 3)], True) == [1.0, 6.25]


def async_on(cfg, cost=None) -> bool:
    return overhead.async_scheduling(cfg, cost or make_cost_model(cfg.hardware))


def test_the_default_plans_ahead_where_classic_applies_the_arrival_rule():
    # vllm_v1, the default engine profile, schedules asynchronously: by default the replica
    # plans ahead (vLLM's AsyncScheduler decisions), so the arrival rule is off (one model).
    cfg = SimConfig()
    model = make_cost_model(cfg.hardware)
    assert async_on(cfg) and pipeline.plan_ahead(cfg, model)
    assert not pipeline.arrival_rule(cfg, model)
    assert pipeline.arrival_rule(CLASSIC, model) and not pipeline.plan_ahead(CLASSIC, model)
    measured = cfg.replace(engine_overhead="measured_2023")
    model = make_cost_model(measured.hardware)
    assert not pipeline.plan_ahead(measured, model) and not pipeline.arrival_rule(measured, model)


def test_on_with_the_vllm_v1_profile_unless_asked_otherwise():
    cfg = CLASSIC                                   # vllm_v1 is the default engine profile
    assert async_on(cfg)
    assert not async_on(cfg.replace(async_scheduling=False))
    assert not async_on(cfg.replace(engine_overhead="measured_2023"))
    assert not async_on(cfg.replace(cost_model="unit"))
    assert async_on(cfg.replace(engine_overhead="measured_2023", async_scheduling=True))


def test_it_follows_the_cost_model_that_runs():
    # A cost model given to simulate replaces the config's, engine profile included: a unit
    # model schedules synchronously under a vllm_v1 config (as its zero output delay says), a
    # vllm_v1 model asynchronously under a measured_2023 config.
    v1 = CLASSIC.replace(engine_overhead="vllm_v1", num_blocks=200)
    assert not async_on(v1, UnitCostModel())
    assert async_on(v1.replace(engine_overhead="measured_2023"), make_cost_model(v1.hardware))
    reqs = [(0.0, 16, 10), (0.5, 16, 10), (1.0, 16, 10)]
    first = simsched.simulate(v1, requests=reqs, cost_model=UnitCostModel()).requests
    assert first.first_token_at.tolist() == [1.0, 2.0, 2.0]   # see test_an_arrival_during...


def test_queue_cap_and_waiting_counts_include_arrivals_no_plan_has_seen():
    # A burst at t = 0 waits in the replicas' pending lists until a plan sees it: the queue
    # cap (3 per replica) must count those requests, or it would never shed.
    burst = [(0.0, 400, 50)] * 30
    cfg = CLASSIC.replace(check_invariants=True, 
        async_scheduling=True, num_replicas=2, router="round_robin", max_num_seqs=2,
        max_num_batched_tokens=512, max_num_queued_per_replica=3)
    with pytest.warns(RejectionWarning, match="shed: replica"):
        res, _ = simulate_checked(cfg, requests=burst)
    df = res.requests
    shed = df["reject_reason"].str.startswith("shed: replica")
    assert shed.sum() == 30 - 2 * 3 and (df.loc[~shed, "status"] == "finished").all()
    assert (res.iterations["num_waiting"] <= 3).all()
    # Cut off mid-step: the request that arrived during the step in flight is waiting, and
    # counted as such.
    cut = simsched.simulate(CLASSIC.replace(async_scheduling=True, max_sim_time=0.75,
                                                num_blocks=200),
                            requests=[(0.0, 16, 10), (0.5, 16, 10)], cost_model=UnitCostModel())
    assert cut.requests["status"].tolist() == ["running", "waiting"]
    assert cut.info["num_waiting_at_end"] == 1


def test_invariants_hold_under_load_with_prefix_sharing_and_rejections():
    rng = np.random.default_rng(4)
    n = 300
    reqs = [{"arrival_at": float(t), "num_prompt_tokens": int(p), "num_output_tokens": int(o),
             "prefix_group": int(g), "prefix_len": 64}
            for t, p, o, g in zip(np.cumsum(rng.exponential(0.03, n)),
                                  rng.integers(80, 400, n), rng.integers(1, 60, n),
                                  rng.integers(0, 4, n))]
    reqs[7]["num_prompt_tokens"] = 5000          # beyond max_model_len: rejected on arrival
    cfg = CLASSIC.replace(async_scheduling=True, enable_prefix_caching=True, num_blocks=120,
                              max_num_seqs=16, max_num_batched_tokens=256, max_model_len=4096)
    with pytest.warns(RejectionWarning):
        res, engine = simulate_checked(cfg, requests=reqs)
    df = res.requests
    assert (df.status == "finished").sum() == n - 1
    assert df.set_index("request_id").loc[7, "reject_reason"].startswith("prompt + output")
    assert df.num_preemptions.sum() > 0 and not engine.replicas[0].pending
    with pytest.warns(RejectionWarning):
        sync = simsched.simulate(cfg.replace(async_scheduling=False), requests=reqs)
    assert df.ttft.mean() > sync.requests.ttft.mean()     # the pipeline delays admissions


def test_output_delay_shifts_client_times_and_keeps_the_engine_ones():
    reqs = [(0.0, 16, 4), (0.5, 16, 3)]
    cfg = CLASSIC.replace(num_blocks=200)
    plain = simsched.simulate(cfg, requests=reqs, cost_model=UnitCostModel()).requests
    res = simsched.simulate(cfg, requests=reqs, cost_model=DelayedUnit(0.25))
    df = res.requests
    assert "engine_first_token_at" not in plain
    np.testing.assert_array_equal(df.engine_first_token_at, plain.first_token_at)
    np.testing.assert_array_equal(df.engine_finished_at, plain.finished_at)
    np.testing.assert_array_equal(df.first_token_at, plain.first_token_at + 0.25)
    np.testing.assert_array_equal(df.ttft, plain.ttft + 0.25)
    np.testing.assert_array_equal(df.e2el, plain.e2el + 0.25)
    np.testing.assert_array_equal(df.tpot, plain.tpot)          # gaps do not move
    assert res.summary()["itl_p50"] == simsched.simulate(
        cfg, requests=reqs, cost_model=UnitCostModel()).summary()["itl_p50"]


def test_vllm_v1_profile_turns_both_on():
    cfg = CLASSIC.replace(gpu="h100-sxm", engine_overhead="vllm_v1", num_requests=40,
                              rate=4.0, seed=2)
    res, engine = simulate_checked(cfg)
    delay = engine.replicas[0].cost_model.output_delay
    assert engine.replicas[0].async_scheduling and 1e-3 < delay < 0.05
    df = res.requests
    np.testing.assert_allclose(df.first_token_at - df.engine_first_token_at, delay)


def test_plan_ahead_and_the_arrival_rule_are_one_model_not_two():
    # plan_ahead decides what each plan sees; the replica's arrival rule must not delay again.
    with pytest.raises(ValueError, match="plan_ahead and scheduler.async_scheduling"):
        CLASSIC.replace(plan_ahead=True, async_scheduling=True)
    from simsched.cost.factory import make_cost_model

    cfg = CLASSIC.replace(engine_overhead="vllm_v1", plan_ahead=True)
    model = make_cost_model(cfg.hardware)
    assert not overhead.async_scheduling(cfg, model)
    assert overhead.async_scheduling(CLASSIC.replace(engine_overhead="vllm_v1"), model)
