"""LoRA adapters: LRU residency, load delays, the max_loras rule, the step cost, KV memory,
configs, workloads and routers (simsched.engine.lora, simsched.config.lora)."""

import math

import numpy as np
import pandas as pd
import pytest

from simsched.api import simulate
from simsched.cluster.cluster import replica_specs
from simsched.config import SimConfig
from simsched.config.lora import LoRAConfig
from simsched.cost import hardware
from simsched.engine.lora import AdapterCache, adapter_bytes, lora_kv_blocks
from simsched.workloads.workload import WorkloadConfig, generate


def table(rows):
    """A request table from (arrival_at, prompt, output, adapter) rows."""
    return pd.DataFrame(rows, columns=["arrival_at", "num_prompt_tokens", "num_output_tokens",
                                       "adapter"])


def config(**lora):
    return SimConfig().replace(cost_model="linear", num_blocks=2000,
                               lora=LoRAConfig(**lora))


# ----------------------------------------------------------------------- residency
def test_lru_residency_follows_a_hand_built_sequence():
    cache = AdapterCache(max_loras=2, max_cpu_loras=3)
    seq = [(0, "disk"), (1, "disk"), (0, "gpu"),   # GPU [1, 0]
           (2, "disk"),                            # evicts 1 (LRU) from the GPU; CPU [1, 0, 2]
           (1, "cpu"),                             # evicts 0 from the GPU; back from host memory
           (3, "disk"),                            # evicts 2 from GPU; CPU full: drops 0
           (0, "disk"),                            # evicts 1 from GPU; CPU drops 2, not GPU's 3
           (2, "disk"),                            # evicts 3 from GPU; CPU drops 1
           (3, "cpu")]                             # evicts 0 from GPU
    for adapter, source in seq:
        assert cache.activate(adapter) == source, adapter
    assert list(cache.gpu) == [2, 3]
    assert list(cache.cpu) == [0, 2, 3]
    assert cache.num_loads == {"cpu": 2, "disk": 6}


def test_pinned_adapters_are_never_evicted_and_too_many_is_an_error():
    cache = AdapterCache(max_loras=2, max_cpu_loras=2)
    cache.activate(0)
    cache.activate(1)
    cache.activate(0)                       # 1 is now least recently used
    assert cache.activate(2, pinned={1, 2}) == "disk"
    assert list(cache.gpu) == [1, 2]        # 0 went, though 1 was older
    with pytest.raises(RuntimeError, match="GPU slots"):
        cache.activate(3, pinned={1, 2, 3})
    with pytest.raises(ValueError, match="max_cpu_loras"):
        AdapterCache(3, 2)


# ----------------------------------------------------------------------- load delays
def ttfts(cfg, rows):
    df = simulate(cfg, table(rows)).requests.sort_values("request_id")
    return (df.first_token_at - df.arrival_at).to_numpy()


def test_a_cold_adapter_delays_exactly_its_load_time_on_an_idle_replica():
    cfg = config(max_loras=1, max_cpu_loras=2, disk_gbps=1.5, disk_latency=0.02,
                 host_to_gpu_gbps=20.0, load_latency=0.003)
    lora = cfg.scheduler.lora
    size = adapter_bytes(cfg.hardware, lora, 16)
    from_cpu = size / 20e9 + 0.003
    from_disk = from_cpu + size / 1.5e9 + 0.02
    # Each request arrives after the previous one finished (an idle replica every time):
    # adapter 0 cold (disk), 0 warm (GPU), 1 cold (disk, evicts 0 to host memory), 0 (host).
    rows = [(0.0, 100, 4, 0), (10.0, 100, 4, 0), (20.0, 100, 4, 1), (30.0, 100, 4, 0)]
    t = ttfts(cfg, rows)
    warm = t[1]
    assert t[0] - warm == pytest.approx(from_disk, rel=1e-9, abs=1e-12)
    assert t[2] - warm == pytest.approx(from_disk, rel=1e-9, abs=1e-12)
    assert t[3] - warm == pytest.approx(from_cpu, rel=1e-9, abs=1e-12)
    # The requests frame splits it out of the TTFT; the run's info counts the loads.
    res = simulate(cfg, table(rows))
    assert res.requests.sort_values("request_id").lora_load_time.tolist() == pytest.approx(
        [from_disk, 0.0, from_disk, from_cpu])
    assert (res.info["lora_num_loads_disk"], res.info["lora_num_loads_cpu"]) == (2, 1)
    assert res.info["lora_load_time"] == pytest.approx(2 * from_disk + from_cpu)
    # Without LoRA the same prompt takes exactly the warm time less the adapters' step cost.
    base = ttfts(SimConfig().replace(cost_model="linear", num_blocks=2000),
                 [(0.0, 100, 4, -1)])[0]
    assert warm - base == pytest.approx(lora.step_overhead_time + size / hardware.GPUS[
        cfg.hardware.gpu].mem_bandwidth, rel=1e-9)


