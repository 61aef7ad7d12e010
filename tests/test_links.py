"""Degraded links (simsched.cluster.links) against hand-built cases: a slowed link stretches
exactly the remaining transfer, a link going down fails its transfers at that instant and
retries them at recovery (or recomputes them), KV held and freed exactly; the remote KV tier's
link; timelines; per-pool failure distributions."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from simsched import SimConfig
from simsched.analysis.runner import run
from simsched.api import simulate_checked
from simsched.cluster import links as links_mod
from simsched.cluster.links import FaultyLink
from simsched.cluster.timeline import LinkTimeline
from simsched.config import ClusterConfig
from simsched.config.faults import FaultsConfig
from simsched.config.lifetimes import draw_lifetime, lifetime_mean, parse_lifetime
from simsched.cost import hardware
from simsched.engine.invariants import check_final_state
from simsched.engine.result_checks import check_results

PROMPT, OUTPUT = 256, 8
BLOCKS = PROMPT // 16
DISAGG = SimConfig().replace(check_invariants=True, seed=3).replace(
    cluster=ClusterConfig(num_replicas=2, roles=("prefill", "decode"), link_bandwidth_gbps=1.0,
                          link_latency=0.0))
ROWS = pd.DataFrame([(0.0, PROMPT, OUTPUT)],
                    columns=["arrival_at", "num_prompt_tokens", "num_output_tokens"])


def _run(config=DISAGG, rows=ROWS, **faults):
    res, engine = run(config.replace(faults=FaultsConfig(**faults)) if faults else config, rows,
                      keep_engine=True)
    check_results(res)
    check_final_state(engine)
    return res, engine


def _plain_transfer():
    """The undisturbed transfer's start (the engine's first token) and duration."""
    res, _ = _run()
    row = res.requests.iloc[0]
    assert row.kv_wait_time == 0
    size = PROMPT * hardware.kv_bytes_per_token(DISAGG.hardware)
    assert row.kv_transfer_time == pytest.approx(size / 1e9, rel=1e-12)
    return row.get("engine_first_token_at", row.first_token_at), row.kv_transfer_time


# ----------------------------------------------------------------------- the link itself
def test_half_bandwidth_doubles_exactly_the_remaining_time_of_a_transfer_in_flight():
    start, t = _plain_transfer()
    at = start + t / 4
    res, _ = _run(link_events=((at, 100.0, 0, 0.5),))
    row = res.requests.iloc[0]
    # A quarter at full speed, the other three quarters at half speed.
    assert row.kv_transfer_time == pytest.approx(t / 4 + 2 * (3 * t / 4), rel=1e-9)
    (only,) = res.transfers.itertuples()
    assert only.outcome == "arrived" and only.ended_at == pytest.approx(at + 1.5 * t, rel=1e-12)
    assert res.links.to_dict("records") == [
        {"link": "0", "started_at": at, "ended_at": at + 100.0, "bandwidth_fraction": 0.5}]


def test_shared_link_recomputes_every_active_transfer_at_a_change():
    import simpy

    env = simpy.Environment()
    link = FaultyLink(env, 1e9, 0.0)
    ends = {}

    def go(k, nbytes):
        yield link.transfer(nbytes)
        ends[k] = env.now

    env.process(go("a", 1e9))
    env.process(go("b", 2e9))

    def degrade():
        yield env.timeout(1.0)          # each has moved 0.5 GB at 0.5 GB/s
        link.set_fraction(0.25)         # 0.125 GB/s each from now

    env.process(degrade())
    env.run()
    # a: 0.5 GB left at 0.125 GB/s -> 5.0; b: then 1.0 GB left alone at 0.25 GB/s -> 9.0.
    assert ends == {"a": pytest.approx(5.0), "b": pytest.approx(9.0)}


def _watch_held(monkeypatch):
    """Record, at each link change, each replica's KV blocks held for request 0."""
    seen = []
    made = []
    orig_init, orig_set = links_mod.LinkFaults.__init__, FaultyLink.set_fraction

    def init(self, cluster, *a):
        made.append(cluster)
        orig_init(self, cluster, *a)

    def set_fraction(self, fraction):
        replicas = made[-1].replicas
        seen.append((self.env.now, fraction, [r.kv.num_held(0) for r in replicas]))
        orig_set(self, fraction)

    monkeypatch.setattr(links_mod.LinkFaults, "__init__", init)
    monkeypatch.setattr(FaultyLink, "set_fraction", set_fraction)
    return seen


