"""Autoscaling: scheduled plans, provisioning delays, draining, cost, policies, routers."""

import dataclasses
import math

import numpy as np
import pytest

from simsched.analysis.runner import simulate
from simsched.config import SimConfig
from simsched.config.autoscaling import AutoscalingConfig
from simsched.config.cluster import ClusterConfig
from simsched.workloads.workload import WorkloadConfig

RAMP = WorkloadConfig(name="custom", arrival="windows", lengths="fixed", prompt_len=256,
                      output_len=64, rate_schedule=((60, 5), (60, 40), (60, 5)))


def run(auto, router="jsq", num_replicas=2, workload=RAMP, **cluster):
    cfg = dataclasses.replace(SimConfig(), workload=workload, cluster=ClusterConfig(
        num_replicas=num_replicas, router=router, autoscaling=auto, **cluster))
    return simulate(cfg)


def scheduled(plan, delay=0.0, **changes):
    return AutoscalingConfig(policy="scheduled", plan=plan, provisioning_time=delay,
                             model_load_time=delay, interval=5.0, price_per_hour=4.0, **changes)


def test_scheduled_plan_gives_exactly_its_counts_at_its_times():
    plan = ((0.0, 2), (50.0, 6), (100.0, 3), (130.0, 2))
    res = run(scheduled(plan))
    fleet = res.fleet
    for k, (at, count) in enumerate(plan):
        nxt = plan[k + 1][0] if k + 1 < len(plan) else res.sim_time
        # From the plan's instant to the next, exactly `count` replicas are routable.
        for t in np.linspace(at, nxt, 7)[:-1]:
            assert fleet.replicas_at([t])["routable"].iloc[0] == count, (at, t)
        if k:
            assert fleet.replicas_at([at - 1e-6])["routable"].iloc[0] == plan[k - 1][1]


def test_scheduled_plan_with_delays_bills_at_once_and_routes_after_the_delays():
    plan = ((0.0, 2), (50.0, 6))
    res = run(scheduled(plan, delay=7.5))
    at = res.fleet.replicas_at([49.9, 50.0, 64.9, 65.0])
    assert at["billed"].tolist() == [2, 6, 6, 6]
    assert at["routable"].tolist() == [2, 2, 2, 6]


@pytest.mark.parametrize("router, cluster", [
    ("jsq", {}), ("round_robin", {}), ("least_tokens", {}), ("power_of_two", {}),
    ("random", {}), ("least_kv", {}), ("jsq", {"refresh_interval": 0.5}), ("weighted", {}),
    ("least_tokens", {"refresh_interval": 0.2}), ("session_affinity", {}), ("prefix_affinity", {})])
def test_no_request_before_delays_and_none_to_a_draining_replica(router, cluster):
    plan = ((0.0, 2), (40.0, 6), (110.0, 2))
    res = run(scheduled(plan, delay=("uniform", 3.0, 12.0)), router=router, **cluster)
    units, req = res.fleet.units, res.requests
    assert (req["status"] == "finished").all()
    for _, unit in units.iterrows():
        if unit["replica"] < 0:
            continue
        mine = req[req["replica"] == unit["replica"]]
        # Never routed before it was routable, nor after it started draining.
        assert (mine["arrival_at"] >= unit["routable_at"]).all()
        if not math.isnan(unit["drain_at"]):
            assert (mine["arrival_at"] < unit["drain_at"]).all()
            # It finished what it held, then stopped billing at its last completion (the
            # frame's finish times are client-side: the engine's plus the output delay).
            last = max(mine["finished_at"].max() if len(mine) else 0.0, unit["drain_at"])
            assert last - 0.05 <= unit["stopped_at"] <= last
    new = units[units["requested_at"] > 0]
    assert len(new) == 4
    delays = new["routable_at"] - new["requested_at"]
    assert ((delays >= 6.0) & (delays <= 24.0)).all()
    # The added replicas did serve the peak.
    assert req["replica"].isin(new["replica"]).sum() > 100


def test_cost_integrates_replica_time():
    res = run(scheduled(((0.0, 2), (50.0, 6), (130.0, 2)), delay=5.0))
    fleet = res.fleet
    # Integrate the billed replica count over a fine grid: price 4 per replica-hour.
    step = 0.01
    grid = np.arange(0.0, res.sim_time, step) + step / 2
    integral = fleet.replicas_at(grid)["billed"].sum() * step * 4.0 / 3600
    assert fleet.cost == pytest.approx(integral, rel=2e-4)
    # Two replicas all run long, four from 50 s until they drained (at or after 130 s).
    four = fleet.units[fleet.units["requested_at"] == 50.0]
    assert ((four["stopped_at"] >= 130.0) & (four["stopped_at"] < 131.0)).all()
    expected = (2 * res.sim_time + (four["stopped_at"] - 50.0).sum()) * 4.0 / 3600
    assert fleet.cost == pytest.approx(expected, rel=1e-12)
    assert res.info["fleet_cost"] == fleet.cost
    assert fleet.cost_between(0, res.sim_time) == pytest.approx(fleet.cost)


