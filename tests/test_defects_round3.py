"""Issue 40's defects in the round-3 features (bad input and hangs): each test failed before its
fix. Speculative acceptance types (1), LoRA with disaggregated roles (2), autoscaling's unknown
keys (4), pools checked as fixed replicas (5), the autoscaler's interval (6) and a migration
that never lands (7), ServeGen and windows workloads (10-13)."""

import dataclasses

import numpy as np
import pytest

from simsched.config import SimConfig
from simsched.config.autoscaling import MAX_MIGRATION_TIME, MIN_INTERVAL, AutoscalingConfig
from simsched.config.cluster import ClusterConfig
from simsched.config.lora import LoRAConfig
from simsched.config.parts import SchedulerConfig
from simsched.config.speculative import SpeculativeConfig


# --------------------------------------------------------------- 1: speculative acceptance
@pytest.mark.parametrize("value", [{0.9: 0.5, 0.8: 0.3}, {0.7, 0.5}, "0.7", b"\x01", 0.7,
                                   iter((0.7, 0.5))])
def test_acceptance_of_a_type_the_docs_do_not_list_is_refused(value):
    # A dict iterated as its keys (0.9, 0.8) was taken as the per-position vector.
    with pytest.raises(ValueError, match=r"scheduler\.speculative\.acceptance must be a tuple "
                                         r"or list"):
        SpeculativeConfig(acceptance=value)


@pytest.mark.parametrize("value", [(0.7, 0.5), [0.7, 0.5], np.array([0.7, 0.5])])
def test_acceptance_as_a_tuple_list_or_array_is_one_vector(value):
    assert SpeculativeConfig(acceptance=value).acceptance == (0.7, 0.5)


def test_acceptance_dict_in_a_scheduler_mapping_is_refused_too():
    with pytest.raises(ValueError, match=r"acceptance must be a tuple or list.*dict"):
        SchedulerConfig(speculative={"acceptance": {"0": 0.7}})


# ------------------------------------------------------------ 2: LoRA and disaggregation
LORA = SchedulerConfig(lora=LoRAConfig())


@pytest.mark.parametrize("cluster", [
    ClusterConfig(num_replicas=2, num_prefill_replicas=1, num_decode_replicas=1),
    ClusterConfig(num_replicas=3, num_prefill_replicas=1),
    ClusterConfig(num_replicas=2, roles=("prefill", "decode")),
])
def test_lora_with_disaggregated_roles_is_refused(cluster):
    with pytest.raises(ValueError, match="scheduler.lora is not supported with disaggregated"):
        SimConfig(scheduler=LORA, cluster=cluster)


@pytest.mark.parametrize("roles", [{"num_prefill_replicas": 1, "num_decode_replicas": 1},
                                   {"roles": ("decode", "prefill")}])
def test_lora_through_a_replica_override_with_roles_is_refused(roles):
    cluster = ClusterConfig(num_replicas=2, replicas=({"lora": {"max_loras": 2}},), **roles)
    with pytest.raises(ValueError, match="scheduler.lora is not supported with disaggregated"):
        SimConfig(cluster=cluster)


def test_lora_on_a_mixed_cluster_stays_accepted():
    SimConfig(scheduler=LORA, cluster=ClusterConfig(num_replicas=2))


# --------------------------------------------------------- 4: autoscaling's unknown keys
def test_autoscaling_mapping_with_an_unknown_key_names_it():
    with pytest.raises(ValueError, match=r"cluster\.autoscaling: unknown field\(s\) "
                                         r"\['intervall'\]; known: \[.*'interval'"):
        ClusterConfig(autoscaling={"intervall": 5.0})


def test_autoscaling_unknown_key_from_json_is_a_value_error():
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['intervall'\]"):
        SimConfig.from_dict({"cluster": {"autoscaling": {"intervall": 5.0}}})
    cfg = SimConfig.from_dict({"cluster": {"autoscaling": {"interval": 5.0}}})
    assert cfg.cluster.autoscaling == AutoscalingConfig(interval=5.0)


