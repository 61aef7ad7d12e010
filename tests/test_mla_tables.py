"""MLA attention from AIConfigurator's measured vLLM MLA module (H100/H200; issue 41)."""

import dataclasses
import subprocess
from pathlib import Path

import numpy as np
import pytest

from simsched.cost import aiconfigurator as aic
from simsched.cost import aiconfigurator_mla as mla
from simsched.cost import fits, moe
from simsched.cost.deployed import MODELS
from simsched.cost.hardware import GPUS
from simsched.cost.kernels import KernelTables

MIRROR = Path("/work/.mirror/ai-dynamo+aiconfigurator/repo")
KIMI = MODELS["kimi-k2.5"]


def test_context_module_reads_the_measured_cell_exactly():
    t = aic.tables("h200")
    isl = list(t["mla_ctx_isl"])
    h = list(t["mla_ctx_heads"]).index(8)
    for tokens in (1, 1024, 8192, 32768):
        want = t["mla_ctx_bfloat16_bfloat16"][h, 0, isl.index(tokens)] * 1e-3
        got = mla.mla_context_module("h200", 8, [tokens])[0]
        assert got == pytest.approx(want, rel=1e-12)
    # FP8 block-scaled weights and an FP8 KV cache read their own table.
    want = t["mla_ctx_fp8_block_fp8"][h, 0, isl.index(8192)] * 1e-3
    assert mla.mla_context_module("h200", 8, [8192], "fp8", "fp8")[0] == pytest.approx(want)
    # Between measured prompts: log-log, so between the neighbours.
    lo, hi = mla.mla_context_module("h200", 8, [8192, 10240])
    assert lo < mla.mla_context_module("h200", 8, [9000])[0] < hi


def test_generation_slope_is_the_chord_of_the_measured_cells():
    t = aic.tables("h100-sxm")
    grid = t["mla_gen_bfloat16_bfloat16"][list(t["mla_gen_heads"]).index(8)]
    seq, batch = t["mla_gen_seq"].astype(float), t["mla_gen_batch"].astype(float)
    b, _, s = mla.mla_generation_attention("h100-sxm", 8)
    i = list(batch).index(64)
    ok = ~np.isnan(grid[i]) & (seq >= 1024)
    x, y = 64 * seq[ok], grid[i][ok] * 1e-3
    assert s[i] == pytest.approx((y[-1] - y[0]) / (x[-1] - x[0]), rel=1e-12)
    # The latent (576 bf16 channels) read at close to the H100's HBM bandwidth.
    assert 2.0e12 < 1152 / s[i] < 3.35e12


@pytest.mark.skipif(not MIRROR.exists(), reason="AIConfigurator mirror not present")
def test_shipped_cells_match_the_aiconfigurator_parquet():
    import io

    import pandas as pd
    raw = subprocess.run(
        ["git", "--git-dir", str(MIRROR), "show", "HEAD:aic-core/src/aiconfigurator_core/"
         "systems/data/h200_sxm/mla/vllm/0.24.0/mla_generation_module_perf.parquet"],
        check=True, capture_output=True).stdout
    df = pd.read_parquet(io.BytesIO(raw))
    d = df[(df.num_heads == 8) & (df.batch_size == 32) & (df.step == 8192)
           & (df.gemm_type == "bfloat16") & (df.kv_cache_dtype == "bfloat16")]
    t = aic.tables("h200")
    cell = t["mla_gen_bfloat16_bfloat16"][list(t["mla_gen_heads"]).index(8),
                                          list(t["mla_gen_batch"]).index(32),
                                          list(t["mla_gen_seq"]).index(8193)]
    assert cell == pytest.approx(d.latency.min(), rel=5e-4)      # float16


def _kimi(kernels, tp=8):
    gpu = dataclasses.replace(GPUS["h200"], kernels=kernels)
    return KernelTables(KIMI, gpu, tp=tp, table_tokens=16384)


def test_kimi_attention_on_aic_h200_is_the_table_not_the_gqa_approximation(monkeypatch):
    new = _kimi("aic-h200")
    monkeypatch.setattr(moe, "mla_attention", lambda tables, coef, n: False)
    old = _kimi("aic-h200")
    layers, c = KIMI.num_layers, 8192
    # Prefill: the module's growth from 1 to c tokens less the derived projections' growth.
    gemm = moe._Gemm(fits.coefficients("h200")["linear"], KIMI, new.gpu)
    proj = moe._layer_parts(KIMI, 8, gemm, np.array([1.0, c]))[0]
    mod = mla.mla_context_module("h200", 8, [1.0, c])
    want = ((mod[1] - mod[0]) - (proj[1] - proj[0])) * layers
    assert new.pre_t0[c] == pytest.approx(want, rel=1e-9)
    assert abs(new.pre_t0[c] / old.pre_t0[c] - 1.0) > 0.2           # not the GQA approximation
    # Decode: the measured per-KV-token cost at 8 sequences, no separate floor.
    b, _, s = mla.mla_generation_attention("h200", 8)
    assert new.dec_s[8] == pytest.approx(s[list(b).index(8)] * layers, rel=1e-9)
    assert new.sat_a == new.sat_s == 0.0
    # The linear part and the decode fixed part are untouched.
    assert np.array_equal(new.linear, old.linear) and np.array_equal(new.dec_a, old.dec_a)
    # Past the longest measured prompt (32,768 tokens): quadratic in the chunk.
    assert new.pre_t0[65536] == pytest.approx(4.0 * new.pre_t0[32768], rel=1e-12)
    assert new.pre_slope[0] == pytest.approx(2.0 * new.pre_t0[32768] / 32768 ** 2, rel=1e-12)


def test_default_kernels_and_other_shapes_keep_the_approximation(monkeypatch):
    a = _kimi("h200")
    monkeypatch.setattr(moe, "mla_attention", lambda tables, coef, n: False)
    b = _kimi("h200")
    for k in ("pre_t0", "pre_slope", "dec_a", "dec_s"):
        assert np.array_equal(getattr(a, k), getattr(b, k))
    assert moe.mla_table_set(GPUS["h200"]) is None
    assert moe.mla_table_set(dataclasses.replace(GPUS["b200"], kernels="aic-b200")) is None
    assert moe.mla_table_set(dataclasses.replace(GPUS["h200"], kernels="aic-h200")) == "h200"
    assert mla.mla_available("h200", KIMI) and mla.mla_available("h100-sxm", MODELS["deepseek-r1"])
    other = dataclasses.replace(KIMI, q_lora_rank=768)
    assert not mla.mla_available("h200", other)


def test_describe_says_what_is_measured():
    assert aic.coverage("h200")["MLA attention"].startswith("measured")
    assert "extrapolated quadratically" in aic.coverage("h100-sxm")["MLA attention"]
    assert aic.coverage("b200")["MLA attention"].startswith("derived")
