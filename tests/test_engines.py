"""The engine choice (scheduler.engine): config, presets, errors, invariants under a small fuzz."""

import numpy as np
import pytest

import simsched
from simsched import SimConfig
from simsched.cluster.cluster import Cluster
from simsched.config import SchedulerConfig
from simsched.cost.base import UnitCostModel
from simsched.engine.invariants import check_final_state
from simsched.api import make_requests
from simsched.request import Content, Request, Status

ENGINES = ["sglang", "trtllm"]


def test_default_engine_is_vllm_and_presets_set_each_engines_defaults():
    assert SimConfig().scheduler.engine == "vllm"
    sg = SimConfig.preset("sglang")
    assert (sg.scheduler.engine, sg.cache.block_size, sg.cache.enable_prefix_caching,
            sg.scheduler.max_num_batched_tokens, sg.hardware.engine_overhead) \
        == ("sglang", 1, True, 8192, "sglang_silicon")
    trt = SimConfig.preset("trtllm")
    assert (trt.scheduler.engine, trt.cache.block_size, trt.scheduler.max_num_seqs,
            trt.scheduler.enable_chunked_prefill) == ("trtllm", 32, 2048, False)


@pytest.mark.parametrize("engine", ENGINES)
def test_config_json_round_trip(engine, tmp_path):
    options = {"sglang": {"schedule_policy": "lpm", "init_new_token_ratio": 0.5},
               "trtllm": {"capacity_scheduler_policy": "MAX_UTILIZATION"}}[engine]
    cfg = SimConfig.preset(engine, seed=3, **{"scheduler.engine_options": options})
    assert SimConfig.from_json(cfg.to_json()) == cfg
    path = tmp_path / "config.json"
    path.write_text(cfg.to_json())
    assert SimConfig.from_json(path) == cfg


@pytest.mark.parametrize("fields, needle", [
    ({"engine": "tgi"}, "scheduler.engine must be one of"),
    ({"engine": "sglang", "engine_options": {"schedule_policy": "sjf"}},
     "scheduler.engine_options.schedule_policy must be one of"),
    ({"engine": "sglang", "engine_options": {"max_prefill_tokens": 0}},
     "scheduler.engine_options.max_prefill_tokens"),
    ({"engine": "sglang", "engine_options": {"new_token_ratio": 0.5}},
     "unknown option(s) ['new_token_ratio'] for engine 'sglang'"),
    ({"engine": "trtllm", "engine_options": {"capacity_scheduler_policy": "greedy"}},
     "capacity_scheduler_policy must be one of"),
    ({"engine": "trtllm", "engine_options": {"schedule_policy": "lpm"}},
     "for engine 'trtllm'"),
    ({"engine": "sglang", "policy": "spf"}, "does not model policy='spf'"),
    ({"engine": "trtllm", "preemption_mode": "swap"}, "does not model preemption_mode='swap'"),
    ({"engine": "sglang", "speculative": {"method": "ngram", "num_speculative_tokens": 2}},
     "does not model speculative"),
    ({"engine_options": {"schedule_policy": "lpm"}}, "engine 'vllm' has none"),
])
def test_bad_engine_fields_raise_clear_errors(fields, needle):
    with pytest.raises(ValueError) as info:
        SchedulerConfig(**fields)
    assert needle in str(info.value)


def test_sglang_needs_page_size_one():
    cfg = SimConfig.preset("sglang", num_requests=5, **{"cache.block_size": 16})
    with pytest.raises(ValueError, match="cache.block_size=1"):
        simsched.simulate(cfg)


def test_engines_refuse_disaggregation():
    with pytest.raises(ValueError, match="engine"):
        SimConfig.preset("sglang", num_replicas=2, num_prefill_replicas=1,
                         num_decode_replicas=1)


def _fuzz_requests(rng, n, shared):
    rows = []
    for i in range(n):
        prompt = int(rng.integers(1, 400))
        output = int(rng.integers(1, 120))
        rows.append(Request(i, float(rng.uniform(0, 2)), prompt, output,
                            content=Content.from_segments(
                                [(("sys", int(rng.integers(0, 3))), min(prompt, 64)),
                                 (("u", i), max(0, prompt - 64))], ("o", i))
                            if shared else None))
    rows.sort(key=lambda r: r.arrival_at)
    for i, r in enumerate(rows):
        r.id = i
    return rows


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("seed", range(4))
def test_invariants_hold_under_a_small_fuzz(engine, seed):
    """KV conservation, budgets and membership after every iteration, all drained at the end."""
    rng = np.random.default_rng(seed)
    options = {"sglang": [{"schedule_policy": p} for p in ("fcfs", "lpm", "dfs-weight", "lof")],
               "trtllm": [{"capacity_scheduler_policy": p}
                          for p in ("GUARANTEED_NO_EVICT", "MAX_UTILIZATION")]}[engine]
    opts = options[seed % len(options)]
    chunked = bool(seed % 2)
    cfg = SimConfig.preset(engine, check_invariants=True, **{
        "scheduler.engine_options": opts, "scheduler.enable_chunked_prefill": chunked,
        "scheduler.max_num_batched_tokens": int(rng.choice([128, 512, 2048])),
        "scheduler.max_num_seqs": int(rng.choice([4, 16, 64])),
        "cache.enable_prefix_caching": bool(seed % 3)})
    requests = _fuzz_requests(rng, 40, shared=seed % 3 != 2)
    num_blocks = int(rng.choice([700, 1500])) // cfg.cache.block_size + 1
    engine_ = Cluster(cfg, requests, UnitCostModel(0.01), num_blocks)
    engine_.run()
    check_final_state(engine_)
    done = [r for r in requests if r.status is Status.FINISHED]
    assert len(done) + sum(r.status is Status.REJECTED for r in requests) == len(requests)
    assert all(r.num_generated == r.num_output_tokens for r in done)


@pytest.mark.parametrize("engine", ENGINES)
def test_engines_run_end_to_end_on_the_calibrated_model(engine):
    res = simsched.simulate(SimConfig.preset(engine, rate=8.0, num_requests=80, seed=0))
    s = res.summary()
    assert s["num_finished"] == 80 and 0 < s["ttft_p50"] < 1.0 and 0 < s["tpot_p50"] < 0.1
