"""Replica failures (simsched.cluster.failures) against hand-built cases: a failure loses exactly
the requests on that replica at that instant, its KV and prefix cache, and it comes back."""

import pytest

from simsched import SimConfig
from simsched.analysis.runner import run
from simsched.config.faults import FaultsConfig
from simsched.cost.base import UnitCostModel
from simsched.engine.invariants import check_final_state
from simsched.engine.result_checks import check_results

STEP = 0.01
BASE = SimConfig().replace(num_replicas=2, router="round_robin", max_num_seqs=2,
                           max_num_batched_tokens=256, num_blocks=64, check_invariants=True,
                           seed=5)
# Round robin: even ids to replica 0, odd ids to replica 1; two slots each, so some wait.
ROWS = [(0.05 * i, 64, 40) for i in range(30)]


def _run(rows=ROWS, config=BASE, **faults):
    res, engine = run(config.replace(faults=FaultsConfig(**faults)), rows,
                      cost_model=UnitCostModel(STEP), keep_engine=True)
    check_results(res)
    check_final_state(engine)
    return res, engine


def test_a_failure_loses_exactly_the_requests_on_that_replica_at_that_instant():
    plain, _ = _run()
    at = 0.5
    on_1 = plain.requests[plain.requests["replica"] == 1]
    # On replica 1 at the failure: arrived by then, not finished by then.
    expected = set(on_1.loc[(on_1["arrival_at"] <= at) & (on_1["finished_at"] > at),
                            "request_id"])
    assert expected
    res, _ = _run(replica_failures=((at, 1),), restart_time=0.3, model_load_time=0.2)
    att = res.attempts
    failed = att[att["outcome"] == "failed"]
    assert set(failed["attempt_id"]) == expected
    assert (failed["ended_at"] == at).all() and (failed["replica"] == 1).all()
    assert failed["reject_reason"].str.startswith("failed: replica 1 failed at t=0.5").all()
    # Nothing is routed to replica 1 while it is down (0.5 to 1.0), and it serves again after.
    down = att[(att["sent_at"] > at) & (att["sent_at"] < at + 0.5)]
    assert len(down) and (down["replica"] == 0).all()
    assert ((att["sent_at"] >= at + 0.5) & (att["replica"] == 1)).any()
    row = res.failures.iloc[0]
    assert (row["replica"], row["failed_at"], row["back_at"]) == (1, at, pytest.approx(1.0))
    assert row["num_failed_requests"] == len(expected)
    # The lost work: the KV each failed request had computed, none of it recomputed.
    assert failed["num_aborted_kv_tokens"].sum() > 0
    assert (res.requests.set_index("request_id").loc[sorted(expected), "status"]
            == "failed").all()


def test_failed_requests_are_retried_elsewhere():
    res, _ = _run(replica_failures=((0.5, 1),), restart_time=0.3, model_load_time=0.2,
                  max_num_attempts=2, backoff_base_time=0.05)
    retried = res.attempts[res.attempts["attempt"] == 2]
    assert len(retried) and (retried["replica"] == 0).all()      # the only one up at 0.55
    assert (res.requests["status"] == "finished").all()
    lost = res.attempts[res.attempts["outcome"] == "failed"]
    assert set(retried["request_id"]) == set(lost["request_id"])


def test_the_prefix_cache_is_lost_with_the_replica():
    cfg = BASE.replace(num_replicas=1, enable_prefix_caching=True, max_num_seqs=4)
    rows = [{"arrival_at": t, "num_prompt_tokens": 256, "num_output_tokens": 4,
             "prefix_group": 0, "prefix_len": 192} for t in (0.0, 0.3, 0.8)]
    res, engine = _run(rows, cfg, replica_failures=((0.5, 0),), restart_time=0.1,
                       model_load_time=0.1)
    cached = res.requests.set_index("request_id")["num_cached_tokens"]
    assert cached[1] == 192            # the shared prefix was cached before the failure
    assert cached[2] == 0              # and gone after the restart
    assert engine.replicas[0].kv.num_free == engine.replicas[0].kv.num_blocks


@pytest.mark.parametrize("bill_while_down", [True, False])
def test_billing_while_down_or_not(bill_while_down):
    res, _ = _run(replica_failures=((0.5, 1),), restart_time=0.3, model_load_time=0.2,
                  bill_while_down=bill_while_down)
    units = res.fleet.units
    assert len(units) == 3 and units["replica"].tolist() == [0, 1, 1]
    second = units.iloc[2]
    assert second["requested_at"] == (0.5 if bill_while_down else pytest.approx(0.8))
    assert second["routable_at"] == pytest.approx(1.0)
    down_billed = 0.5 if bill_while_down else 0.2
    assert units.loc[units["replica"] == 1, "billed_time"].sum() == pytest.approx(
        res.sim_time - (0.5 - down_billed))


def test_with_every_replica_down_requests_fail_at_once():
    cfg = BASE.replace(num_replicas=1)
    res, _ = _run([(0.0, 64, 5), (0.3, 64, 5), (0.9, 64, 5)], cfg,
                  replica_failures=((0.2, 0),), restart_time=0.5, model_load_time=0.1)
    status = res.requests.set_index("request_id")["status"]
    assert status.tolist() == ["finished", "failed", "finished"]
    assert res.attempts.set_index("attempt_id").loc[1, "reject_reason"].startswith(
        "failed: no replica up")


def test_drawn_failures_are_seeded():
    kwargs = dict(mtbf=0.6, restart_time=("exponential", 0.2), model_load_time=0.05,
                  max_num_attempts=3, backoff_base_time=0.05)
    a, _ = _run(**kwargs)
    b, _ = _run(**kwargs)
    assert len(a.failures) > 0 and a.failures.equals(b.failures)
    assert a.attempts.equals(b.attempts)


@pytest.mark.parametrize("on_failure", ["stop", "continue"])
def test_a_session_stops_or_continues_after_a_failed_turn(on_failure):
    cfg = BASE.replace(num_replicas=1)
    table = [{"arrival_at": 0.0, "session_id": 0, "think_time": 0.0, "num_prompt_tokens": 32,
              "num_output_tokens": 5},
             {"arrival_at": 0.0, "session_id": 0, "think_time": 0.1, "num_prompt_tokens": 64,
              "num_output_tokens": 50},
             {"arrival_at": 0.0, "session_id": 0, "think_time": 0.3, "num_prompt_tokens": 160,
              "num_output_tokens": 5}]
    res, _ = _run(table, cfg, replica_failures=((0.3, 0),), restart_time=0.1,
                  model_load_time=0.1, session_on_failure=on_failure)
    status = res.requests["status"].tolist()
    if on_failure == "stop":
        assert status == ["finished", "failed"]
    else:
        assert status == ["finished", "failed", "finished"]
        assert res.requests["arrival_at"].iloc[2] == pytest.approx(0.6)
