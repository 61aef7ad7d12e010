"""Replica failures in a disaggregated pool (simsched.cluster.disagg_failures) against
hand-built cases: a failed prefill replica cuts the transfers leaving it and frees the
reservations waiting for them, a failed decode replica loses what it decodes and what was on its
way, both at exactly the failure instant, and the routers avoid a replica while it is down."""

from __future__ import annotations

import pandas as pd
import pytest

from simsched import SimConfig
from simsched.config import ClusterConfig
from simsched.config.faults import FaultsConfig

from tests.test_links import DISAGG as BASE
from tests.test_links import _run as _run_with

PROMPT, OUTPUT = 256, 40
BLOCKS = PROMPT // 16
# 1P1D with a slow link (tests.test_links): a transfer takes about 0.13 s.
ONE = pd.DataFrame([(0.0, PROMPT, OUTPUT)],
                   columns=["arrival_at", "num_prompt_tokens", "num_output_tokens"])


def _run(config=BASE, rows=ONE, **faults):
    return _run_with(config, rows, **faults)


def _pool(router: str) -> SimConfig:
    """2P2D with the same links."""
    return BASE.replace(cluster=ClusterConfig(
        num_replicas=4, roles=("prefill", "prefill", "decode", "decode"), router=router,
        link_bandwidth_gbps=1.0, link_latency=0.0))


def _plain():
    res, _ = _run()
    row = res.requests.iloc[0]
    return row.get("engine_first_token_at", row.first_token_at), row.kv_transfer_time, row


def _held_at_failure(monkeypatch):
    """Record each replica's KV blocks held for request 0 just before and after each failure."""
    from simsched.cluster import disagg_failures as mod

    seen = []
    orig = mod.DisaggFailures.fail

    def fail(self, g):
        held = lambda: [r.kv.num_held(0) for r in self.cluster.replicas]  # noqa: E731
        before = held()
        out = orig(self, g)
        seen.append((self.env.now, g, before, held()))
        return out

    monkeypatch.setattr(mod.DisaggFailures, "fail", fail)
    return seen


@pytest.mark.parametrize("link_faults", [False, True])
def test_a_prefill_failure_cuts_the_transfer_and_frees_both_sides(monkeypatch, link_faults):
    start, t, _ = _plain()
    at = start + t / 2
    seen = _held_at_failure(monkeypatch)
    extra = {"link_events": ((1e4, 1.0, 0, 0.5),)} if link_faults else {}
    res, _ = _run(replica_failures=((at, 0),), restart_time=1.0, model_load_time=0.5, **extra)
    row = res.requests.iloc[0]
    assert row.status == "failed"
    assert row.reject_reason == f"failed: replica 0 failed at t={at:g} s"
    # Held on the prefill replica and reserved on the decode one until the failure, then freed.
    assert seen == [(at, 0, [BLOCKS, BLOCKS], [0, 0])]
    assert row.kv_transfer_time == pytest.approx(t / 2, rel=1e-9)     # cut at that instant
    f = res.failures.iloc[0]
    assert (f.replica, f.failed_at, f.num_failed_requests) == (0, at, 1)
    assert f.back_at != f.back_at        # NaN: the run (its one request) ended before
    assert res.summary()["num_failed"] == 1
    # The prompt it computed is lost work.
    assert res.info["num_aborted_kv_tokens"] == PROMPT
    if link_faults:
        (only,) = res.transfers.itertuples()
        assert (only.outcome, only.then, only.ended_at) == ("failed", "lost", at)


def test_a_decode_failure_loses_the_request_decoding_there_at_that_instant():
    start, t, plain = _plain()
    at = (start + t + plain.finished_at) / 2
    res, _ = _run(replica_failures=((at, 1),), restart_time=1.0, model_load_time=0.5)
    row = res.requests.iloc[0]
    assert row.status == "failed" and row.reject_reason.startswith("failed: replica 1 failed")
    assert 1 < row.num_generated_tokens < OUTPUT
    # What it lost: the transferred prompt and the tokens decoded since.
    assert res.info["num_aborted_kv_tokens"] == PROMPT + row.num_generated_tokens - 1


def test_a_decode_failure_frees_the_prompt_held_for_it_on_the_prefill_replica(monkeypatch):
    start, t, _ = _plain()
    at = start + t / 3
    seen = _held_at_failure(monkeypatch)
    res, _ = _run(replica_failures=((at, 1),), restart_time=1.0, model_load_time=0.5)
    assert res.requests.iloc[0].status == "failed"
    assert seen == [(at, 1, [BLOCKS, BLOCKS], [0, 0])]


def test_routers_avoid_a_failed_replica_until_it_is_back():
    rows = pd.DataFrame([(0.05 * i, 128, 8) for i in range(60)],
                        columns=["arrival_at", "num_prompt_tokens", "num_output_tokens"])
    cfg = _pool("round_robin")
    at, down = 0.5, 1.0
    res, _ = _run(cfg, rows, replica_failures=((at, 0), (at, 2)), restart_time=0.5,
                  model_load_time=0.5)
    df = res.requests
    during = df[(df["arrival_at"] > at) & (df["arrival_at"] < at + down - 0.2)]
    assert len(during) and (during["prefill_replica"] == 1).all()
    assert (during["decode_replica"] == 3).all() and (during["status"] == "finished").all()
    after = df[df["arrival_at"] > at + down]
    assert set(after["prefill_replica"]) == {0, 1} and set(after["decode_replica"]) == {2, 3}
    failed = df[df["status"] == "failed"]
    assert len(failed) == res.failures["num_failed_requests"].sum() > 0


def test_with_every_decode_replica_down_requests_fail_at_once():
    rows = pd.DataFrame([(0.0, PROMPT, OUTPUT), (1.0, PROMPT, OUTPUT)],
                        columns=["arrival_at", "num_prompt_tokens", "num_output_tokens"])
    res, _ = _run(BASE, rows, replica_failures=((0.9, 1),), restart_time=5.0,
                  model_load_time=0.0)
    second = res.requests.set_index("request_id").loc[1]
    assert second.status == "failed" and second.reject_reason.startswith("failed: no replica up")


def test_failures_drawn_per_role():
    rows = pd.DataFrame([(0.02 * i, 128, 16) for i in range(100)],
                        columns=["arrival_at", "num_prompt_tokens", "num_output_tokens"])
    cfg = _pool("least_tokens")
    res, _ = _run(cfg, rows, mtbf=(("decode", ("weibull", 2.0, 0.4)),), restart_time=0.1,
                  model_load_time=0.1)
    assert len(res.failures) and set(res.failures["replica"]) <= {2, 3}
    with pytest.raises(ValueError, match=r"pool\(s\) \['gpu'\]"):
        cfg.replace(faults=FaultsConfig(mtbf=(("gpu", 1.0),)))
    with pytest.raises(ValueError, match="not supported with disaggregated"):
        cfg.replace(faults=FaultsConfig(max_num_attempts=2))


def test_bytes_on_their_way_to_a_failed_decode_replica_arrive_to_nobody():
    start, t, _ = _plain()
    at = start + t / 3
    res, _ = _run(replica_failures=((at, 1),), restart_time=1.0, model_load_time=0.5,
                  link_events=((1e4, 1.0, 0, 0.5),))
    (only,) = res.transfers.itertuples()
    # The transfer is not cut (its sender is up): it ends as it would have, and is lost.
    assert (only.outcome, only.then) == ("arrived", "lost")
    assert only.ended_at == pytest.approx(start + t, rel=1e-12)
    assert res.requests.iloc[0].status == "failed"