def test_lora_mapping_with_an_unknown_key_names_it():
    with pytest.raises(ValueError, match=r"scheduler\.lora: unknown field\(s\) \['max_lora'\]"):
        SchedulerConfig(lora={"max_lora": 2})


# ------------------------------------------------- 5: pools get the fixed replicas' check
BAD_REPLICA_FIELDS = [
    ({"gpu": "nope"}, "hardware.gpu"),
    ({"num_blocks": 0}, "cache.num_blocks"),
    ({"max_num_seqs": 1.5}, "scheduler.max_num_seqs"),
    ({"lora": {"max_loras": 1}, "preemption_mode": "swap"}, "preemption_mode='swap'"),
    ({"tensor_parallel_size": 3}, "hardware.tensor_parallel_size"),
    ({"speculative": {"num_speculative_tokens": -1}}, "num_speculative_tokens"),
]


def pool_config(fields):
    pools = ({"name": "base", "min_replicas": 1, "max_replicas": 2},
             {"name": "odd", "max_replicas": 2, **fields})
    return SimConfig(cluster=ClusterConfig(num_replicas=1,
                                           autoscaling=AutoscalingConfig(pools=pools)))


@pytest.mark.parametrize("fields, field", BAD_REPLICA_FIELDS)
def test_a_pool_is_refused_what_a_fixed_replica_is_refused(fields, field):
    with pytest.raises(ValueError) as fixed:
        SimConfig(cluster=ClusterConfig(num_replicas=2, replicas=(fields,)))
    with pytest.raises(ValueError) as pool:
        pool_config(fields)
    # The same check, the same words, only the place named differs.
    prefix = "cluster.replicas[0]: "
    assert str(fixed.value).startswith(prefix) and field in str(fixed.value)
    assert str(pool.value) == "cluster.autoscaling.pools[1] ('odd'): " + \
        str(fixed.value)[len(prefix):]


def test_pool_configs_are_the_replica_configs_of_the_same_fields():
    fields = {"gpu": "h100-sxm", "max_num_seqs": 64}
    cfg = pool_config(fields)
    fixed = SimConfig(cluster=ClusterConfig(num_replicas=2, replicas=(fields,)))
    assert cfg.pool_configs()[1] == fixed.replica_configs()[0]
    assert cfg.pool_configs()[0] == fixed.replica_configs()[1]
    assert SimConfig().pool_configs() == []


# ------------------------------------------------------------ 6, 7: no hang in autoscaling
@pytest.mark.parametrize("interval", [1e-9, 1e-6, MIN_INTERVAL / 2])
def test_an_interval_below_the_bound_is_refused(interval):
    with pytest.raises(ValueError, match=r"cluster\.autoscaling\.interval must be >= 0\.001 s"):
        AutoscalingConfig(interval=interval)


def test_the_interval_bound_itself_is_accepted():
    assert AutoscalingConfig(interval=MIN_INTERVAL).interval == MIN_INTERVAL


@pytest.mark.parametrize("delay", [1e17, MAX_MIGRATION_TIME * 1.01, ("uniform", 0.0, 1e5),
                                   ("exponential", 1e9), ("lognormal", 1e6, 0.5)])
def test_a_migration_that_never_lands_is_refused(delay):
    with pytest.raises(ValueError, match=r"cluster\.autoscaling\.migration_time .* must be at "
                                         r"most 3600 s"):
        AutoscalingConfig(on_remove="migrate", migration_time=delay)


