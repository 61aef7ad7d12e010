"""Autoscaling's on_remove: a removed replica's requests abort or migrate instead of draining."""

import dataclasses
import pandas as pd
import pytest

from simsched.analysis.fleet_metrics import slo_met
from simsched.analysis.runner import simulate
from simsched.analysis.slo import SLO, goodput, saturation_signals
from simsched.api import simulate_checked
from simsched.config import SimConfig
from simsched.config.autoscaling import AutoscalingConfig
from simsched.config.cluster import ClusterConfig
from simsched.workloads.workload import WorkloadConfig

# 3 replicas, one removed at t=10 while busy (the newest, replica 2).
LOAD = WorkloadConfig(name="custom", arrival="windows", lengths="fixed", prompt_len=256,
                      output_len=64, rate_schedule=((20, 20),))
SHORT = dataclasses.replace(LOAD, rate_schedule=((12, 20),))
REMOVED, AT = 2, 10.0


def config(on_remove="drain", migration_time=0.0, workload=LOAD, **changes):
    auto = AutoscalingConfig(policy="scheduled", plan=((0.0, 3), (AT, 2)), provisioning_time=0.0,
                             model_load_time=0.0, interval=5.0, price_per_hour=4.0,
                             on_remove=on_remove, migration_time=migration_time)
    cfg = dataclasses.replace(SimConfig(), workload=workload, cluster=ClusterConfig(
        num_replicas=3, router="jsq", autoscaling=auto))
    # Four sequences per replica: the removed one holds waiting requests as well as running.
    return cfg.replace(**{"max_num_seqs": 4, **changes})


@pytest.fixture(scope="module")
def runs():
    """The same run with each option, every invariant checked."""
    return {mode: simulate_checked(config(mode))[0] for mode in ("drain", "abort", "migrate")}


def removed_unit(res):
    units = res.fleet.units
    return units[units["replica"] == REMOVED].iloc[0]


def test_drain_is_the_default_and_unchanged():
    explicit = simulate(config("drain"))
    default = simulate(dataclasses.replace(config(), cluster=dataclasses.replace(
        config().cluster, autoscaling=dataclasses.replace(
            config().cluster.autoscaling, on_remove="drain"))))
    pd.testing.assert_frame_equal(explicit.requests, default.requests)
    assert "num_migrations" not in explicit.requests
    assert "num_aborted" not in explicit.summary()


def test_abort_ends_the_removed_replicas_requests_at_removal(runs):
    drain, abort = runs["drain"], runs["abort"]
    df = abort.requests
    aborted = df[df["status"] == "aborted"]
    # The removed replica was busy: its waiting and running requests were aborted.
    assert aborted["first_scheduled_at"].isna().sum() >= 2
    assert aborted["first_scheduled_at"].notna().sum() >= 2
    assert (aborted["replica"] == REMOVED).all()
    assert aborted["reject_reason"].str.fullmatch(
        rf"aborted: replica {REMOVED} removed at t={AT:g} s").all()
    assert aborted["finished_at"].isna().all()
    assert (aborted["num_generated_tokens"] < aborted["num_output_tokens"]).all()
    # Some had been served in part (tokens out before the removal, with their times).
    # (The engine's times: the client sees tokens after the engine profile's output delay.)
    served = aborted[aborted["first_token_at"].notna()]
    assert len(served) and (served["engine_first_token_at"] < AT).all()
    assert (served["num_generated_tokens"] >= 1).all()
    assert aborted["arrival_at"].max() < AT
    s = abort.summary()
    assert s["num_aborted"] == len(aborted) == abort.info["num_aborted"]
    assert s["num_finished"] + s["num_aborted"] == s["num_requests"]
    # They are failures for SLO attainment and goodput, and lower completion; they are not
    # requests left in flight (the saturation label does not call the run overloaded for them).
    assert not slo_met(aborted, 1e9, 1e9).any()
    loose = goodput(df, SLO(ttft=1e9, tpot=1e9))
    assert loose["num_good"] == len(df) - len(aborted)
    signals = saturation_signals(df, abort.iterations)
    assert signals["completion"] == (len(df) - len(aborted)) / len(df)
    assert signals["num_unfinished"] == 0
    # Nothing else changes: every other request is exactly as when the replica drains.
    others = df["status"] != "aborted"
    pd.testing.assert_frame_equal(df[others], drain.requests[others])
    assert (drain.requests.loc[~others, "status"] == "finished").all()
    # Billing stops at the removal; with drain it runs until the replica is empty.
    unit = removed_unit(abort)
    assert unit["drain_at"] == unit["stopped_at"] == AT and unit["billed_time"] == AT
    assert removed_unit(drain)["stopped_at"] > AT
    assert abort.fleet.cost < drain.fleet.cost
    # The removed replica's log has no iteration after the removal (the one in progress is lost).
    it = abort.iterations
    mine = it[it["replica"] == REMOVED]
    assert (mine["started_at"] + mine["duration"] <= AT).all()
    other_it = it[it["replica"] != REMOVED].reset_index(drop=True)
    pd.testing.assert_frame_equal(
        other_it, drain.iterations[drain.iterations["replica"] != REMOVED].reset_index(drop=True))


