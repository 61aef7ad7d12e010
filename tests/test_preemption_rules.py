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