def test_a_migration_of_an_hour_lands_and_the_run_ends():
    from simsched.analysis.runner import simulate
    from simsched.workloads.workload import WorkloadConfig

    load = WorkloadConfig(name="custom", arrival="windows", lengths="fixed", prompt_len=256,
                          output_len=16, rate_schedule=((12, 5),))
    auto = AutoscalingConfig(policy="scheduled", plan=((0.0, 2), (6.0, 1)),
                             provisioning_time=0.0, model_load_time=0.0, interval=60.0,
                             on_remove="migrate", migration_time=MAX_MIGRATION_TIME)
    cfg = dataclasses.replace(SimConfig(), workload=load, cluster=ClusterConfig(
        num_replicas=2, router="jsq", autoscaling=auto)).replace(max_num_seqs=2)
    res = simulate(cfg)
    df = res.requests
    moved = df[df["num_migrations"] > 0]
    assert len(moved) > 0 and (moved["status"] == "finished").all()
    # They landed an hour after the removal at t=6 and then finished.
    assert (moved["finished_at"] > 6.0 + MAX_MIGRATION_TIME).all()


# ------------------------------------------------------- 10, 11: ServeGen at config time
from simsched.workloads import rate_schedule as rs  # noqa: E402
from simsched.workloads.arrivals import MAX_ARRIVALS  # noqa: E402
from simsched.workloads.workload import WorkloadConfig, generate  # noqa: E402


def servegen(**changes):
    return WorkloadConfig(name="custom", arrival="servegen", lengths="fixed", **changes)


def test_a_missing_servegen_file_is_refused_at_config_time(tmp_path):
    missing = tmp_path / "client_windows.csv.gz"
    with pytest.raises(ValueError, match=r"workload\.trace_path: ServeGen window file .*"
                                         r"client_windows\.csv\.gz not found"):
        servegen(trace_path=str(missing))


def test_an_unreadable_servegen_file_names_the_field_and_the_file(tmp_path):
    bad = tmp_path / "w.csv"
    bad.write_text("model,client\nm-large,0\n")
    with pytest.raises(ValueError, match=r"workload\.trace_path: .*w\.csv: missing column"):
        servegen(trace_path=str(bad))
    with pytest.raises(ValueError, match=r"workload\.start/workload\.duration: .*no traffic"):
        servegen(start=90_000.0)


@pytest.mark.parametrize("duration", [1e-6, 1e-3])
def test_a_servegen_period_with_no_expected_arrival_names_the_duration(duration):
    with pytest.raises(ValueError, match=r"workload\.duration: arrival='servegen' expects "
                                         r".* arrivals .*fewer than one"):
        servegen(duration=duration)


def test_a_short_servegen_period_with_arrivals_is_accepted_and_drawn():
    frame = generate(servegen(duration=1.0), np.random.default_rng(0))
    assert len(frame) > 0 and frame["arrival_at"].max() < 1.0


def test_expected_arrivals_is_the_windows_rate_times_their_part_before_duration():
    table = rs.windows_from_schedule(((10.0, 2.0), (10.0, 6.0)))
    assert rs.expected_arrivals(table) == 80.0
    assert rs.expected_arrivals(table, duration=15.0) == 20.0 + 30.0
    assert rs.expected_arrivals(table, rate=8.0) == 160.0   # scaled to 8 req/s over 20 s
    counts = [len(rs.windowed(np.random.default_rng(s), table, duration=15.0))
              for s in range(40)]
    assert abs(np.mean(counts) - 50.0) < 4 * np.sqrt(50.0 / 40)


# --------------------------------------------------------- 12: a bound on arrivals drawn
def test_a_schedule_of_1e12_requests_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"workload\.rate_schedule: arrival='windows' expects "
                                         r"1e\+12 arrivals .* more than the 200,000,000"):
        WorkloadConfig(name="custom", arrival="windows", rate_schedule=((1.0, 1e12),))
    with pytest.raises(ValueError, match=r"workload\.duration: arrival='poisson'"):
        WorkloadConfig(name="custom", arrival="poisson", rate=1e9, duration=10.0)
    with pytest.raises(ValueError, match=r"workload\.num_requests must be at most 200,000,000"):
        WorkloadConfig(num_requests=MAX_ARRIVALS + 1)


