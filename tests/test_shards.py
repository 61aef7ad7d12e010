"""Sharded runs (simsched.cluster.shards): the same results as one process, bit for bit, for any
number of shards; what cannot be exact is refused by name."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import simsched
from simsched import SimConfig
from simsched.analysis.shard_workers import ShardError
from simsched.analysis.stream import read_stream
from simsched.cluster.shards import SHARDABLE_ROUTERS, partition
from tests.golden.make_golden import CASES

ROUTERS = [("jsq", {}), ("least_tokens", {}), ("least_tokens", {"output_tokens": 100}),
           ("least_kv", {}), ("power_of_two", {}), ("power_of_two", {"metric": "tokens"}),
           ("power_of_two", {"metric": "kv_use"}), ("weighted", {}), ("round_robin", {}),
           ("random", {})]


def assert_same_run(a, b) -> None:
    """Every frame and figure of two runs equal, exactly."""
    for name in ("requests", "iterations", "replicas", "preemptions"):
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), check_exact=True)
    sharding = b.info.pop("sharding")
    if not SHARDABLE_ROUTERS[b.config.cluster.router]:
        assert sharding["num_windows"] == 0          # it never reads the snapshot
    assert a.info.keys() == b.info.keys()
    for key, value in a.info.items():
        if isinstance(value, dict):
            assert repr(value) == repr(b.info[key]), key
        else:
            np.testing.assert_array_equal(value, b.info[key], err_msg=key)
    sa, sb = a.summary(), b.summary()
    assert [k for k in sa] == [k for k in sb]
    for key in sa:
        assert sa[key] == sb[key] or (sa[key] != sa[key] and sb[key] != sb[key]), key


# The golden configs (tests/golden) as clusters behind routers reading a snapshot.
GOLDEN_CLUSTERS = [
    ("lesson_fcfs", dict(num_replicas=4, router="least_tokens", refresh_interval=0.05)),
    ("lesson_spf_preempt", dict(num_replicas=3, router="jsq", refresh_interval=0.1)),
    ("swap_newest", dict(num_replicas=3, router="power_of_two", refresh_interval=0.05)),
    ("mlfq_preempt", dict(num_replicas=4, router="least_kv", refresh_interval=0.2)),
    ("fair_tenants", dict(num_replicas=2, router="weighted", refresh_interval=0.05)),
    ("prefill_first_linear", dict(num_replicas=3, router="least_tokens", refresh_interval=0.5,
                                  rate_limit=40.0)),
    ("azure_conv_slice", dict(num_replicas=4, router="jsq", refresh_interval=0.05,
                              replicas=({"gpu": "h100-sxm", "count": 1},))),
]


@pytest.mark.filterwarnings("ignore:.*rejected")
@pytest.mark.parametrize("name,cluster", GOLDEN_CLUSTERS, ids=[c[0] for c in GOLDEN_CLUSTERS])
def test_golden_clusters_sharded_equal_one_process(name, cluster):
    cfg = SimConfig().replace(**{**CASES[name], **cluster})
    cfg = cfg.replace(rate=cfg.workload.rate * cluster["num_replicas"])
    one = simsched.simulate(cfg)
    served = one.requests["replica"]
    assert set(served[served >= 0]) == set(range(cluster["num_replicas"]))     # all in use
    for shards in range(1, min(4, cluster["num_replicas"]) + 1):
        assert_same_run(one, simsched.simulate(cfg, shards=shards, shard_workers="inline"))


def test_worker_processes_give_the_one_process_run():
    cfg = SimConfig().replace(**{**CASES["lesson_spf_preempt"], **dict(
        num_replicas=4, router="least_tokens", refresh_interval=0.05, rate=120.0)})
    one = simsched.simulate(cfg)
    for shards in (2, 4):
        assert_same_run(one, simsched.simulate(cfg, shards=shards))


def fuzz_case(seed: int) -> tuple:
    """A random cluster config and requests; a third of the cases put arrivals exactly on the
    refresh times (ties between the two event chains)."""
    rng = np.random.default_rng(seed)
    router, options = ROUTERS[rng.integers(len(ROUTERS))]
    interval = float(rng.choice([0.01, 0.05, 0.1, 0.25, 0.5]))
    n_rep = int(rng.integers(2, 7))
    changes = dict(num_replicas=n_rep, router=router, router_options=options,
                   refresh_interval=interval, seed=seed,
                   max_num_seqs=int(rng.choice([4, 8, 16, 64])),
                   num_blocks=int(rng.choice([40, 80, 200, 2000])))
    u = rng.random()
    cfg = SimConfig.preset("classic") if u < 0.3 else SimConfig.preset("sglang") if u < 0.4 \
        else SimConfig()
    if cfg.scheduler.engine == "vllm":
        if rng.random() < 0.3:
            changes.update(policy="spf", preemption=True)
        if rng.random() < 0.15:
            changes.update(preemption=True, preemption_mode="swap", victim_policy="newest")
    if rng.random() < 0.2:
        changes.update(rate_limit=float(rng.choice([10.0, 40.0])))
    if rng.random() < 0.3:
        changes.update(replicas=({"gpu": "h100-sxm", "count": 1},))
    if rng.random() < 0.2:
        changes.update(max_num_batched_tokens=256)
    if rng.random() < 0.3:
        changes.update(max_sim_time=float(rng.choice([0.25, 0.5, 1.0, 2.0])))
    cfg = cfg.replace(**changes)
    n = int(rng.integers(50, 250))
    kind = rng.integers(3)
    if kind == 0:
        grid = [0.0]
        for _ in range(n):
            grid.append(grid[-1] + interval)         # the refresh times, summed as SimPy does
        arrival = np.sort(np.array(grid)[rng.integers(0, n, n)])
    elif kind == 1:
        arrival = np.round(np.cumsum(rng.exponential(1 / (20 * n_rep), n)), 2)
    else:
        arrival = np.cumsum(rng.exponential(1 / (15 * n_rep), n))
    requests = list(zip(arrival.tolist(), rng.integers(5, 600, n).tolist(),
                        rng.integers(1, 200, n).tolist()))
    return cfg, requests


def _fuzz(seeds, workers: str = "inline") -> None:
    for seed in seeds:
        cfg, requests = fuzz_case(seed)
        one = simsched.simulate(cfg, requests=requests)
        for shards in range(1, min(4, cfg.cluster.num_replicas) + 1):
            got = simsched.simulate(cfg, requests=requests, shards=shards, shard_workers=workers)
            try:
                assert_same_run(one, got)
            except AssertionError as exc:
                raise AssertionError(f"fuzz seed {seed}, {shards} shards: {exc}") from None


@pytest.mark.filterwarnings("ignore:.*rejected")
def test_fuzzed_clusters_sharded_equal_one_process():
    _fuzz(range(10))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*rejected")
def test_fuzzed_clusters_sharded_equal_one_process_long():
    _fuzz(range(10, 400))
    _fuzz(range(400, 430), workers="process")


def test_partition_deals_replicas_in_turn():
    groups = partition(10, 3)
    assert [list(g) for g in groups] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert [len(g) for g in partition(64, 4)] == [16] * 4


BASE = dict(num_replicas=4, router="jsq", refresh_interval=0.05, rate=40.0, num_requests=50)


@pytest.mark.parametrize("changes,field", [
    (dict(refresh_interval=0.0), "refresh_interval"),
    (dict(router="prefix_affinity"), "cluster.router"),
    (dict(router="session_affinity"), "cluster.router"),
    (dict(max_num_queued_per_replica=4), "max_num_queued_per_replica"),
    (dict(num_replicas=1), "num_replicas"),
    (dict(enable_prefix_caching=True, prefix_cache_model="segments",
          kv_tiers={"tiers": [{"name": "cpu", "capacity_gib": 1.0}]},
          kv_remote_tier={"name": "remote"}), "kv_remote_tier"),
    (dict(autoscaling={"policy": "threshold", "metric": "running", "target": 8.0}),
     "autoscaling"),
    (dict(ttft_timeout=1.0), "faults"),
    (dict(check_invariants=True), "check_invariants"),
])
def test_unshardable_configs_are_refused_by_field(changes, field):
    cfg = SimConfig().replace(**{**BASE, **changes})
    with pytest.raises(ValueError, match=field):
        simsched.simulate(cfg, shards=2, shard_workers="inline")


def test_refusals_of_shard_counts_options_and_workloads(tmp_path):
    cfg = SimConfig().replace(**BASE)
    for shards in (0, 5, 1.5, True):
        with pytest.raises(ValueError, match="shards"):
            simsched.simulate(cfg, shards=shards, shard_workers="inline")
    with pytest.raises(ValueError, match="record_steps"):
        simsched.simulate(cfg, shards=2, record_steps=True)
    with pytest.raises(ValueError, match="shard_workers"):
        simsched.simulate(cfg, shards=2, shard_workers="threads")
    # Prefix-cache content makes request objects the shards cannot share.
    shared = cfg.replace(name="shared-prefix", system_prompt_len=64, num_prefix_groups=2,
                         enable_prefix_caching=True)
    with pytest.raises(ValueError, match="plain workloads"):
        simsched.simulate(shared, shards=2, shard_workers="inline")


class _Failing:
    """A cost model whose iteration times fail in worker processes (the coordinator runs the
    last shard itself)."""

    def __init__(self) -> None:
        self.pid = os.getpid()

    def iteration_time(self, batch) -> float:
        if os.getpid() != self.pid:
            raise RuntimeError("cost model failed on purpose")
        return 0.01


def test_a_failing_shard_raises_its_error_in_the_coordinator():
    cfg = SimConfig().replace(**BASE)
    with pytest.raises(ShardError, match="cost model failed on purpose"):
        simsched.simulate(cfg, cost_model=_Failing(), shards=2)


def test_ray_actors_give_the_one_process_run():
    ray = pytest.importorskip("ray", reason="Ray is not installed (the py3.10/3.13 legs)")
    cfg = SimConfig().replace(**{**BASE, "router": "least_tokens", "num_requests": 200})
    one = simsched.simulate(cfg)
    root = str(Path(__file__).resolve().parent.parent)
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR",
             runtime_env={"env_vars": {"PYTHONPATH": root}})
    try:
        got = simsched.simulate(cfg, shards=2, shard_workers="ray")
    finally:
        ray.shutdown()
    assert_same_run(one, got)


def test_cli_run_with_shards_writes_the_one_process_frames(tmp_path, capsys):
    from simsched.cli import main

    flags = ["run", "--set", "num_replicas=3", "--set", "router=least_tokens", "--set",
             "refresh_interval=0.05", "--rate", "40", "--num-requests", "200"]
    assert main(flags + ["--out", str(tmp_path / "one")]) == 0
    assert main(flags + ["--shards", "3", "--out", str(tmp_path / "three")]) == 0
    for name in ("requests.csv", "iterations.csv", "summary.csv", "replicas.csv"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "three" / name).read_bytes()
    assert main(flags[:-4] + ["--ray", "--out", str(tmp_path / "x")]) == 2
    assert "--shards" in capsys.readouterr().err
    if importlib.util.find_spec("pyarrow") is not None:       # streamed, sharded
        assert main(flags + ["--shards", "2", "--stream", "--out", str(tmp_path / "s")]) == 0
        streamed = read_stream(tmp_path / "s" / "stream")["requests"]
        # round_trip: pandas 2.x's default CSV float parser can be an ulp off the written repr
        one = pd.read_csv(tmp_path / "one" / "requests.csv", float_precision="round_trip")
        np.testing.assert_array_equal(streamed["finished_at"], one["finished_at"])


@pytest.mark.filterwarnings("ignore:.*rejected")
def test_streamed_sharded_run_writes_the_one_process_frames(tmp_path):
    pytest.importorskip("pyarrow")
    cfg = SimConfig().replace(num_replicas=4, router="least_tokens", refresh_interval=0.05,
                              rate=60.0, num_requests=1500, seed=3, rate_limit=50.0,
                              max_num_seqs=8)
    one = simsched.simulate(cfg, stream_to=tmp_path / "one")
    got = simsched.simulate(cfg, stream_to=tmp_path / "sharded", shards=3)
    # Each shard wrote its own parts (the coordinator its shed requests).
    names = {p.name[:9] for p in (tmp_path / "sharded" / "requests").iterdir()}
    assert {"part-s000", "part-s001", "part-s002", "part-0000"} <= names
    assert got.info.pop("sharding")["shards"] == 3 and got.info == one.info
    a, b = read_stream(tmp_path / "one"), read_stream(tmp_path / "sharded")
    for name in ("requests", "iterations", "preemptions"):
        pd.testing.assert_frame_equal(a[name], b[name], check_exact=True)
    # Per-window sums: the same rows, added in another order.
    counts = [c for c in a["windows"].columns if c.startswith("num_")]
    pd.testing.assert_frame_equal(a["windows"][counts], b["windows"][counts], check_exact=True)
    pd.testing.assert_frame_equal(a["windows"], b["windows"], rtol=1e-12)