def test_pools_scale_up_cheapest_first_and_down_dearest_first():
    pools = ({"name": "cheap", "price_per_hour": 1.0, "min_replicas": 1, "max_replicas": 3},
             {"name": "dear", "price_per_hour": 5.0, "max_replicas": 4, "gpu": "h100-sxm"})
    res = run(scheduled(((0.0, 1), (30.0, 5), (120.0, 2)), pools=pools), num_replicas=1)
    units = res.fleet.units
    added = units[units["requested_at"] == 30.0]
    assert sorted(added["pool"]) == ["cheap", "cheap", "dear", "dear"]
    drained = units[units["drain_at"] == 120.0]
    assert sorted(drained["pool"]) == ["cheap", "dear", "dear"]
    assert res.fleet.cost == pytest.approx(float((units["billed_time"] * units["price_per_hour"]
                                                  ).sum() / 3600))
    assert res.replicas["gpu"].tolist().count("h100-sxm") == 2


@pytest.mark.parametrize("auto", [
    AutoscalingConfig(policy="threshold", metric="running", target=4.0, interval=5.0,
                      scale_down_window=20.0, provisioning_time=2.0, model_load_time=2.0),
    AutoscalingConfig(policy="saturation", kv_target=0.01, interval=5.0,
                      scale_down_window=20.0, provisioning_time=2.0, model_load_time=2.0),
])
def test_policies_follow_the_ramp(auto):
    res = run(auto, num_replicas=1)
    timeline = res.fleet.timeline
    peak = timeline[(timeline["at"] > 75) & (timeline["at"] < 120)]["target"].max()
    calm = timeline[timeline["at"] < 55]["target"].max()
    assert peak > calm
    assert timeline["target"].iloc[-1] < peak       # and back down after the ramp


def test_max_step_caps_each_decision():
    auto = AutoscalingConfig(policy="threshold", metric="running", target=1.0, interval=5.0,
                             max_step=1, provisioning_time=0.0, model_load_time=0.0)
    res = run(auto, num_replicas=1)
    assert res.fleet.timeline["target"].diff().abs().max() == 1


def test_autoscaling_config_round_trips_and_rejects_bad_input():
    auto = scheduled(((0.0, 2), (60.0, 3)), delay=("exponential", 30.0),
                     pools=({"name": "a", "gpu": "h100-sxm", "price_per_hour": 2.0},))
    cfg = dataclasses.replace(SimConfig(), cluster=ClusterConfig(num_replicas=2, autoscaling=auto))
    assert SimConfig.from_json(cfg.to_json()) == cfg
    for changes, message in [
        (dict(policy="scheduled"), "plan is required"),
        (dict(plan=((10, 2), (5, 3))), "increasing"),
        (dict(provisioning_time=-1.0), "provisioning_time"),
        (dict(policy="magic"), "policy"),
        (dict(pools=({"colour": "red"},)), "unknown field 'colour'"),
        (dict(min_replicas=5, max_replicas=2), "min_replicas"),
    ]:
        with pytest.raises(ValueError, match=message):
            AutoscalingConfig(**changes)
    with pytest.raises(ValueError, match="within the pools' limits"):
        ClusterConfig(num_replicas=100, autoscaling=AutoscalingConfig(max_replicas=8))
    with pytest.raises(ValueError, match="disaggregated"):
        ClusterConfig(num_replicas=2, roles=("prefill", "decode"),
                      autoscaling=AutoscalingConfig())


def test_cli_set_autoscaling_writes_fleet_frames(tmp_path, capsys):
    from simsched.cli import main
    value = ('{"policy": "scheduled", "plan": [[0, 1], [3, 2]], "provisioning_time": 1, '
             '"model_load_time": 0, "price_per_hour": 3}')
    assert main(["run", "--workload", "lesson", "--num-requests", "300", "--set",
                 f"autoscaling={value}", "--out", str(tmp_path)]) == 0
    units = __import__("pandas").read_csv(tmp_path / "fleet_units.csv")
    assert len(units) == 2 and units["routable_at"].iloc[1] == 4.0
    summary = __import__("pandas").read_csv(tmp_path / "summary.csv")
    assert summary["fleet_cost"].iloc[0] == pytest.approx(
        (units["billed_time"] * 3).sum() / 3600)


@pytest.mark.slow
def test_experiment_quick_runs(tmp_path):
    from experiments import autoscaling

    out = autoscaling.main(["--quick", "--quiet", "--out", str(tmp_path)])
    runs = out["runs"].set_index("scenario")
    assert runs.loc["fixed", "cost_per_day"] == runs["cost_per_day"].max()
    assert (runs["attainment"] > 0.5).all() and (runs["num_requests"] > 10_000).all()
    assert len(out["windows"]) == 144 * len(runs)
    assert (tmp_path / "runs.csv").exists() and (tmp_path / "windows.csv").exists()