def test_a_link_going_down_fails_its_transfer_then_and_retries_it_at_recovery(monkeypatch):
    start, t = _plain_transfer()
    at, down = start + t / 4, 0.5
    seen = _watch_held(monkeypatch)
    res, _ = _run(link_events=((at, down, 0, 0.0),), on_link_down="retry")
    first, second = res.transfers.itertuples()
    assert (first.outcome, first.then, first.started_at) == ("failed", "retry", start)
    assert first.ended_at == at                             # exactly at the failure
    assert second.started_at == at + down                   # exactly at recovery
    assert second.outcome == "arrived"
    assert second.ended_at == pytest.approx(at + down + t, rel=1e-12)   # sent again, whole
    row = res.requests.iloc[0]
    assert row.kv_transfer_time == pytest.approx(at + down + t - start, rel=1e-12)
    assert row.num_recomputed_tokens == 0 and row.status == "finished"
    # While down the prompt's KV stays held on the prefill replica and reserved on the decode one.
    changes = [(now, f, held) for now, f, held in seen if now > 0]
    assert changes == [(at, 0.0, [BLOCKS, BLOCKS]), (at + down, 1.0, [BLOCKS, BLOCKS])]
    assert res.info["num_kv_transfer_failures"] == 1 == res.info["num_kv_transfer_retries"]


def test_a_transfer_started_while_the_link_is_down_fails_at_once_and_waits():
    start, t = _plain_transfer()
    res, _ = _run(link_events=((0.0, start + 1.0, 0, 0.0),))
    first, second = res.transfers.itertuples()
    assert first.started_at == first.ended_at == start and first.outcome == "failed"
    assert second.started_at == start + 1.0
    assert second.ended_at == pytest.approx(start + 1.0 + t, rel=1e-12)


def test_a_failed_transfer_is_recomputed_on_the_decode_replica(monkeypatch):
    start, t = _plain_transfer()
    at = start + t / 2
    from simsched.engine import replica as replica_mod

    released = []
    orig = replica_mod.Replica.release

    def release(self, req):
        released.append((self.index, self.env.now, self.kv.num_held(req.id)))
        orig(self, req)
        released.append((self.index, self.env.now, self.kv.num_held(req.id)))

    monkeypatch.setattr(replica_mod.Replica, "release", release)
    res, _ = _run(link_events=((at, 10.0, 0, 0.0),), on_link_down="recompute")
    (only,) = res.transfers.itertuples()
    assert (only.outcome, only.then, only.ended_at) == ("failed", "recompute", at)
    # The prefill replica frees the prompt's blocks at the failure instant.
    assert released == [(0, at, BLOCKS), (0, at, 0)]
    row = res.requests.iloc[0]
    assert row.status == "finished" and row.num_recomputed_tokens == PROMPT
    it = res.iterations
    # The decode replica prefills the prompt and the first token again, and decodes the rest.
    assert it.loc[it["replica"] == 1, "num_prefill_tokens"].sum() == PROMPT + 1
    assert it.loc[it["replica"] == 1, "num_decode_tokens"].sum() == OUTPUT - 2
    assert it.loc[it["replica"] == 1, "started_at"].min() >= at
    assert res.info["num_kv_transfer_recomputes"] == 1


def test_a_busy_disaggregated_pool_keeps_every_invariant_under_link_faults():
    rows = pd.DataFrame([(0.02 * i, 100 + 37 * (i % 9), 2 + 7 * (i % 5)) for i in range(60)],
                        columns=["arrival_at", "num_prompt_tokens", "num_output_tokens"])
    cfg = DISAGG.replace(cluster=ClusterConfig(
        num_replicas=4, roles=("prefill", "prefill", "decode", "decode"), router="least_tokens",
        link_bandwidth_gbps=2.0, link_latency=1e-3), num_blocks=400)
    for mode in ("retry", "recompute"):
        res, _ = _run(cfg, rows, link_events=((0.3, 0.4, 0, 0.0), (0.2, 1.0, 1, 0.3)),
                      link_mtbf=0.5, link_mttr=0.05, on_link_down=mode)
        assert (res.requests["status"] == "finished").all()
        failed = res.transfers[res.transfers["outcome"] == "failed"]
        assert len(failed) and (failed["then"] == mode).all()
        # Every request's KV arrived once, or was recomputed once.
        ends = res.transfers.groupby("request_id")["outcome"].agg(list)
        assert all(o[-1] == "arrived" or mode == "recompute" for o in ends)


def test_a_link_event_after_the_work_changes_nothing():
    # Until its first event a faulty link is the plain link, transfer for transfer.
    rows = pd.DataFrame([(0.02 * i, 100 + 37 * (i % 9), 2 + 7 * (i % 5)) for i in range(40)],
                        columns=["arrival_at", "num_prompt_tokens", "num_output_tokens"])
    cfg = DISAGG.replace(cluster=ClusterConfig(
        num_replicas=3, roles=("prefill", "prefill", "decode"), router="least_tokens",
        link_bandwidth_gbps=0.5, link_latency=1e-3))
    plain, _ = _run(cfg, rows)
    late, _ = _run(cfg, rows, link_events=((1e4, 1.0, 0, 0.0),))
    pd.testing.assert_frame_equal(plain.requests, late.requests)
    pd.testing.assert_frame_equal(plain.iterations, late.iterations)
    assert plain.transfers is None and plain.links is None
    assert len(late.transfers) == 40 and late.links.empty