def test_migrate_finishes_every_request_elsewhere(runs):
    abort, migrate = runs["abort"], runs["migrate"]
    df = migrate.requests
    assert (df["status"] == "finished").all()
    assert (df["num_generated_tokens"] == df["num_output_tokens"]).all()
    moved = df[df["num_migrations"] > 0]
    aborted = abort.requests[abort.requests["status"] == "aborted"]
    # Exactly the requests abort ends are the ones that migrate, once each.
    assert moved["request_id"].tolist() == aborted["request_id"].tolist()
    assert (moved["num_migrations"] == 1).all()
    assert migrate.summary()["num_migrations"] == len(moved) == migrate.info["num_migrations"]
    assert migrate.summary()["num_aborted"] == 0
    # They finished on another replica, after the removal; the removed one got nothing more.
    assert (moved["replica"] != REMOVED).all() and (moved["finished_at"] > AT).all()
    mine = df[df["replica"] == REMOVED]
    assert (mine["engine_finished_at"] <= AT).all()
    it = migrate.iterations
    assert (it.loc[it["replica"] == REMOVED, "started_at"] < AT).all()
    # Tokens emitted before the removal keep their times: TTFT unchanged where it was out.
    before = aborted.set_index("request_id")["first_token_at"]
    after = moved.set_index("request_id")["first_token_at"]
    out = before.notna()
    assert (after[out] == before[out]).all()
    assert (after[~out] > AT).all()
    # Recompute: the destination prefilled the prompt and the tokens generated so far again,
    # the KV that aborting them threw away (aborted requests themselves recompute nothing).
    assert (aborted["num_recomputed_tokens"] == 0).all()
    assert int(moved["num_recomputed_tokens"].sum()) == abort.info["num_aborted_kv_tokens"]
    # Every token of every request has its gap: nothing lost or doubled by the move.
    assert migrate.num_itl_samples == int((df["num_output_tokens"] - 1).sum())
    # Billing stops at the removal.
    unit = removed_unit(migrate)
    assert unit["drain_at"] == unit["stopped_at"] == AT and unit["billed_time"] == AT


def test_migration_time_delays_the_arrival_elsewhere():
    res, _ = simulate_checked(config("migrate", migration_time=2.5, workload=SHORT))
    df = res.requests
    moved = df[df["num_migrations"] > 0]
    assert len(moved) >= 3 and (df["status"] == "finished").all()
    # Nobody computes for them in between: no token between the removal and the arrival.
    assert (moved["finished_at"] > AT + 2.5).all()
    fresh = moved[moved["first_scheduled_at"] > AT]
    assert (fresh["first_token_at"] > AT + 2.5).all()
    assert removed_unit(res)["stopped_at"] == AT


