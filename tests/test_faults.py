"""Client deadlines, cancellations and retries (simsched.config.faults, simsched.cluster.retries)
against hand-built cases: exact abort instants, exact blocks freed, exact backoff schedules."""

import numpy as np
import pytest

import simsched
from simsched import SimConfig
from simsched.analysis.runner import run
from simsched.api import make_requests
from simsched.cluster.cluster import Cluster
from simsched.cluster.retries import FAULT_STREAM
from simsched.config.faults import FaultsConfig
from simsched.cost.base import UnitCostModel
from simsched.engine.invariants import check_final_state
from simsched.engine.result_checks import check_results
from simsched.request import Status

STEP = 0.01
BASE = SimConfig().replace(max_num_seqs=1, max_num_batched_tokens=256, num_blocks=64,
                           check_invariants=True, seed=3)


def _run(rows, **faults):
    cfg = BASE.replace(faults=FaultsConfig(**faults))
    res, engine = run(cfg, rows, cost_model=UnitCostModel(STEP), keep_engine=True)
    check_results(res)
    check_final_state(engine)
    return res, engine


def test_ttft_timeout_aborts_a_waiting_request_at_its_deadline():
    # One sequence slot: request 1 waits behind request 0 (100 output tokens, about 1 s).
    res, _ = _run([(0.0, 64, 100), (0.0, 64, 10)], ttft_timeout=0.5)
    att = res.attempts.set_index("attempt_id")
    assert att.loc[0, "outcome"] == "finished"
    assert att.loc[1, "outcome"] == "timed_out"
    assert att.loc[1, "ended_at"] == 0.5                    # exactly the deadline
    assert att.loc[1, "num_aborted_kv_tokens"] == 0         # it never held KV
    assert res.requests.set_index("request_id").loc[1, "status"] == "timed_out"
    assert res.requests["num_attempts"].tolist() == [1, 1]


def test_request_timeout_frees_exactly_the_requests_blocks_at_the_deadline():
    cfg = BASE.replace(faults=FaultsConfig(request_timeout=0.755))
    requests = make_requests([(0.0, 64, 100)])
    engine = Cluster(cfg, requests, UnitCostModel(STEP), 64)
    replica = engine.replicas[0]
    seen = []
    abort = replica.abort

    def watched(req):
        held, free = replica.kv.num_held(req.id), replica.kv.num_free
        generated = replica.scheduler.num_generated(req)
        work = abort(req)
        seen.append((engine.env.now, held, free, replica.kv.num_free, generated, work))
        return work

    replica.abort = watched
    engine.run()
    (at, held, free_before, free_after, generated, work), = seen
    assert at == 0.755
    assert held > 0 and free_after - free_before == held == 64 - free_before
    assert free_after == 64
    req = requests[0]
    assert req.status is Status.TIMED_OUT and req.num_generated == generated < 100
    # The KV it held (prompt + decode steps) plus the decode step in flight, all wasted.
    assert work.num_kv_tokens == 64 + (generated - 1) + 1
    assert work.num_decode_tokens == generated and work.num_prefill_tokens == 64


def test_cancellations_abort_at_the_drawn_time_and_are_not_retried():
    res, _ = _run([(0.0, 64, 100), (0.2, 64, 100)], cancel_fraction=1.0, cancel_time=0.3,
                  max_num_attempts=3)
    att = res.attempts.set_index("attempt_id")
    assert att["outcome"].tolist() == ["cancelled", "cancelled"]
    assert att.loc[0, "ended_at"] == 0.3 and att.loc[1, "ended_at"] == 0.2 + 0.3
    assert (res.requests["num_attempts"] == 1).all()
    # Both were decoding (request 1 took the slot request 0's cancellation freed at 0.3).
    assert (att["num_wasted_decode_tokens"] > 0).all()
    assert (att["num_wasted_prefill_tokens"] == 64).all()


def test_retries_follow_the_backoff_schedule_exactly():
    # Request 0 holds the only slot for ~3 s; request 1 times out again and again.
    faults = dict(ttft_timeout=0.25, max_num_attempts=4, backoff_base_time=0.1,
                  backoff_multiplier=3.0, backoff_max_time=0.5, backoff_jitter=0.5)
    res, _ = _run([(0.0, 64, 300), (0.0, 64, 5)], **faults)
    cfg = FaultsConfig(**faults)
    rng = np.random.default_rng(np.random.SeedSequence(BASE.seed, spawn_key=(FAULT_STREAM,)))
    sent, expected = 0.0, []
    for k in range(1, 5):
        expected.append(sent)
        end = sent + 0.25
        sent = end + cfg.backoff(k, rng.random())
    att = res.attempts[res.attempts["request_id"] == 1]
    assert att["attempt"].tolist() == [1, 2, 3, 4]
    assert att["sent_at"].tolist() == expected
    assert att["outcome"].tolist() == ["timed_out"] * 4
    assert (att["ended_at"] - att["sent_at"]).round(12).tolist() == [0.25] * 4
    assert res.info["num_retries"] == 3
    # Without jitter the waits are 0.1, 0.3, then the cap 0.5.
    assert [cfg.backoff(k, 0.0) for k in (1, 2, 3, 4)] == [0.1, 0.1 * 3.0, 0.5, 0.5]


