"""llm-d's incrementally kept queue gauges and fused queue + KV terms (simsched.cluster.epp.gauges):
the same routing as counting every replica per request, set only where it is exact, and a queue
change nobody reports fails a checked run."""

from collections import Counter, deque

import numpy as np
import pandas as pd
import pytest

from simsched import SimConfig, simulate
from simsched.analysis.runner import run
from simsched.cluster import cluster as cluster_module
from simsched.cluster.epp.gauges import QueueGauges


def _cfg(**changes) -> SimConfig:
    # Small KV and many sequences: queues build up, requests are preempted and requeued.
    base = SimConfig().replace(num_replicas=6, router="llm-d", rate=260.0, num_requests=1500,
                               seed=3)
    return base.replace(**changes)


def _engine(cfg):
    return run(cfg, keep_engine=True)


def test_plain_cluster_keeps_the_gauges_incrementally_and_routes_as_a_full_count(monkeypatch):
    results, engine = _engine(_cfg())
    assert engine.load.queue_changed is not None
    assert engine.router._gauges.changed is engine.load.queue_changed
    # The same run with every replica counted per request (the reports never set).
    init = cluster_module.Cluster.__init__

    def full_count(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.load.queue_changed = None
        for replica in self.replicas:
            replica.on_queue = None
    monkeypatch.setattr(cluster_module.Cluster, "__init__", full_count)
    again, engine2 = _engine(_cfg())
    assert engine2.router._gauges.changed is None
    pd.testing.assert_frame_equal(results.requests, again.requests)
    assert results.requests.replica.nunique() == 6
    # Queues did build up, so the gauges were not all zero.
    assert (results.iterations.num_waiting > 0).any()


def test_checked_run_verifies_every_read_and_passes():
    results, engine = _engine(_cfg(check_invariants=True))
    assert engine.router.verify_queues
    assert len(results.requests) == 1500


def test_a_queue_change_nobody_reports_fails_a_checked_run(monkeypatch):
    init = cluster_module.Cluster.__init__

    def silent_replica(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.replicas[2].on_queue = None        # its adds and steps go unreported
    monkeypatch.setattr(cluster_module.Cluster, "__init__", silent_replica)
    with pytest.raises(AssertionError, match="replica 2|from the groups"):
        _engine(_cfg(check_invariants=True))


@pytest.mark.parametrize("changes", [
    {"cluster.refresh_interval": 0.05},                           # a scraped snapshot
    {"faults.request_timeout": 5.0},                              # aborts reach the queues
    {"cluster.router": "jsq"},                                    # reads no waiting gauge
])
def test_incremental_gauges_only_where_exact(changes):
    _, engine = _engine(_cfg(num_requests=200, **changes))
    assert engine.load.queue_changed is None
    assert all(r.on_queue is None for r in engine.replicas)


class _Sched:
    def __init__(self):
        self._waiting, self._requeue, self._unseen, self.running = deque(), [], [], []


class _Replica:
    def __init__(self, index):
        self.index, self.scheduler, self.pending = index, _Sched(), deque()

    @property
    def num_waiting(self):
        s = self.scheduler
        return len(s._waiting) + len(s._requeue) + len(s._unseen) + len(self.pending)


@pytest.mark.parametrize("kv_values", [None, (0.0, 0.25, 0.5)])   # continuous; many ties
def test_fused_terms_and_best_equal_a_full_pass_under_random_changes(kv_values):
    rng = np.random.default_rng(0)
    replicas = [_Replica(i) for i in range(16)]
    changed: set[int] = set()
    gauges = QueueGauges(replicas, changed, verify=True)    # (verify: checked inside too)
    full = QueueGauges(replicas)
    kv = [0.0] * 16
    incremental = ties = 0
    for step in range(3000):
        for _ in range(int(rng.integers(0, 4))):        # some replicas change, and report it
            i = int(rng.integers(16))
            queue = [replicas[i].scheduler._waiting, replicas[i].scheduler._requeue,
                     replicas[i].scheduler._unseen, replicas[i].pending][int(rng.integers(4))]
            if queue and rng.random() < 0.5:
                queue.pop()
            else:
                queue.append(0)
            kv[i] = float(rng.random()) if kv_values is None else float(rng.choice(kv_values))
            changed.add(i)
        waiting = gauges.waiting()
        assert waiting == full.waiting()
        incremental += len(gauges._stale) < 16          # only the changed replicas redone
        wq, wk = (2.0, 2.0) if (step // 500) % 2 == 0 else (1.0, 3.0)   # weights held a while
        expected = full.fused_terms(waiting, kv, wq, wk)
        if step % 3:
            assert gauges.fused_terms(waiting, kv, wq, wk) == expected
        else:
            top = max(expected)
            tied = gauges.best(kv, wq, wk)
            assert tied == [i for i, t in enumerate(expected) if t == top]
            ties += len(tied) > 1
        assert {v: len(g) for v, g in gauges._groups.items()} == Counter(waiting)
    assert incremental >= 2999      # all but the first read, which counts every replica
    assert (ties > 50) is (kv_values is not None)


def _generic_only(monkeypatch):
    """Route every request through the general cycle (the fast path off)."""
    from simsched.cluster.epp.router import LlmD
    attach = LlmD._attach

    def no_fast(self, view):
        attach(self, view)
        self._fast = None
    monkeypatch.setattr(LlmD, "_attach", no_fast)


def _fuzzed_clusters(count: int) -> list:
    """The first ``count`` of benchmarks.fuzz's clusters (seed 7) without prefill/decode roles,
    routed by llm-d's default profile on exact state (most share prompt prefixes: the prefix
    scorer's sparse scores)."""
    from benchmarks.fuzz import cluster_variant, random_case
    cases, index = [], 0
    while len(cases) < count:
        cfg, requests = random_case(np.random.default_rng([7, index]))
        cfg, table = cluster_variant(np.random.default_rng([7, index, 1]), cfg, requests)
        index += 1
        if not cfg.cluster.disaggregated:
            cases.append((cfg.replace(**{"cluster.router": "llm-d",
                                         "cluster.refresh_interval": 0.0}), table))
    return cases


@pytest.mark.parametrize("case", _fuzzed_clusters(12), ids=lambda case: "")
def test_fast_cycle_routes_as_the_general_cycle_on_fuzzed_clusters(case, monkeypatch):
    cfg, table = case
    fast, engine = run(cfg, table, keep_engine=True)
    assert engine.router._fast
    _generic_only(monkeypatch)
    general, engine = run(cfg, table, keep_engine=True)
    assert not engine.router._fast
    pd.testing.assert_frame_equal(fast.requests, general.requests)


def _prefix_table(rng, n: int, span: float, max_prompt: int, max_output: int, groups: int,
                  shared: float) -> pd.DataFrame:
    """``n`` requests over ``span`` seconds in ``groups`` prefix groups, each prompt's first
    ``shared`` share its group's."""
    table = pd.DataFrame({"arrival_at": np.sort(rng.uniform(0, span, n)),
                          "num_prompt_tokens": rng.integers(64, max_prompt, n),
                          "num_output_tokens": rng.integers(1, max_output, n),
                          "prefix_group": rng.integers(0, groups, n)})
    table["prefix_len"] = (table.num_prompt_tokens * shared).astype(int)
    return table


def test_fast_cycle_routes_as_the_general_cycle_with_prefixes_and_ties(monkeypatch):
    n = 600
    table = _prefix_table(np.random.default_rng(5), n, 4.0, 900, 60, 6, 0.7)
    cfg = _cfg(num_requests=n, **{"cache.enable_prefix_caching": True})
    fast, engine = run(cfg, table, keep_engine=True)
    assert engine.router._fast
    _generic_only(monkeypatch)
    general, _ = run(cfg, table, keep_engine=True)
    pd.testing.assert_frame_equal(fast.requests, general.requests)
    assert fast.requests.replica.nunique() == 6


def _feature_cases():
    import dataclasses

    from simsched.config.lora import LoRAConfig
    from simsched.config.speculative import SpeculativeConfig
    from simsched.workloads.workload import WorkloadConfig
    base = SimConfig().replace(num_replicas=4, router="llm-d", rate=120.0, num_requests=300,
                               num_blocks=600)
    rng = np.random.default_rng(1)
    n = 300
    table = _prefix_table(rng, n, 2.5, 700, 80, 5, 0.6)
    adapters = table.assign(adapter=rng.integers(0, 6, n))[
        ["arrival_at", "num_prompt_tokens", "num_output_tokens", "adapter"]]
    sessions = WorkloadConfig(name="sessions", num_turns=4, rate=20.0, num_requests=60,
                              think_time=("exponential", 0.5), lengths="uniform",
                              prompt_range=(20, 400), output_range=(10, 80))
    spec = dataclasses.replace(base.scheduler,
                               speculative=SpeculativeConfig(num_speculative_tokens=3))
    return {
        "kv tiers": (base.replace(**{"cache.enable_prefix_caching": True,
                                     "cache.prefix_cache_model": "segments",
                                     "cache.kv_tiers": {"tiers": [{"name": "cpu"}]}}), table),
        "sessions": (SimConfig(workload=sessions).replace(num_replicas=4, router="llm-d",
                                                          enable_prefix_caching=True,
                                                          num_blocks=300), None),
        "lora": (base.replace(cost_model="linear", lora=LoRAConfig(max_loras=2)), adapters),
        "speculative": (dataclasses.replace(base, scheduler=spec), None),
        "async scheduling": (base.replace(**{"scheduler.async_scheduling": True}), None),
        "preemption": (base.replace(num_blocks=150, rate=300.0), None),
    }


@pytest.mark.parametrize("name", list(_feature_cases()))
def test_checked_runs_with_the_features_a_plain_cluster_admits(name):
    # Every queue change in these configurations reaches the gauges: check_invariants compares
    # every read with a full count (a missed report fails, see the planted one above).
    from simsched.api import simulate_checked
    cfg, table = _feature_cases()[name]
    results, engine = simulate_checked(cfg, table)
    assert engine.load.queue_changed is not None and engine.router._fast is not None
    assert (results.iterations.num_waiting > 0).any()
