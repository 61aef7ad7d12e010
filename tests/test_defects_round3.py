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
