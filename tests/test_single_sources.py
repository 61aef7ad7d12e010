"""Names and defaults defined once: adding a cost model is one registry entry that the config, the
CLI and the factory all see; load-metric names, replica specs and the swap-space default each have
one source."""

import numpy as np

import simsched
from simsched.cli import make_parser
from simsched.cluster import routers, state
from simsched.cluster.cluster import Cluster, replica_specs
from simsched.config import HardwareConfig, SchedulerConfig, SimConfig
from simsched.cost import hardware
from simsched.cost.base import UnitCostModel
from simsched.cost.factory import COST_MODELS, make_cost_model
from simsched.engine.kv.cache import KVCacheManager
from simsched.engine.scheduler.core import Scheduler
from simsched.workloads.workload import WorkloadConfig


def test_a_cost_model_registered_once_is_known_to_config_cli_and_factory(monkeypatch):
    monkeypatch.setitem(COST_MODELS, "half", lambda hw: UnitCostModel(0.5))
    hw = HardwareConfig(cost_model="half")                  # the config accepts it
    model = make_cost_model(hw)
    assert isinstance(model, UnitCostModel) and model.time_per_iteration == 0.5
    args = make_parser().parse_args(["run", "--cost-model", "half"])
    assert args.cost_model == "half"
    config = SimConfig(workload=WorkloadConfig(name="lesson", num_requests=5, rate=1.0),
                       hardware=hw)
    assert simsched.simulate(config).summary()["num_finished"] == 5


def test_config_and_factory_share_the_cost_model_names():
    assert simsched.config.COST_MODELS is COST_MODELS
    assert sorted(COST_MODELS) == ["calibrated", "linear", "unit"]


def test_routers_check_load_metrics_against_the_load_views_names():
    for metric in state.METRICS:
        router = routers.ROUTERS["power_of_two"](3, np.random.default_rng(0), metric=metric)
        assert router.metric == metric
    assert routers.METRICS is state.METRICS


def test_a_hand_built_cluster_uses_the_same_spec_builder():
    config = SimConfig()
    reqs = simsched.make_requests([(0.0, 10, 5)])
    built = Cluster(config, reqs, UnitCostModel(), num_blocks=50)
    assert built.replicas[0].scheduler.max_model_len is None          # no limit by default
    assert built.replicas[0].kv.num_blocks == 50
    spec = replica_specs(config)[0]
    assert spec.max_model_len == hardware.max_model_len(config.hardware)
    assert replica_specs(config, UnitCostModel(), 50, None)[0].max_model_len is None
    assert replica_specs(config, max_model_len=300)[0].max_model_len == 300


def test_the_swap_space_default_is_the_configs():
    sched = Scheduler(SchedulerConfig(), KVCacheManager(10, 16))
    assert sched.swap.capacity_bytes == SimConfig().cache.swap_space_gib * 2**30
