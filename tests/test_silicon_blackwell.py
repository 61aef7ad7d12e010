"""Silicon rows on Blackwell GPUs (experiments.validate_silicon): the systems map to simsched's
GPUs, NVIDIA's NVFP4 checkpoints have presets, and InferenceX's Blackwell vLLM scripts are the
recipes. (The Blackwell rows themselves are held out: these rows are made up.)"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from simsched.cost import shapes
from simsched.cost.hardware import MODELS
from experiments import validate_silicon as vs


def _row(**fields):
    base = dict(id="bw", backend="vllm", mode="agg", system="b200_sxm", gpu="b200",
                model="minimax-m2.5", model_path="MiniMaxAI/MiniMax-M2.5", precision="fp8",
                tp_size=4.0, pp_size=1.0, attention_dp_size=np.nan, moe_tp_size=4.0,
                moe_ep_size=1.0, isl=1024, osl=1024, concurrency=8.0, aic_run=False)
    base.update(fields)
    return next(pd.DataFrame([base]).itertuples())


def test_every_gpu_with_tables_is_a_silicon_system():
    assert vs.GPUS["h100_sxm"] == "h100-sxm" and vs.GPUS["h200_sxm"] == "h200"
    assert {vs.GPUS[s] for s in ("b200_sxm", "b300_sxm", "gb200", "gb300")} == \
        {"b200", "b300", "gb200", "gb300"}
    assert vs.why_not(_row(), "vllm") == ""
    assert vs.why_not(_row(gpu=np.nan, system="mi355x"), "vllm").startswith("GPU mi355x")


def test_nvfp4_checkpoints_quantise_the_routed_experts_only():
    for path, preset in (("deepseek-ai/DeepSeek-R1", "deepseek-r1-nvfp4"),
                         ("moonshotai/Kimi-K2.5", "kimi-k2.5-nvfp4"),
                         ("MiniMaxAI/MiniMax-M2.5", "minimax-m2.5-nvfp4")):
        assert vs.MODEL_PRESETS[(path, "fp4")] == vs.MODEL_PRESETS[(path, "nvfp4")] == preset
        spec = MODELS[preset]
        assert (spec.expert_dtype, spec.weight_dtype) == ("nvfp4", "auto")
        assert shapes.expert_bytes_per_element(spec) == 0.5 + 1 / 16      # E2M1 + FP8 scales
        assert shapes.weight_bytes_per_element(spec) == 2.0
    # NVIDIA's exports: Kimi-K2.5 about 590 GB, MiniMax-M2.5 about 126-135 GB.
    assert shapes.weight_bytes(MODELS["kimi-k2.5-nvfp4"]) == pytest.approx(590e9, rel=0.03)
    assert shapes.weight_bytes(MODELS["minimax-m2.5-nvfp4"]) == pytest.approx(130e9, rel=0.05)


def test_blackwell_rows_take_the_blackwell_scripts():
    r = vs.vllm_recipe(_row())
    assert r.source.endswith("minimaxm2.5_fp8_b200.sh")
    assert (r.max_num_batched_tokens, r.kv_cache_dtype, r.enable_prefix_caching,
            r.gpu_memory_utilization) == (2048, "fp8", False, 0.9)
    r = vs.vllm_recipe(_row(gpu="gb300", model="minimax-m2.5-nvfp4", isl=8192))
    assert r.source.endswith("minimaxm2.5_fp4_b300.sh (assumed for gb300)")
    assert r.max_num_batched_tokens == 16384
    r = vs.vllm_recipe(_row(model="gpt-oss-120b", concurrency=64.0))
    assert (r.max_num_seqs, r.kv_cache_dtype, r.max_model_len) == (512, "fp8", 2068)
    kimi = vs.vllm_recipe(_row(model="kimi-k2.5-nvfp4", gpu="b300"))
    dep = vs.vllm_recipe(_row(model="kimi-k2.5-nvfp4", attention_dp_size=8.0))
    assert (kimi.gpu_memory_utilization, dep.gpu_memory_utilization) == (0.9, 0.8)
    assert kimi.source.endswith("kimik2.5_fp4_b300.sh") and kimi.max_num_seqs == 8
    assert vs.vllm_recipe(_row(model="kimi-k2.5")).gpu_memory_utilization == 0.95
    # Models without a Blackwell script: vLLM's defaults, said so.
    assert vs.vllm_recipe(_row(model="llama-3.1-70b-fp8")).source.startswith("vLLM defaults")


def test_an_nvfp4_row_simulates_on_blackwell_with_its_fp8_kv():
    row = _row(model="minimax-m2.5-nvfp4", model_path="MiniMaxAI/MiniMax-M2.5",
               precision="fp4", isl=512, osl=32)
    cfg, _ = vs.config_of(row, vs.ENGINES["vllm"], num_prompts=16)
    assert cfg.hardware.model_spec.kv_cache_dtype == "fp8"
    out = vs.simulate_row(row, vs.ENGINES["vllm"], num_prompts=16)
    assert out["reason"] == "" and out["sim_tpot_ms"] > 0


def test_an_nvl72_rack_is_one_nvlink_domain_for_the_other_engines():
    from experiments import _silicon_engines as se

    wide = dict(backend="trtllm", model="deepseek-r1", tp_size=16.0, moe_tp_size=1.0,
                moe_ep_size=16.0)
    assert se.refuse(_row(gpu="gb200", system="gb200", **wide)) == ""
    assert se.refuse(_row(gpu="b200", **wide)).startswith(
        "multi-node deployment (16 GPUs): serving across nodes is not modelled (one 8-GPU")
    assert se.refuse(_row(gpu="gb300", system="gb300", **dict(wide, tp_size=128.0))) != ""


def test_sglang_and_trtllm_rows_on_blackwell_take_their_scripts():
    from experiments import _silicon_engines as se

    ds = dict(model="deepseek-r1-nvfp4", tp_size=8.0, moe_tp_size=8.0)
    s = se.settings(_row(backend="sglang", **ds), "sglang")
    assert s["source"].endswith("dsr1_fp4_b200.sh")
    assert (s["max_num_seqs"], s["max_num_batched_tokens"], s["mem"], s["kv_cache_dtype"],
            s["prefix"]) == (256, 16384, 0.85, "fp8", False)
    dep = se.settings(_row(backend="sglang", attention_dp_size=8.0, **ds), "sglang")
    assert dep["max_num_batched_tokens"] == 32768
    s = se.settings(_row(backend="sglang", gpu="gb300", model="deepseek-r1", tp_size=4.0),
                    "sglang")
    assert s["source"].endswith("dsr1_fp8_b300.sh (assumed for gb300)")
    assert (s["max_num_seqs"], s["mem"], s["options"]) == (32, 0.95, {"max_prefill_tokens": 8192})
    t = se.settings(_row(backend="trtllm", isl=8192, osl=1024, concurrency=64.0, **ds), "trtllm")
    assert t["source"].endswith("dsr1_fp4_b200_trt.sh") and t["mem"] == 0.8
    assert t["max_num_batched_tokens"] == (64 + 8192 + 64 + 63) // 64 * 64
    fp8 = dict(backend="trtllm", model="deepseek-r1", isl=8192, osl=1024)
    assert se.settings(_row(**fp8), "trtllm")["mem"] == 0.75             # TP 4 at 8k / 1k
    assert se.settings(_row(tp_size=8.0, **fp8), "trtllm")["mem"] == 0.8
    assert se.settings(_row(backend="trtllm", model="gpt-oss-120b"), "trtllm")[
        "max_num_seqs"] == 512
    # No Blackwell script for the model: the engine's defaults, as on Hopper.
    assert "defaults" in se.settings(_row(backend="sglang", model="qwen3-32b"), "sglang")["source"]