def test_base_model_requests_pay_nothing_and_keep_results_bit_identical():
    rows = [(0.05 * i, 50 + 7 * i, 20, -1) for i in range(40)]
    on = simulate(config(max_loras=2), table(rows)).requests
    off = simulate(SimConfig().replace(cost_model="linear", num_blocks=2000),
                   table(rows).drop(columns="adapter")).requests
    cols = ["request_id", "first_token_at", "finished_at", "first_scheduled_at"]
    pd.testing.assert_frame_equal(on[cols], off[cols])
    assert (on.adapter == -1).all() if "adapter" in on else True


# ----------------------------------------------------------------------- max_loras
@pytest.mark.parametrize("max_loras", [1, 2, 3])
def test_at_most_max_loras_distinct_adapters_in_any_step(max_loras):
    rng = np.random.default_rng(1)
    n = 300
    rows = list(zip(np.sort(rng.uniform(0, 5, n)), rng.integers(20, 300, n).tolist(),
                    rng.integers(5, 60, n).tolist(), rng.integers(-1, 6, n).tolist()))
    cfg = config(max_loras=max_loras, max_cpu_loras=6).replace(check_invariants=True)
    res = simulate(cfg, table(rows), record_steps=True)
    assert (res.requests.status == "finished").all()
    steps = res.steps.merge(res.requests[["request_id", "adapter"]], on="request_id")
    distinct = steps[steps.adapter >= 0].groupby("step").adapter.nunique()
    assert distinct.max() == max_loras          # reached, never exceeded
    # Without the rule (enough slots for all six adapters) steps do batch more.
    if max_loras < 6:
        free = simulate(config(max_loras=6), table(rows), record_steps=True)
        steps = free.steps.merge(free.requests[["request_id", "adapter"]], on="request_id")
        assert steps[steps.adapter >= 0].groupby("step").adapter.nunique().max() > max_loras


# ----------------------------------------------------------------------- costs and memory
def test_adapter_slots_take_kv_blocks_and_the_size_follows_the_model():
    hw = SimConfig().hardware                    # llama-2-7b: 32 layers, hidden 4096, MHA
    lora = LoRAConfig(max_loras=4, ranks=(8, 32))
    assert adapter_bytes(hw, lora, 16) == 32 * 16 * (4 * 4096 + 4 * 4096) * 2
    plain = SimConfig().replace(cost_model="linear")
    with_lora = plain.replace(lora=lora)
    taken = lora_kv_blocks(hw, lora, 16)
    assert taken == math.ceil(4 * adapter_bytes(hw, lora, 32) / (hardware.kv_bytes_per_token(hw)
                                                                 * 16))
    assert replica_specs(with_lora)[0].num_blocks == replica_specs(plain)[0].num_blocks - taken
    with pytest.raises(ValueError, match="max_loras"):
        replica_specs(plain.replace(lora=LoRAConfig(max_loras=400, ranks=(256,))))