def counting(monkeypatch):
    """Record ``(window start, arrivals returned)`` of every window rate_schedule draws."""
    calls = []
    original = rs.window_arrivals

    def counted(*args, **kwargs):
        out = original(*args, **kwargs)
        calls.append((float(args[1]), len(out)))
        return out

    monkeypatch.setattr(rs, "window_arrivals", counted)
    return calls


def test_1e12_requests_per_second_with_a_cap_draws_only_the_cap(monkeypatch):
    calls = counting(monkeypatch)
    cfg = WorkloadConfig(name="custom", arrival="windows", lengths="fixed",
                         rate_schedule=((1.0, 1e12), (1.0, 5.0)), num_requests=1000)
    frame = generate(cfg, np.random.default_rng(0))
    assert len(frame) == 1000 and frame["arrival_at"].is_monotonic_increasing
    assert frame["arrival_at"].max() < 1e-6      # a trillion a second: the first microsecond
    # One window drawn, to its first 1,000 arrivals; the second never.
    assert calls == [(0.0, 1000)]


# ------------------------------------------------------ 13: only what the first n need
def test_servegen_n_requests_draw_the_first_windows_not_the_day(monkeypatch):
    calls = counting(monkeypatch)
    frame = generate(servegen(rate=1000.0, num_requests=1000), np.random.default_rng(0))
    assert len(frame) == 1000
    table = rs.read_servegen()
    first = table[table["start"] == 0.0]
    # Only the first 10-minute window's clients, each to at most 1,000 arrivals (the whole
    # day scaled to 1,000 req/s is 86.4 million).
    assert {start for start, _ in calls} == {0.0} and len(calls) <= len(first)
    assert sum(k for _, k in calls) <= 1000 * len(first)
    # The arrivals come at the first window's (scaled) rate.
    scale = 1000.0 / rs.mean_rate(table)
    rate = scale * first["rate"].sum()
    assert frame["arrival_at"].iloc[-1] == pytest.approx(1000 / rate, rel=0.5)


def test_with_a_cap_above_the_schedule_every_window_is_drawn_as_before():
    table = rs.windows_from_schedule(((300.0, 4.0, 2.0), (300.0, 0.0), (300.0, 9.0, 0.5)),
                                     family="weibull")
    whole = rs.windowed(np.random.default_rng(3), table)
    np.testing.assert_array_equal(rs.windowed(np.random.default_rng(3), table, n=10**6), whole)
    # A cap the first windows reach: the same process, drawn only that far.
    lazy = [rs.windowed(np.random.default_rng(s), table, n=1500)[-1] for s in range(30)]
    full = [rs.windowed(np.random.default_rng(s), table)[1499] for s in range(30)]
    assert len(rs.windowed(np.random.default_rng(0), table, n=1500)) == 1500
    assert abs(np.mean(lazy) - np.mean(full)) < 4 * np.std(full) / np.sqrt(15)


def test_existing_servegen_configs_draw_as_before():
    """A ServeGen hour (no cap) is every window drawn in turn, joined, sorted and cut: the
    draws of the code before the lazy cap (bit for bit)."""
    cfg = servegen(rate=20.0, duration=3600.0)
    windows = cfg.window_table()
    rng = np.random.default_rng(5)
    scale = 20.0 / rs.mean_rate(windows)
    parts = [rs.window_arrivals(rng, s, sec, r * scale, cv, fam) for s, sec, r, cv, fam in zip(
        windows["start"], windows["seconds"], windows["rate"], windows["cv"], windows["family"])
        if s < 3600.0]
    times = np.sort(np.concatenate(parts))
    expected = times[times < 3600.0]
    np.testing.assert_array_equal(
        generate(cfg, np.random.default_rng(5))["arrival_at"].to_numpy(), expected)