@pytest.mark.parametrize("mode, changes", [
    ("abort", dict(preemption_mode="swap", num_blocks=40, max_num_seqs=12)),
    ("migrate", dict(preemption_mode="swap", num_blocks=40, max_num_seqs=12)),
    ("migrate", dict(policy="spf", preemption=True, num_blocks=40)),
    ("abort", dict(plan_ahead=True)),
    ("migrate", dict(async_scheduling=True, enable_prefix_caching=True)),
])
def test_removal_keeps_every_invariant(mode, changes):
    # KV pressure (swapped and preempted requests), async scheduling, a prefix cache.
    res, engine = simulate_checked(config(mode, migration_time=("uniform", 0.0, 1.0),
                                          workload=SHORT, **changes))
    df = res.requests
    closed = "aborted" if mode == "abort" else "finished"
    assert set(df["status"]) <= {"finished", closed}
    assert (df["status"] == closed).sum() >= 1
    removed = engine.replicas[REMOVED]
    assert not removed.scheduler.has_work() and removed.kv.num_free == removed.kv.num_blocks
    assert not removed.gpu_process.is_alive


def test_a_migration_no_routable_replica_can_serve_is_aborted_not_lost():
    # The dear pool's replica is removed; the one left has too few KV blocks for these requests.
    pools = ({"name": "small", "num_blocks": 20, "min_replicas": 1, "max_replicas": 1},
             {"name": "big", "price_per_hour": 5.0, "max_replicas": 1})
    auto = AutoscalingConfig(policy="scheduled", plan=((0.0, 2), (AT, 1)), provisioning_time=0.0,
                             model_load_time=0.0, interval=5.0, pools=pools, on_remove="migrate")
    cfg = dataclasses.replace(SimConfig(), workload=dataclasses.replace(SHORT, prompt_len=300),
                              cluster=ClusterConfig(num_replicas=2, router="round_robin",
                                                    autoscaling=auto))
    with pytest.warns(Warning, match="rejected"):
        res, _ = simulate_checked(cfg.replace(max_num_seqs=4))
    df = res.requests
    moved = df[df["num_migrations"] > 0]
    assert len(moved) >= 3 and (moved["status"] == "aborted").all()
    assert moved["reject_reason"].str.startswith(
        "aborted: migrated to replica 0, which cannot serve it (needs").all()
    assert (moved["replica"] == -1).all()
    assert res.summary()["num_aborted"] == len(moved)
    # The rest: rejected at the small replica, or finished at the big one before the removal.
    rest = df[df["num_migrations"] == 0]
    assert set(rest["status"]) == {"rejected", "finished"}
    assert (rest.loc[rest["status"] == "finished", "engine_finished_at"] <= AT).all()


def test_on_remove_config_round_trips_and_rejects_bad_input():
    cfg = config("migrate", migration_time=("uniform", 1.0, 2.0))
    assert SimConfig.from_json(cfg.to_json()) == cfg
    assert cfg.cluster.autoscaling.migration_time == ("uniform", 1.0, 2.0)
    with pytest.raises(ValueError, match="on_remove"):
        AutoscalingConfig(on_remove="evict")
    with pytest.raises(ValueError, match="migration_time"):
        AutoscalingConfig(on_remove="migrate", migration_time=-1.0)
    with pytest.raises(ValueError, match="migration_time"):
        AutoscalingConfig(migration_time=("uniform", 3.0, 1.0))


def test_cli_set_on_remove(tmp_path, capsys):
    from simsched.cli import main
    value = ('{"policy": "scheduled", "plan": [[0, 2], [0.3, 1]], "provisioning_time": 0, '
             '"model_load_time": 0, "on_remove": "abort"}')
    # Replica 1 holds request 1 (arrived at 0.21 s) when it is removed at 0.3 s.
    assert main(["run", "--workload", "lesson", "--num-requests", "300", "--set",
                 f"autoscaling={value}", "--set", "router=round_robin", "--out",
                 str(tmp_path)]) == 0
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert summary["num_aborted"].iloc[0] > 0
    assert summary["num_finished"].iloc[0] + summary["num_aborted"].iloc[0] == 300