def test_more_distinct_adapters_cost_more_per_step():
    # Two requests decoding together: one adapter vs two distinct adapters (both warm).
    def e2e(adapters, **kw):
        rows = [(0.0, 64, 50, adapters[0]), (0.0, 64, 50, adapters[1])]
        df = simulate(config(max_loras=2, **kw), table(rows)).requests
        return df.finished_at.max()
    one, two = e2e((0, 0)), e2e((0, 1))
    size = adapter_bytes(SimConfig().hardware, LoRAConfig(), 16)
    # The second adapter: one more disk load and its weights read once per step (50 steps: the
    # prefill's, with the first token, and 49 decodes).
    extra = size / 25e9 + 1e-3 + size / 2e9 + 10e-3 + 50 * size / 2039e9
    assert two - one == pytest.approx(extra, rel=1e-6)
    assert e2e((0, 1), time_per_token_rank=1e-6) > two


# ----------------------------------------------------------------------- config, workload
def test_lora_config_is_checked_and_round_trips():
    with pytest.raises(ValueError, match="scheduler.lora.max_loras"):
        LoRAConfig(max_loras=0)
    with pytest.raises(ValueError, match="max_cpu_loras"):
        LoRAConfig(max_loras=4, max_cpu_loras=2)
    with pytest.raises(ValueError, match="ranks"):
        LoRAConfig(ranks=())
    with pytest.raises(ValueError, match="preemption_mode='swap'"):
        SimConfig().replace(lora=LoRAConfig(), preemption_mode="swap")
    with pytest.raises(ValueError, match="cluster.roles"):
        SimConfig().replace(lora=LoRAConfig(), num_replicas=2, roles=("prefill", "decode"))
    cfg = SimConfig().replace(lora=LoRAConfig(max_loras=3, ranks=(8, 16)), num_adapters=10)
    assert SimConfig.from_json(cfg.to_json()) == cfg
    assert SimConfig().replace(lora={"max_loras": 2}).scheduler.lora == LoRAConfig(max_loras=2)


def test_workload_draws_zipf_adapters_last():
    plain = generate(WorkloadConfig(num_requests=4000), np.random.default_rng(3))
    zipf = generate(WorkloadConfig(num_requests=4000, num_adapters=8, adapter_zipf=1.2),
                    np.random.default_rng(3))
    pd.testing.assert_frame_equal(plain, zipf.drop(columns="adapter"))
    counts = np.bincount(zipf.adapter, minlength=8) / 4000
    expect = 1 / np.arange(1, 9) ** 1.2
    assert np.allclose(counts, expect / expect.sum(), atol=0.02)
    with pytest.raises(ValueError, match="workload.num_adapters"):
        WorkloadConfig(num_adapters=-1)


def test_adapter_column_is_checked_and_needs_a_lora_config():
    with pytest.raises(ValueError, match=r"requests\[1\].adapter"):
        simulate(config(), table([(0.0, 10, 5, 0), (0.1, 10, 5, 1.5)]))
    with pytest.raises(ValueError, match="scheduler.lora is None"):
        simulate(SimConfig().replace(cost_model="linear"), table([(0.0, 10, 5, 0)]))


# ----------------------------------------------------------------------- routers
def routed(router, rows, **kw):
    cfg = config(max_loras=2, max_cpu_loras=4).replace(num_replicas=4, router=router, **kw)
    res = simulate(cfg, table(rows))
    return res


def test_lora_affinity_sends_an_adapter_where_it_is_loaded():
    rng = np.random.default_rng(0)
    n = 400
    rows = list(zip(np.sort(rng.uniform(0, 20, n)), rng.integers(20, 200, n).tolist(),
                    rng.integers(5, 40, n).tolist(), rng.integers(0, 8, n).tolist()))
    aff, rnd = routed("lora_affinity", rows), routed("random", rows)
    loads = {name: r.info["lora_num_loads_cpu"] + r.info["lora_num_loads_disk"]
             for name, r in (("affinity", aff), ("random", rnd))}
    assert loads["affinity"] < loads["random"] / 3
    # Each adapter mostly stays on one replica.
    share = aff.requests.groupby("adapter").replica.agg(lambda s: s.value_counts().iloc[0]
                                                        / len(s))
    assert share.mean() > 0.8
    # Bounded by load: one hot adapter still spreads over the replicas.
    hot = [(r[0] / 10, r[1], r[2], 0) for r in rows]     # 200 req/s
    spread = routed("lora_affinity", hot).requests.replica.value_counts(normalize=True)
    assert len(spread) >= 3 and spread.max() < 0.75
    # The weighted scorer's adapter term cuts loads too.
    w = routed("weighted", rows, router_options={"weights": {"lora": 1.0, "queue": 0.5}})
    w0 = routed("weighted", rows, router_options={"weights": {"queue": 0.5}})
    assert w.info["lora_num_loads_disk"] + w.info["lora_num_loads_cpu"] \
        < w0.info["lora_num_loads_disk"] + w0.info["lora_num_loads_cpu"]