# ----------------------------------------------------------------------- the remote KV tier
def _remote(**faults):
    from tests.test_kv_tiers import cfg

    big = {"arrival_at": 0.0, "num_prompt_tokens": 320, "num_output_tokens": 1}
    rows = [dict(big, hash_ids=[1]), dict(big, arrival_at=1.0, hash_ids=[9]),
            dict(big, arrival_at=10.0, num_prompt_tokens=336, hash_ids=[2]),
            dict(big, arrival_at=11.0, hash_ids=[1])]   # hits A's blocks in the remote tier
    config = cfg(num_blocks=21, tiers=(), **{
        "cluster.num_replicas": 2, "cluster.kv_remote_tier": {"name": "remote"}})
    if faults:
        config = config.replace(faults=FaultsConfig(**faults))
    return simulate_checked(config, rows)


def test_a_remote_tier_down_serves_no_hit_and_a_slow_one_loads_slower():
    res, engine = _remote()
    plain = engine.replicas[1].kv.load_time_of[3]
    latency = engine.replicas[1].kv.tiers[0].latency
    assert res.requests["num_cached_tokens"].tolist()[3] == 319
    down, engine = _remote(link_events=((10.9, 1.0, "remote", 0.0),))
    assert down.requests["num_cached_tokens"].tolist()[3] == 0       # recomputed
    assert engine.replicas[1].kv.tiers[0].num_loads == 0
    slow, engine = _remote(link_events=((10.9, 100.0, "remote", 0.25),))
    assert slow.requests["num_cached_tokens"].tolist()[3] == 319
    assert engine.replicas[1].kv.load_time_of[3] == pytest.approx(
        latency + 4 * (plain - latency), rel=1e-9)


def test_a_load_meeting_the_link_down_starts_again_when_it_is_back():
    line = LinkTimeline([(2.0, 3.0, 0.0), (5.0, 6.0, 0.5)])
    assert line.finish(0.0, 0.5, 1.0, 1.0) == 1.5                 # before anything happens
    assert line.finish(1.5, 0.1, 1.0, 1.0) == pytest.approx(3.0 + 0.1 + 1.0)   # restarted
    assert line.finish(2.5, 0.0, 1.0, 1.0) == 4.0                 # waits for the link
    assert line.finish(4.5, 0.0, 1.0, 1.0) == pytest.approx(6.0)  # 0.5 s full, 1 s at half


# ----------------------------------------------------------------------- timelines, config
def test_overlapping_events_take_the_lowest_fraction():
    line = LinkTimeline([(1.0, 4.0, 0.5), (2.0, 3.0, 0.0), (3.0, 5.0, 0.8)])
    assert line.pieces == [(1.0, 2.0, 0.5), (2.0, 3.0, 0.0), (3.0, 4.0, 0.5), (4.0, 5.0, 0.8)]
    assert line.piece_at(0.0) == (1.0, 1.0) and line.piece_at(5.0)[0] == 1.0
    assert line.down_at(2.5) and not line.down_at(3.0)


def test_drawn_link_events_are_seeded():
    def pieces(seed):
        rng = np.random.default_rng(seed)
        line = LinkTimeline([], (parse_lifetime("x", 10.0), parse_lifetime("y", ("fixed", 1.0)),
                                 0.0, rng))
        line.piece_at(200.0)
        return [p for p in line.pieces if p[0] < 200.0]

    a = pieces(1)
    assert a == pieces(1) and a != pieces(2)
    assert all(e - s == pytest.approx(1.0) for s, e, _ in a) and len(a) > 5


