"""The SGLang and TensorRT-LLM rows of experiments.validate_silicon: registration, recipes from
InferenceX's launch scripts, refusals, and the engine settings a row runs with."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from simsched import SimConfig
from experiments import _silicon_engines as se
from experiments import _silicon_layout as sl
from experiments import validate_silicon as vs


def _row(**fields):
    base = dict(id="r", backend="trtllm", mode="agg", system="h200_sxm", gpu="h200",
                model="deepseek-r1", model_path="deepseek-ai/DeepSeek-R1", precision="fp8",
                tp_size=8.0, pp_size=1.0, attention_dp_size=1.0, moe_tp_size=8.0,
                moe_ep_size=1.0, isl=1024, osl=1024, concurrency=4.0, aic_run=False)
    base.update(fields)
    return next(pd.DataFrame([base]).itertuples())


def test_both_engines_are_registered_with_their_own_profile():
    assert {"vllm", "sglang", "trtllm"} <= set(vs.ENGINES)
    # Each with its preset's profile (SGLang's carries vLLM's silicon terms), as vLLM with the
    # default one.
    for name, profile in (("sglang", "sglang_silicon"), ("trtllm", "trtllm")):
        eng = vs.ENGINES[name]
        assert eng.engine_overhead == profile and eng.configure is not None
        assert SimConfig.preset(name).hardware.engine_overhead == profile
    assert vs.ENGINES["vllm"].configure is None          # vLLM rows: unchanged
    assert vs.ENGINES["vllm"].engine_overhead == SimConfig().hardware.engine_overhead
    assert vs.MODEL_PRESETS[("meta-llama/Llama-3.1-8B-Instruct", "bf16")] == "llama-3.1-8b"


def test_recipes_come_from_the_launch_scripts():
    # dsr1_fp8_h200_trt.sh: max_num_tokens = max(8192, ceil((C + ISL + 64) / 64) x 64).
    s = se.settings(_row(isl=8192, osl=1024, concurrency=64.0), "trtllm")
    assert s["max_num_batched_tokens"] == (64 + 8192 + 64 + 63) // 64 * 64
    assert (s["kv_cache_dtype"], s["prefix"], s["mem"]) == ("fp8", False, 0.75)
    assert se.settings(_row(), "trtllm")["max_num_batched_tokens"] == 8192
    # dsr1_fp8_h200.sh: 512 running requests at 1k/1k, 256 otherwise, 32k chunks.
    s = se.settings(_row(backend="sglang"), "sglang")
    assert (s["max_num_seqs"], s["max_num_batched_tokens"], s["prefix"]) == (512, 32768, False)
    assert s["options"] == {"max_prefill_tokens": 32768}
    assert se.settings(_row(backend="sglang", osl=8192), "sglang")["max_num_seqs"] == 256
    # gptoss_fp4_h200_trt.sh: max_batch_size = C, max_num_tokens 20000.
    s = se.settings(_row(model="gpt-oss-120b", concurrency=16.0), "trtllm")
    assert (s["max_num_seqs"], s["max_num_batched_tokens"]) == (16, 20000)
    # No script: the engine's defaults, said so.
    assert "defaults" in se.settings(_row(model="llama-3.1-8b", gpu="h100-sxm"),
                                     "trtllm")["source"]


def test_rows_beyond_one_node_are_refused_by_name():
    assert se.refuse(_row()) == ""
    assert sl.deployment_gpus(_row(tp_size=1.0, attention_dp_size=8.0, moe_tp_size=1.0,
                                   moe_ep_size=8.0)) == 8
    # InferenceX writes DEP 8 as tp 8 with 8 attention ranks: 8 GPUs (the layout's), not 64.
    dep8 = _row(tp_size=8.0, attention_dp_size=8.0, moe_tp_size=1.0, moe_ep_size=8.0)
    assert sl.deployment_gpus(dep8) == 8 and se.refuse(dep8) == ""
    reason = vs.why_not(_row(tp_size=64.0, moe_ep_size=8.0), "trtllm")
    assert reason.startswith("multi-node deployment (64 GPUs)")
    assert vs.why_not(_row(tp_size=np.nan), "trtllm").startswith("layout")
    assert vs.why_not(_row(backend="sglang"), "trtllm").startswith("engine sglang")


def test_a_row_runs_its_engine_with_the_recipes_settings():
    row = _row(model="llama-3.1-8b", gpu="h100-sxm", system="h100_sxm", tp_size=1.0,
               moe_tp_size=1.0, isl=512, osl=32, concurrency=4.0)
    cfg, _ = vs.config_of(row, vs.ENGINES["trtllm"], num_prompts=8)
    sched, hw = cfg.scheduler, cfg.hardware
    assert (sched.engine, hw.engine_overhead, cfg.cache.block_size) == ("trtllm", "trtllm", 32)
    assert not sched.enable_chunked_prefill and sched.max_num_batched_tokens == 8192
    # free_gpu_memory_fraction 0.9 of what the weights leave: above 0.9 of the whole GPU.
    assert 0.9 < hw.gpu_memory_utilization < 0.99
    cfg, _ = vs.config_of(row._replace(backend="sglang"), vs.ENGINES["sglang"], num_prompts=8)
    assert (cfg.scheduler.engine, cfg.cache.block_size) == ("sglang", 1)
    assert cfg.hardware.gpu_memory_utilization == 0.85
    out = vs.simulate_row(row, vs.ENGINES["trtllm"], num_prompts=8)
    assert out["reason"] == "" and out["sim_ttft_ms"] > 0 and out["sim_tpot_ms"] > 0
    aic = vs.simulate_row(row, vs.ENGINES["trtllm"], num_prompts=8, kernels="aiconfigurator")
    assert aic["sim_tpot_ms"] != pytest.approx(out["sim_tpot_ms"], rel=1e-6)
