"""Every configuration field rejects bad values with a ValueError naming the field and range."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

import simsched
from simsched.config import CacheConfig, ClusterConfig, HardwareConfig, SchedulerConfig, SimConfig
from simsched.policies import QUEUE_POLICIES, VICTIM_POLICIES
from simsched.workloads.workload import WorkloadConfig

SECTIONS = {"scheduler": SchedulerConfig, "cache": CacheConfig, "hardware": HardwareConfig,
            "workload": WorkloadConfig, "cluster": ClusterConfig}

# (section, field, bad value, other fields needed to make the value the only problem,
#  substring the message must contain besides the field name)
BAD = [
    ("scheduler", "style", "eager", {}, "stall_free"),
    ("scheduler", "policy", "lifo", {}, "fcfs"),
    ("scheduler", "policy", ["fcfs"], {}, "fcfs"),
    ("scheduler", "victim_policy", "oldest", {}, "fewest_generated"),
    ("scheduler", "preemption", "yes", {}, "True or False"),
    ("scheduler", "preemption_mode", "discard", {}, "recompute"),
    ("scheduler", "max_num_batched_tokens", 0, {"max_num_seqs": 1}, "[1, inf]"),
    ("scheduler", "max_num_batched_tokens", 2.5, {}, "integer"),
    ("scheduler", "max_num_batched_tokens", 8, {"max_num_seqs": 16}, "max_num_seqs"),
    ("scheduler", "max_num_seqs", 0, {}, "[1, inf]"),
    ("scheduler", "max_num_seqs", True, {}, "integer"),
    ("scheduler", "max_num_prefills", 0, {}, "[1, inf]"),
    ("scheduler", "enable_chunked_prefill", 1, {}, "True or False"),
    ("scheduler", "max_num_preemptions", -1, {}, "[0, inf]"),
    ("scheduler", "admit_after_preemption", 0, {}, "True or False"),
    ("scheduler", "reserve_full_isl", "yes", {}, "True or False"),
    ("scheduler", "plan_ahead", 1, {}, "True, False or None"),
    ("scheduler", "speculative", 3, {}, "SpeculativeConfig"),
    ("scheduler", "policy_options", [("a", 1)], {}, "mapping"),
    ("scheduler", "async_scheduling", 1, {}, "True, False or None"),
    ("cache", "enable_prefix_caching", "yes", {}, "True or False"),
    ("cache", "prefix_hit_rule", "all", {}, "token"),
    ("cache", "watermark_counts_null_block", None, {}, "True or False"),
    ("cache", "prefix_cache_model", "radix", {}, "segments"),
    ("cache", "block_size", 0, {}, "[1, 4096]"),
    ("cache", "block_size", 16.0, {}, "integer"),
    ("cache", "num_blocks", 0, {}, "[1, inf]"),
    ("cache", "num_blocks", -5, {}, "[1, inf]"),
    ("cache", "watermark", 0.9, {}, "[0.0, 0.5]"),
    ("cache", "watermark", -0.1, {}, "[0.0, 0.5]"),
    ("cache", "swap_space_gib", -1.0, {}, "[0.0, inf]"),
    ("cache", "swap_bandwidth_gbps", 0.0, {}, "(0.0, inf]"),
    ("cache", "kv_tiers", 5, {"enable_prefix_caching": True}, "mapping"),
    ("hardware", "model", "gpt-5", {}, "llama-2-7b"),
    ("hardware", "gpu", "tpu-v5", {}, "a100-80gb"),
    ("hardware", "model_spec", 5, {}, "ModelSpec"),
    ("hardware", "model_spec", {"num_layers": 2}, {}, "model_spec"),
    ("hardware", "tensor_parallel_size", 3, {}, "[1, 2, 4, 8]"),
    ("hardware", "tensor_parallel_size", 0, {}, "[1, 64]"),
    ("hardware", "gpu_memory_utilization", 0.0, {}, "(0.0, 1.0]"),
    ("hardware", "gpu_memory_utilization", 1.5, {}, "(0.0, 1.0]"),
    ("hardware", "gpu_memory_utilization", float("nan"), {}, "number"),
    ("hardware", "cost_model", "roofline", {}, "calibrated"),
    ("hardware", "engine_overhead", "fast", {}, "measured_2023"),
    ("hardware", "parallel", 3, {}, "ParallelConfig"),
    ("hardware", "parallel", {"pipeline_parallel_size": 0}, {"model": "mixtral-8x7b"},
     "pipeline_parallel_size"),
    ("hardware", "max_model_len", 0, {}, "[1, inf]"),
    ("hardware", "kernel_profile", "vidur", {}, "aiconfigurator"),
    ("hardware", "kernel_profile", "aiconfigurator", {"gpu": "a100-40gb"},
     "no AIConfigurator kernel tables for hardware.gpu='a100-40gb'"),
    ("hardware", "max_model_len", 10**6, {}, "4096"),
    ("hardware", "all_reduce", "nccl", {}, "['fitted', 'measured', 'auto']"),
    ("hardware", "all_reduce", "measured", {"cost_model": "linear"}, "hardware.cost_model"),
    ("hardware", "profile", 3, {}, "path of a calibrated profile"),
    ("hardware", "profile", "/nonexistent/profile.json", {}, "no such calibrated profile"),
    ("workload", "name", "mmlu", {}, "lesson"),
    ("workload", "rate", -1.0, {}, "> 0"),
    ("workload", "rate", 0.0, {}, "> 0"),
    ("workload", "rate", float("inf"), {}, "finite"),
    ("workload", "num_requests", 0, {}, ">= 1"),
    ("workload", "duration", -3.0, {}, "> 0"),
    ("workload", "arrival", "hawkes", {}, "poisson"),
    ("workload", "cv", 0.0, {"arrival": "gamma"}, "> 0"),
    ("workload", "on_seconds", -1.0, {}, "> 0"),
    ("workload", "off_seconds", 0.0, {}, "> 0"),
    ("workload", "rate_schedule", ((0.0, 1.0),), {"arrival": "piecewise"}, "seconds > 0"),
    ("workload", "gap_family", "normal", {}, "gamma"),
    ("workload", "servegen_model", "m-huge", {"arrival": "servegen"}, "m-large"),
    ("workload", "lengths", "zipf", {}, "lognormal"),
    ("workload", "prompt_len", 0, {}, ">= 1"),
    ("workload", "output_len", -2, {}, ">= 1"),
    ("workload", "prompt_range", (10, 5), {}, "low <= high"),
    ("workload", "output_range", (0, 5), {}, "low <= high"),
    ("workload", "lengths_path", 42, {}, "path"),
    ("workload", "trace_path", 3.5, {}, "path"),
    ("workload", "start", -1.0, {"name": "azure-conv"}, ">= 0"),
    ("workload", "speedup", 0.0, {"name": "azure-conv", "rate": None}, "> 0"),
    ("workload", "max_prompt_tokens", 0, {}, ">= 1"),
    ("workload", "long_prompt_policy", "ignore", {}, "error"),
    ("workload", "num_tenants", 0, {}, ">= 1"),
    ("workload", "tenant_weights", (1.0,), {"num_tenants": 2}, "num_tenants"),
    ("workload", "num_priorities", -1, {}, ">= 1"),
    ("workload", "priority_weights", (-1.0, 2.0), {"num_priorities": 2}, ">= 0"),
    ("workload", "hash_block_size", 0, {}, ">= 1"),
    ("workload", "system_prompt_len", -1, {}, ">= 0"),
    ("workload", "num_prefix_groups", 0, {}, ">= 1"),
    ("workload", "num_turns", ("geometric", 0.5), {"name": "sessions"}, "geometric mean >= 1"),
    ("workload", "think_time", "long", {"name": "sessions"}, "kind one of"),
    ("workload", "num_adapters", -1, {}, ">= 0"),
    ("workload", "adapter_zipf", -1.0, {}, ">= 0"),
    ("scheduler", "lora", 3, {}, "LoRAConfig"),
    ("scheduler", "engine", "tgi", {}, "'sglang'"),
    ("scheduler", "engine_options", {"schedule_policy": "lpm"}, {}, "engine 'vllm' has none"),
]
BAD += [
    ("cluster", "num_replicas", 0, {}, "[1, 100000]"),
    ("cluster", "replicas", "h100", {}, "tuple of mappings"),
    ("cluster", "replicas", ({"gpu": "h100-sxm", "count": 3},), {"num_replicas": 2}, "3"),
    ("cluster", "router", "nearest", {}, "round_robin"),
    ("cluster", "autoscaling", "hpa", {}, "AutoscalingConfig"),
    ("cluster", "autoscaling", {"policy": "magic"}, {}, "policy"),
    ("cluster", "router_options", {"depth": 2}, {"router": "jsq"}, "invalid for router 'jsq'"),
    ("cluster", "refresh_interval", -0.1, {}, "[0.0, inf]"),
    ("cluster", "max_num_queued_per_replica", 0, {}, "[1, inf]"),
    ("cluster", "rate_limit", 0.0, {}, "(0.0, inf]"),
    ("cluster", "burst", 0.5, {"rate_limit": 2.0}, "[1.0, inf]"),
    ("cluster", "roles", ("prefill", "gpu"), {"num_replicas": 2}, "mixed, prefill, decode"),
    ("cluster", "num_prefill_replicas", 3, {"num_replicas": 2, "num_decode_replicas": 1},
     "exceeds"),
    ("cluster", "num_decode_replicas", -1, {}, "[0, "),
    ("cluster", "decode_router", "nearest", {}, "round_robin"),
    ("cluster", "link", "tin_can", {}, "ib200"),
    ("cluster", "link_bandwidth_gbps", 0.0, {}, "(0.0, inf]"),
    ("cluster", "link_latency", -1.0, {}, "[0.0, inf]"),
    ("cluster", "disagg_min_prompt_tokens", -5, {}, "[0, "),
    ("cluster", "kv_remote_tier", {"name": "cpu"}, {}, "'remote'"),
]

SIM_BAD = [
    ("seed", -1, "[0, "),
    ("seed", 1.5, "integer"),
    ("max_sim_time", 0.0, "(0.0, inf]"),
    ("max_sim_time", -2.0, "(0.0, inf]"),
    ("max_sim_time", float("nan"), "number"),
    ("check_invariants", "yes", "True or False"),
    ("scheduler", {"policy": "spf"}, "SchedulerConfig"),
    ("cache", None, "CacheConfig"),
    ("hardware", "a100", "HardwareConfig"),
    ("workload", 3, "WorkloadConfig"),
    ("cluster", {"num_replicas": 2}, "ClusterConfig"),
    ("client", "vllm", "ClientConfig"),     # its fields: tests/test_clients.py
    ("faults", {"ttft_timeout": 1.0}, "FaultsConfig"),     # its fields: tests/test_faults.py
]


def _case_id(case) -> str:
    return f"{case[0]}.{case[1]}={case[2]!r}"


@pytest.mark.parametrize("section, name, value, extra, needle", BAD, ids=map(_case_id, BAD))
def test_bad_field_raises_naming_field(section, name, value, extra, needle):
    with pytest.raises(ValueError) as info:
        SECTIONS[section](**{**extra, name: value})
    message = str(info.value)
    assert f"{section}.{name}" in message
    if needle is not None:
        assert needle in message


@pytest.mark.parametrize("name, value, needle", SIM_BAD, ids=[f"{c[0]}={c[1]!r}" for c in SIM_BAD])
def test_bad_sim_field_raises_naming_field(name, value, needle):
    with pytest.raises(ValueError) as info:
        SimConfig(**{name: value})
    assert name in str(info.value) and needle in str(info.value)


def test_every_field_has_a_bad_value_case():
    """A field added without validation coverage fails here (add a row to BAD)."""
    covered = {(s, n) for s, n, *_ in BAD} | {("sim", n) for n, *_ in SIM_BAD}
    fields = {(s, f.name) for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
    fields |= {("sim", f.name) for f in dataclasses.fields(SimConfig)}
    assert sorted(fields - covered) == []


def test_good_values_at_the_edges_are_accepted():
    SchedulerConfig(max_num_batched_tokens=1, max_num_seqs=1, max_num_preemptions=0,
                    max_num_prefills=1)
    CacheConfig(block_size=1, num_blocks=1, watermark=0.5, swap_space_gib=0.0)
    HardwareConfig(gpu_memory_utilization=1.0, max_model_len=4096)
    SimConfig(seed=0, max_sim_time=math.inf)


def test_unknown_policy_lists_the_known_ones():
    with pytest.raises(ValueError) as info:
        SchedulerConfig(policy="nope")
    for name in QUEUE_POLICIES:
        assert name in str(info.value)
    with pytest.raises(ValueError) as info:
        SchedulerConfig(victim_policy="nope")
    for name in VICTIM_POLICIES:
        assert name in str(info.value)


def test_tensor_parallel_degree_must_divide_heads():
    # Every catalogued model's head counts divide by 1, 2, 4 and 8, the supported degrees.
    with pytest.raises(ValueError, match=r"hardware\.tensor_parallel_size"):
        HardwareConfig(tensor_parallel_size=6)
    HardwareConfig(model="llama-2-13b", tensor_parallel_size=8)  # 40 heads, 40 KV heads: 5 each


def test_weights_that_do_not_fit_fail_at_config_time():
    with pytest.raises(ValueError, match=r"tensor_parallel_size") as info:
        SimConfig(hardware=HardwareConfig(model="llama-2-70b"))
    assert "do not fit" in str(info.value)
    # With an explicit block count the capacity is not derived, so the config is accepted.
    SimConfig(hardware=HardwareConfig(model="llama-2-70b"), cache=CacheConfig(num_blocks=64))
    SimConfig(hardware=HardwareConfig(model="llama-2-70b", tensor_parallel_size=4))


def test_replace_validates_and_names_unknown_fields():
    cfg = SimConfig()
    with pytest.raises(ValueError, match=r"scheduler\.max_num_seqs"):
        cfg.replace(max_num_seqs=0)
    with pytest.raises(ValueError, match="unknown config field 'max_batch'"):
        cfg.replace(max_batch=3)
    with pytest.raises(ValueError, match="unknown config section 'gpu'"):
        cfg.replace(**{"gpu.name": "x"})
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['size'\] in config section"):
        cfg.replace(**{"cache.size": 3})


def test_numpy_scalars_are_accepted_and_normalised():
    cfg = SimConfig().replace(seed=np.int64(3), max_num_seqs=np.int64(4),
                              gpu_memory_utilization=np.float64(0.8), preemption=np.bool_(True))
    assert cfg.seed == 3 and type(cfg.seed) is int
    assert type(cfg.scheduler.max_num_seqs) is int and cfg.scheduler.preemption is True
    assert type(cfg.hardware.gpu_memory_utilization) is float


UNIT = SimConfig(hardware=HardwareConfig(cost_model="unit"))

BAD_REQUESTS = [
    ([(0.0, -1, 3)], r"requests\[0\]\.num_prompt_tokens"),
    ([(0.0, 5, 3), (1.0, 0, 3)], r"requests\[1\]\.num_prompt_tokens"),
    ([(0.0, 5, 0)], r"requests\[0\]\.num_output_tokens"),
    ([(0.0, "abc", 3)], r"requests\[0\]\.num_prompt_tokens"),
    ([(0.0, 2.5, 3)], r"requests\[0\]\.num_prompt_tokens"),
    ([("soon", 5, 3)], r"requests\[0\]\.arrival_at"),
    ([(-1.0, 5, 3)], r"requests\[0\]\.arrival_at"),
    ([(float("nan"), 5, 3)], r"requests\[0\]\.arrival_at"),
    ([(0.0, 5)], r"requests\[0\]"),
    ([{"arrival_at": 0.0, "num_prompt_tokens": 5}], "num_output_tokens"),
    ([(0.0, 5, 3, "high")], r"requests\[0\]\.priority"),
    (pd.DataFrame({"arrival_at": [0.0], "num_prompt_tokens": [5]}), "num_output_tokens"),
    (pd.DataFrame({"arrival_at": [0.0, 1.0], "num_prompt_tokens": [5, np.nan],
                   "num_output_tokens": [3, 3]}), r"requests\[1\]\.num_prompt_tokens"),
]


@pytest.mark.parametrize("requests, pattern", BAD_REQUESTS,
                         ids=[f"case{i}" for i in range(len(BAD_REQUESTS))])
def test_bad_request_rows_name_row_and_field(requests, pattern):
    with pytest.raises(ValueError, match=pattern):
        simsched.simulate(UNIT, requests=requests)


def test_bad_cost_model_and_config_objects():
    with pytest.raises(ValueError, match="iteration_time"):
        simsched.simulate(UNIT, requests=[(0.0, 5, 3)], cost_model=object())
    with pytest.raises(ValueError, match="config must be a SimConfig"):
        simsched.simulate({"rate": 3}, requests=[(0.0, 5, 3)])


def test_empty_request_list_is_refused():
    # An empty list is almost surely a mistake (issue 24 item 12): no all-NaN summary.
    with pytest.raises(ValueError, match="requests is empty"):
        simsched.simulate(UNIT, requests=[])