def test_link_config_round_trips_and_names_bad_fields():
    f = FaultsConfig(link_events=((1.0, 2.0, 0, 0.5), (0.5, 1.0, "remote", 0.0)),
                     link_mtbf=("weibull", 1.5, 60.0), link_mttr=("lognormal", 5.0, 0.5),
                     on_link_down="recompute",
                     mtbf=(("default", ("weibull", 0.7, 3600.0)),), restart_time=(("default", 5),))
    assert f.link_events[0] == (0.5, 1.0, "remote", 0.0) and f.links and f.enabled
    config = DISAGG.replace(faults=FaultsConfig(link_events=f.link_events[1:],
                                                link_mtbf=f.link_mtbf, link_mttr=f.link_mttr,
                                                on_link_down="recompute"))
    assert SimConfig.from_json(config.to_json()) == config
    plain = SimConfig().replace(num_replicas=2, faults=FaultsConfig(
        mtbf=f.mtbf, restart_time=f.restart_time))
    assert SimConfig.from_json(plain.to_json()) == plain
    with pytest.raises(ValueError, match="faults.link_events"):
        FaultsConfig(link_events=((1.0, 0.0, 0, 0.5),))
    with pytest.raises(ValueError, match="faults.link_events"):
        FaultsConfig(link_events=((1.0, 1.0, 0, 1.0),))
    with pytest.raises(ValueError, match="on_link_down"):
        FaultsConfig(on_link_down="pray")
    with pytest.raises(ValueError, match="faults.link_mtbf"):
        FaultsConfig(link_mtbf=("gamma", 1.0))
    with pytest.raises(ValueError, match="not a prefill replica"):
        DISAGG.replace(faults=FaultsConfig(link_events=((1.0, 1.0, 1, 0.0),)))
    with pytest.raises(ValueError, match="needs cluster.kv_remote_tier"):
        DISAGG.replace(faults=FaultsConfig(link_events=((1.0, 1.0, "remote", 0.0),)))
    with pytest.raises(ValueError, match="no link to fail"):
        SimConfig().replace(faults=FaultsConfig(link_mtbf=10.0))
    with pytest.raises(ValueError, match="not supported with disaggregated"):
        DISAGG.replace(faults=FaultsConfig(ttft_timeout=1.0))
    with pytest.raises(ValueError, match=r"pool\(s\) \['gpu'\]"):
        SimConfig().replace(num_replicas=2, faults=FaultsConfig(mtbf=(("gpu", 10.0),)))


# ----------------------------------------------------------------------- failure distributions
def test_lifetimes_draw_their_distributions():
    rng = np.random.default_rng(0)
    for spec in (("weibull", 1.5, 100.0), ("weibull", 0.7, 100.0), ("lognormal", 50.0, 0.8),
                 ("exponential", 30.0)):
        spec = parse_lifetime("t", spec)
        draws = [draw_lifetime(spec, rng) for _ in range(20000)]
        assert np.mean(draws) == pytest.approx(lifetime_mean(spec), rel=0.03)
    # A number is an exponential's mean, drawn exactly as faults.mtbf always drew it.
    assert parse_lifetime("t", 5) == ("exponential", 5.0)
    a, b = np.random.default_rng(1), np.random.default_rng(1)
    assert draw_lifetime(("exponential", 5.0), a) == float(b.exponential(5.0))


FLEET = SimConfig().replace(num_replicas=2, router="round_robin", max_num_seqs=2,
                            max_num_batched_tokens=256, num_blocks=64, check_invariants=True,
                            seed=5)
FLEET_ROWS = [(0.05 * i, 64, 40) for i in range(60)]


def test_per_pool_failure_distributions():
    def failures(**f):
        f = {"restart_time": 0.2, "model_load_time": 0.1, **f}
        res, _ = run(FLEET.replace(faults=FaultsConfig(**f)), FLEET_ROWS, keep_engine=True)
        check_results(res)
        return res.failures

    plain = failures(mtbf=0.5)
    assert len(plain) > 2
    # The same exponential spelled out, or given to the one pool by name: the same failures.
    pd.testing.assert_frame_equal(plain, failures(mtbf=("exponential", 0.5)))
    pd.testing.assert_frame_equal(plain, failures(mtbf=(("default", 0.5),)))
    weibull = failures(mtbf=("weibull", 3.0, 0.5))
    assert len(weibull) and not weibull.equals(plain)
    # Per-pool repair times: each failure is back restart + model load later.
    slow = failures(mtbf=0.5, restart_time=(("default", ("fixed", 0.4)),))
    back = (slow["back_at"] - slow["failed_at"]).dropna()
    assert len(back) and np.allclose(back, 0.5)


def test_fuzz_links_slice():
    """A slice of the fuzz campaign's disaggregated cases with degraded links (scheduled and
    drawn, retried or recomputed), every invariant and result check on, none failing."""
    import warnings

    from benchmarks.fuzz import run_one

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = [run_one((45, index, 1.0, 1.0)) for index in (3, 4, 10, 14, 16, 20)]
    assert [kind for _, _, kind in out] == ["links"] * 6
    assert [e for e in out if e[1]] == []


def test_link_flags_parse_and_name_the_syntax():
    import argparse

    from simsched.cli.fault_flags import parse_link_event

    assert parse_link_event("60:30:0:0") == (60.0, 30.0, 0, 0.0)
    assert parse_link_event("1:2:remote:0.5") == (1.0, 2.0, "remote", 0.5)
    for bad in ("1:2:0", "1:2:x:0.5", "a:2:0:0"):
        with pytest.raises(argparse.ArgumentTypeError, match="AT:DURATION:LINK:FRACTION"):
            parse_link_event(bad)