def test_a_retry_that_finishes_counts_from_the_first_send():
    # The first attempt times out waiting; the retry is sent once the slot is free.
    res, _ = _run([(0.0, 64, 30), (0.0, 64, 5)], ttft_timeout=0.2, max_num_attempts=2,
                  backoff_base_time=0.2)
    user = res.requests.set_index("request_id").loc[1]
    att = res.attempts[res.attempts["request_id"] == 1]
    assert att["outcome"].tolist() == ["timed_out", "finished"]
    assert user["status"] == "finished" and user["num_attempts"] == 2
    assert user["arrival_at"] == 0.0
    assert user["ttft"] == pytest.approx(user["first_token_at"])     # from the first send
    assert att["sent_at"].iloc[1] == pytest.approx(0.4)


def test_retry_budget_caps_retries():
    rows = [(0.0, 64, 300)] + [(0.0, 64, 5)] * 4
    res, _ = _run(rows, ttft_timeout=0.1, max_num_attempts=5, backoff_base_time=0.01,
                  retry_budget=0.5)
    assert res.info["num_retries"] <= 0.5 * 5
    assert res.info["num_retries_refused"] > 0


def test_hedged_request_cancels_the_loser():
    cfg = BASE.replace(num_replicas=2, router="round_robin",
                       faults=FaultsConfig(hedge_delay=0.05, max_num_attempts=2))
    # Replica 0 is busy with request 0; request 1 goes to replica 1... and request 2 to 0.
    rows = [(0.0, 64, 200), (0.0, 64, 200), (0.01, 64, 5)]
    res, engine = run(cfg, rows, cost_model=UnitCostModel(STEP), keep_engine=True)
    check_results(res)
    check_final_state(engine)
    att = res.attempts[res.attempts["request_id"] == 2].set_index("attempt")
    assert att["outcome"].to_dict() == {1: "finished", 2: "cancelled"} \
        or att["outcome"].to_dict() == {1: "cancelled", 2: "finished"}
    assert att.loc[2, "sent_at"] == pytest.approx(0.06)
    assert res.requests.set_index("request_id").loc[2, "status"] == "finished"


def test_faults_off_is_the_plain_run():
    cfg = SimConfig().replace(rate=20.0, num_requests=200, seed=2)
    plain = simsched.simulate(cfg)
    off = simsched.simulate(cfg.replace(faults=FaultsConfig()))
    assert plain.attempts is None and off.attempts is None
    assert plain.requests.equals(off.requests) and plain.iterations.equals(off.iterations)


def test_faults_config_round_trips_and_names_bad_fields():
    f = FaultsConfig(ttft_timeout=2.0, cancel_fraction=0.2, cancel_time=("uniform", 1, 3),
                     max_num_attempts=3, retry_on=("failed",), hedge_delay=1.5,
                     replica_failures=((10, 1), (5.0, 0)), mtbf=3600.0, restart_time=20,
                     model_load_time=("exponential", 30.0), bill_while_down=False)
    cfg = SimConfig().replace(num_replicas=2, faults=f)
    assert SimConfig.from_json(cfg.to_json()) == cfg
    assert cfg.faults.replica_failures == ((5.0, 0), (10.0, 1))
    for kwargs, needle in [({"ttft_timeout": 0}, "faults.ttft_timeout"),
                           ({"cancel_fraction": 1.5}, "faults.cancel_fraction"),
                           ({"cancel_time": ("normal", 1)}, "faults.cancel_time"),
                           ({"max_num_attempts": 0}, "faults.max_num_attempts"),
                           ({"retry_on": ("cancelled",)}, "faults.retry_on"),
                           ({"backoff_multiplier": 0.5}, "faults.backoff_multiplier"),
                           ({"backoff_jitter": 2}, "faults.backoff_jitter"),
                           ({"session_on_failure": "retry"}, "faults.session_on_failure"),
                           ({"replica_failures": ((1, -1),)}, "faults.replica_failures"),
                           ({"restart_time": -1}, "faults.restart_time"),
                           ({"bill_while_down": 1}, "faults.bill_while_down")]:
        with pytest.raises(ValueError, match=needle.replace(".", r"\.")):
            FaultsConfig(**kwargs)
    with pytest.raises(ValueError, match="replica 2"):
        SimConfig().replace(num_replicas=2, faults=FaultsConfig(replica_failures=((1, 2),)))
    assert FaultsConfig(backoff_multiplier=1e300, backoff_max_time=1e308).backoff(900, 0.0) \
        == 1e308


def test_fuzz_faults_slice():
    """A slice of the fuzz campaign with faults (timeouts, cancellations, retries, hedges,
    replica failures), every invariant and result check on, none failing."""
    import warnings

    from benchmarks.fuzz import run_one

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        errors = [run_one((11, index, 0.5, 1.0)) for index in range(8)]
    assert [e for e in errors if e[1]] == []
