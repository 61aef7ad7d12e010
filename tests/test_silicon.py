"""Deployed-model presets, per-part quantisation, sliding windows, measured MoE tables, and the
silicon validation experiment (issue 41)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from simsched import SimConfig, simulate
from simsched.cost import aiconfigurator as aic
from simsched.cost import shapes
from simsched.cost.base import Batch
from simsched.cost.calibrated import CalibratedCostModel
from simsched.cost.hardware import GPUS, MODELS, ModelSpec, kv_capacity_blocks
from experiments import validate_silicon as vs


@pytest.mark.parametrize("name, params", [("gpt-oss-120b", 116.8e9), ("gpt-oss-20b", 20.9e9),
                                          ("kimi-k2.5", 1.03e12),
                                          ("qwen3-235b-a22b-fp8", 235e9),
                                          ("qwen3-32b", 32.8e9), ("minimax-m2.5", 229e9)])
def test_presets_have_their_published_parameter_counts(name, params):
    assert MODELS[name].num_params == pytest.approx(params, rel=0.015)


def test_expert_dtype_prices_only_the_experts():
    kimi = MODELS["kimi-k2.5"]
    bf16 = dataclasses.replace(kimi, expert_dtype="auto")
    experts = shapes.param_counts(kimi)["experts"]
    # INT4 experts take a quarter of bf16's bytes; attention and dense layers stay bf16.
    assert shapes.weight_bytes(bf16) - shapes.weight_bytes(kimi) == pytest.approx(experts * 1.5)
    oss = MODELS["gpt-oss-120b"]
    assert shapes.expert_bytes_per_element(oss) == 0.5 + 1 / 32          # MXFP4 with scales
    assert shapes.weight_bytes_per_element(oss) == 2.0
    with pytest.raises(ValueError, match="expert_dtype"):
        dataclasses.replace(MODELS["llama-3-8b"], expert_dtype="int4")
    with pytest.raises(ValueError, match="expert_dtype must be one of"):
        dataclasses.replace(kimi, expert_dtype="int3")


def test_hybrid_linear_attention_is_refused_clearly():
    from simsched.cost.hardware import model_spec

    with pytest.raises(ValueError, match="hybrid linear attention"):
        model_spec(SimConfig().replace(model="qwen3.5-397b-a17b").hardware)
    config = {"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
              "intermediate_size": 128, "vocab_size": 100,
              "layer_types": ["linear_attention", "full_attention"] * 2}
    with pytest.raises(ValueError, match="hybrid linear attention"):
        ModelSpec.from_hf_config(config)


def test_gpt_oss_config_reads_sliding_window_and_mxfp4_experts():
    config = {"model_type": "gpt_oss", "num_hidden_layers": 4, "hidden_size": 2880,
              "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
              "intermediate_size": 2880, "vocab_size": 201088, "num_local_experts": 32,
              "num_experts_per_tok": 4, "sliding_window": 128,
              "layer_types": ["sliding_attention", "full_attention"] * 2,
              "quantization_config": {"quant_method": "mxfp4"}}
    spec = ModelSpec.from_hf_config(config)
    assert (spec.sliding_window, spec.num_sliding_window_layers) == (128, 2)
    assert spec.expert_dtype == "mxfp4" and spec.weight_dtype == "auto" and spec.attention_sinks


def test_sliding_window_layers_read_and_cache_only_their_window():
    oss = MODELS["gpt-oss-20b"]
    full = dataclasses.replace(oss, sliding_window=0, num_sliding_window_layers=0)
    assert shapes.kv_bytes_per_token(oss) * 2 == shapes.kv_bytes_per_token(full)
    win, dense = (CalibratedCostModel(s, GPUS["h200"], 1) for s in (oss, full))
    long_decode = Batch([], [], 32, 32 * 8000)
    assert win.iteration_time(long_decode) < dense.iteration_time(long_decode)
    long_prefill = Batch([8000], [0], 0, 0)
    assert win.breakdown(long_prefill)["attention"] \
        < 0.6 * dense.breakdown(long_prefill)["attention"]
    # At a context inside the window the two read the same tokens (up to the window charge).
    short = Batch([], [], 8, 8 * 100)
    assert win.iteration_time(short) == pytest.approx(dense.iteration_time(short), rel=0.02)


def test_measured_moe_table_is_read_at_its_grid_points():
    t = aic.tables("h200")
    keys = t["moe_keys"]
    code = aic.MOE_DTYPES.index("fp8_block")
    want = np.array([code, 4096, 1536, 8, 128, 2, 1])
    row = np.flatnonzero((keys == want).all(axis=1))[0]
    tokens = t["moe_tokens"][4:8]
    got = aic.moe("h200", "fp8", 4096, 1536, 8, 128, 2, 1, tokens)
    assert np.allclose(got, t["moe_lat"][row][4:8] * 1e-3)
    assert aic.moe("h200", "fp8", 4096, 1536, 8, 129, 2, 1, tokens) is None   # not measured
    # The aic profile prices Qwen3-235B's experts from the table: a decode step changes, the
    # default (derived) profile does not read it.
    spec = MODELS["qwen3-235b-a22b-fp8"]
    gpu = dataclasses.replace(GPUS["h200"], kernels="aic-h200")
    b = Batch([], [], 32, 32 * 1000)
    measured = CalibratedCostModel(spec, gpu, 2).breakdown(b)["linear"]
    derived = CalibratedCostModel(spec, GPUS["h200"], 2).breakdown(b)["linear"]
    assert measured != derived
    # 94 MoE layers of the measured fused layer are part of the linear time.
    layer = aic.moe("h200", "fp8", 4096, 1536, 8, 128, 2, 1, [32])[0]
    assert measured > 94 * layer


def test_presets_fit_where_the_silicon_rows_ran_them():
    hw = SimConfig().replace(model="gpt-oss-120b", gpu="h100-sxm", tensor_parallel_size=2,
                             max_model_len=10240).hardware
    assert kv_capacity_blocks(hw, 16) > 0
    hw = SimConfig().replace(model="kimi-k2.5", gpu="h200", tensor_parallel_size=8,
                             max_model_len=9472, gpu_memory_utilization=0.95).hardware
    assert kv_capacity_blocks(hw, 16) > 0


def _row(**fields):
    base = dict(id="r", backend="vllm", mode="agg", system="h200_sxm", gpu="h200",
                model="qwen3-235b-a22b-fp8", model_path="Qwen/Qwen3-235B-A22B-FP8",
                precision="fp8", tp_size=4.0, pp_size=1.0, attention_dp_size=np.nan,
                moe_tp_size=4.0, moe_ep_size=1.0, isl=1024, osl=128, concurrency=4.0,
                aic_run=False)
    base.update(fields)
    return next(pd.DataFrame([base]).itertuples())      # rows as the experiment reads them


def test_layouts_follow_the_rows_parallel_columns():
    assert vs.layout(_row())[0] == "tp4"
    label, tp, par = vs.layout(_row(tp_size=1.0, moe_tp_size=2.0))
    assert (label, tp, par.data_parallel_size) == ("tp1-dp2", 1, 2)
    label, tp, par = vs.layout(_row(moe_tp_size=1.0, moe_ep_size=4.0))
    assert label == "tp4-ep4" and par.enable_expert_parallel
    label, tp, par = vs.layout(_row(attention_dp_size=4.0, moe_ep_size=16.0))
    assert (label, tp, par.data_parallel_size) == ("dep4", 1, 4)
    assert vs.why_not(_row(backend="sglang"), "vllm").startswith("engine sglang")
    assert vs.why_not(_row(model=None), "vllm").startswith("no preset")


def test_recipes_come_from_the_launch_scripts():
    r = vs.vllm_recipe(_row(model="gpt-oss-120b", gpu="h200", isl=1024, osl=1024,
                            concurrency=16))
    assert (r.max_num_seqs, r.max_num_batched_tokens, r.max_model_len,
            r.enable_prefix_caching) == (16, 8192, 2068, False)
    r = vs.vllm_recipe(_row(model="minimax-m2.5", gpu="h200"))
    assert (r.max_num_seqs, r.max_num_batched_tokens, r.kv_cache_dtype) == (512, 32768, "fp8")
    assert vs.vllm_recipe(_row(model="qwen3-32b")).source.startswith("vLLM defaults")


def test_experiment_on_a_small_file_and_without_the_data(tmp_path, capsys):
    rows = pd.DataFrame([
        dict(id="a", silicon_data_source="x; silicon_concurrency=4", backend="vllm",
             backend_version="0.18.0", model_path="openai/gpt-oss-120b", system="h200_sxm",
             precision="fp4", mode="agg", isl=1024, osl=64, batch_size=4.0, tp_size=1.0,
             pp_size=1.0, attention_dp_size=1.0, moe_tp_size=1.0, moe_ep_size=1.0,
             silicon_ttft_ms=60.0, silicon_tpot_ms=5.0),
        dict(id="b", silicon_data_source="x", backend="sglang", backend_version="0.5.9",
             model_path="openai/gpt-oss-120b", system="h200_sxm", precision="fp4",
             mode="agg", isl=1024, osl=64, batch_size=4.0, tp_size=1.0, pp_size=1.0,
             attention_dp_size=1.0, moe_tp_size=1.0, moe_ep_size=1.0, silicon_ttft_ms=60.0,
             silicon_tpot_ms=5.0)])
    path = tmp_path / "rows.csv"
    rows.to_csv(path, index=False)
    table = vs.main(["--data", str(path), "--out", str(tmp_path / "out"), "--quiet"])
    assert list(table.id) == ["a", "b"]
    a, b = table.iloc[0], table.iloc[1]
    assert a.expressible and a.layout == "tp1" and a.concurrency == 4
    assert a.sim_ttft_ms > 0 and a.tpot_error == pytest.approx(a.sim_tpot_ms / 5.0 - 1)
    # The measured values are each run's means (validate_silicon's docstring): the simulated
    # mean is compared, the median kept beside it.
    assert vs.STATISTIC == "mean"
    row = next(vs.load(path).itertuples())
    s = simulate(vs.config_of(row, vs.ENGINES["vllm"])[0]).summary()
    assert a.sim_ttft_ms == pytest.approx(s["ttft_mean"] * 1e3, rel=1e-12)
    assert a.sim_tpot_ms == pytest.approx(s["tpot_mean"] * 1e3, rel=1e-12)
    assert a.sim_ttft_p50_ms == pytest.approx(s["ttft_p50"] * 1e3, rel=1e-12)
    assert a.sim_ttft_ms != a.sim_ttft_p50_ms
    assert not b.expressible and "sglang" in b.reason
    assert table.attrs["summary"]["expressible"] == 1
    assert (tmp_path / "out" / "rows.csv").exists()
    empty = vs.main(["--data", str(tmp_path / "missing.csv"), "--out", str(tmp_path / "o")])
    assert empty.empty and "skipped" in capsys.readouterr().out