def test_a_refused_request_is_skipped_and_keeps_its_place():
    # max_loras=1: A (adapter 0) runs long; B (adapter 1) cannot join it, so C (adapter 0) and
    # D (base model), which arrive after B, overtake it (vLLM skips B); E (adapter 2) arrives
    # after B and waits behind it: once adapter 0 is done, B goes first.
    rows = [(0.0, 50, 200, 0), (0.1, 50, 5, 1), (0.2, 50, 100, 0), (0.3, 50, 5, -1),
            (0.4, 50, 5, 2)]
    df = simulate(config(max_loras=1), table(rows)).requests.set_index("request_id")
    a, b, c, d, e = (df.loc[i] for i in range(5))
    assert c.first_scheduled_at < b.first_scheduled_at and d.first_scheduled_at < b.first_scheduled_at
    assert d.first_scheduled_at < 0.5
    assert b.first_scheduled_at >= max(a.finished_at, c.finished_at)
    assert e.first_scheduled_at >= b.finished_at


@pytest.mark.parametrize("policy", ["fcfs", "spf", "max_wait"])
def test_a_restored_request_is_back_in_its_place(policy):
    from simsched.policies import make_queue
    from simsched.policies.queues import HeapQueue
    from simsched.request import Request

    if policy == "max_wait":    # promotion by waiting time: its queue-time order is kept too
        queue = HeapQueue(lambda r, now: (r.num_prompt_tokens, r.id), max_wait=0.25)
        queue.now = 0.5
    else:
        queue = make_queue(policy, {})
    reqs = [Request(i, 0.1 * i, 100 - i, 5) for i in range(5)]
    for r in reqs:
        r.queued_at = r.arrival_at
        queue.push(r, r.arrival_at)
    order = [queue.pop() for _ in range(5)]
    for r in reversed(order):                   # put back in any order
        queue.restore(r)
    assert [queue.pop() for _ in range(5)] == order
    assert policy != "spf" or [r.id for r in order] == [4, 3, 2, 1, 0]


def test_the_command_line_sets_lora_as_json():
    from simsched.cli.configs import parse_set_value

    value = parse_set_value("lora", '{"max_loras": 2, "ranks": [8, 16]}')
    cfg = SimConfig().replace(lora=value)
    assert cfg.scheduler.lora == LoRAConfig(max_loras=2, ranks=(8, 16))
    with pytest.raises(ValueError, match="lora takes a mapping"):
        parse_set_value("lora", "4")


def test_a_trace_file_replays_its_adapter_column(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("arrival_at,num_prompt_tokens,num_output_tokens,adapter\n"
                    "0.0,100,10,3\n0.5,80,10,\n1.0,60,10,0\n")
    workload = WorkloadConfig(name="trace", trace_path=str(path))
    frame = generate(workload, np.random.default_rng(0))
    assert frame.adapter.tolist() == [3, -1, 0]
    res = simulate(config(max_loras=2).replace(workload=workload))
    assert res.requests.sort_values("request_id").adapter.tolist() == [3, -1, 0]
    assert res.info["lora_num_loads_disk"] == 2
    with pytest.raises(ValueError, match="num_adapters=4 would replace"):
        generate(WorkloadConfig(name="trace", trace_path=str(path), num_adapters=4),
                 np.random.default_rng(0))
    path.write_text("arrival_at,num_prompt_tokens,num_output_tokens,adapter\n0.0,100,10,-2\n")
    with pytest.raises(ValueError, match="adapter must be an integer >= 0"):
        generate(workload, np.random.default_rng(0))
