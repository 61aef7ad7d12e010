"""GPUs from AIConfigurator's measured kernel tables: reading rule, profiles, catalog, selection."""

from __future__ import annotations

import dataclasses
import zipfile

import numpy as np
import pytest

import simsched
from simsched import SimConfig
from simsched.config import HardwareConfig
from simsched.config.serialize import from_dict, to_dict
from simsched.cost import aiconfigurator as aic
from simsched.cost import factory
from simsched.cost import hardware as hwmod
from simsched.cost.base import Batch
from simsched.cost.calibrated import CalibratedCostModel
from simsched.cost.profiles import PROFILES

NEW_GPUS = ("b200", "b300", "gb200", "gb300", "rtx-pro-6000")


def _raw(gpu: str) -> dict:
    """The shipped file as stored (no hole filling), to check reads against."""
    with np.load(aic.DATA / f"{gpu}.npz", allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def test_every_gpu_of_the_brief_has_tables_and_a_profile():
    want = {"a100-80gb", "h100-sxm", "h200", "l40s", *NEW_GPUS}
    assert set(aic.gpus()) == want
    for g in want:
        assert PROFILES[f"aic-{g}"].gpu_name == g
    assert aic.manifest()["commit"].startswith("095f58a")


def test_package_data_stays_small():
    total = sum(p.stat().st_size for p in aic.DATA.iterdir())
    # 1.5 MiB of vLLM tables for nine GPUs and 0.6 MiB of SGLang and TensorRT-LLM tables.
    assert total < 2.25 * 2**20, f"{total / 2**20:.1f} MiB of AIConfigurator tables"
    assert "Apache License" in (aic.DATA / "LICENSE").read_text()
    assert "github.com/ai-dynamo/aiconfigurator" in (aic.DATA / "README.md").read_text()


@pytest.mark.parametrize("gpu,dtype", [("b200", "bfloat16"), ("b200", "nvfp4"),
                                       ("h200", "fp8"), ("a100-80gb", "bfloat16")])
def test_gemm_reads_measured_points_exactly_and_interpolates_between(gpu, dtype):
    raw = _raw(gpu)
    m_axis, n_axis, k_axis = list(raw["gemm_m"]), list(raw["gemm_n"]), list(raw["gemm_k"])
    i, j, k = m_axis.index(1024), n_axis.index(4096), k_axis.index(8192)
    cell = float(raw[f"gemm_{dtype}"][i, j, k])
    assert aic.gemm(gpu, dtype, [1024], 4096, 8192)[0] == pytest.approx(cell * 1e-3, rel=1e-12)
    # Between two measured token counts: between their times (piecewise linear in m).
    nxt = m_axis[i + 1]
    lo, hi = (float(raw[f"gemm_{dtype}"][m_axis.index(x), j, k]) * 1e-3 for x in (1024, nxt))
    mid = aic.gemm(gpu, dtype, [(1024 + nxt) / 2], 4096, 8192)[0]
    assert min(lo, hi) <= mid <= max(lo, hi)
    assert mid == pytest.approx((lo + hi) / 2, rel=1e-9)
    # Between two measured widths: the geometric mean of the neighbours (log-log).
    a, b = (float(raw[f"gemm_{dtype}"][i, n_axis.index(x), k]) * 1e-3 for x in (4096, 5120))
    w = (np.log(4500) - np.log(4096)) / (np.log(5120) - np.log(4096))
    assert aic.gemm(gpu, dtype, [1024], 4500, 8192)[0] == pytest.approx(
        np.exp((1 - w) * np.log(a) + w * np.log(b)), rel=1e-9)


def test_gemm_extrapolates_in_proportion_only_outside_the_grid():
    top = int(_raw("b200")["gemm_m"][-1])
    t = aic.gemm("b200", "bfloat16", [top, 2 * top], 4096, 4096)
    assert t[1] == pytest.approx(2 * t[0], rel=1e-12)
    wide = aic.gemm("b200", "bfloat16", [256], 131072, 4096)[0]
    assert wide == pytest.approx(2 * aic.gemm("b200", "bfloat16", [256], 65536, 4096)[0])
    assert aic.gemm("b200", "bfloat16", [0], 4096, 4096)[0] == 0.0
    with pytest.raises(ValueError, match="no measured 'nvfp4' GEMMs"):
        aic.gemm("h200", "nvfp4", [1], 4096, 4096)


def test_attention_reads_measured_points_and_grows_quadratically_past_them():
    raw = _raw("h200")
    heads, isl = list(raw["ctx_heads"]), list(raw["ctx_isl"])
    cell = float(raw["ctx_bfloat16_8_128"][heads.index(32), isl.index(4096)])
    assert aic.context_attention("h200", 32, 8, 128, [4096])[0] == pytest.approx(cell * 1e-3)
    last = aic.context_attention("h200", 32, 8, 128, [isl[-1], 2 * isl[-1]])
    assert last[1] == pytest.approx(4 * last[0])
    # Decode: the chord through the measured times at 1,024 tokens and the longest context.
    batch, a, s = aic.generation_attention("h200", 32, 8, 128)
    grid = raw["gen_bfloat16_8_128"][list(raw["gen_heads"]).index(32)]
    seq = raw["gen_seq"]
    i = list(batch).index(32)
    ok = ~np.isnan(grid[i]) & (seq >= 1024)
    first, last_s = seq[ok][0], seq[ok][-1]
    for ctx, t in ((first, grid[i][ok][0]), (last_s, grid[i][ok][-1])):
        assert a[i] + s[i] * 32 * ctx == pytest.approx(float(t) * 1e-3, rel=1e-6)
    # More KV heads read more bytes: a larger per-token cost.
    assert aic.generation_attention("h200", 32, 4, 128)[2][i] < s[i]


def test_all_reduce_measured_and_the_unmeasured_gpu_count_extrapolated():
    sizes = np.array([4096.0, 2.0**20, 2.0**26])
    assert (np.diff(aic.all_reduce("b200", 8, sizes)) > 0).all()
    assert 8 not in aic.measured_all_reduce_gpus("gb200")
    ring = (2 * 7 / 8) / (2 * 3 / 4)
    np.testing.assert_allclose(aic.all_reduce("gb200", 8, sizes),
                               aic.all_reduce("gb200", 4, sizes) * ring, rtol=1e-12)
    assert "TP [8] extrapolated" in aic.coverage("gb200")["all-reduce"]
    assert (aic.all_reduce("h200", 1, sizes) == 0).all()


def test_catalog_has_the_spec_sheet_facts():
    g = hwmod.GPUS
    assert g["gb200"].nvlink_domain == g["gb300"].nvlink_domain == 72
    assert g["b200"].nvlink_domain == g["h200"].nvlink_domain == 8
    assert g["b300"].fp4_flops > g["b200"].fp4_flops > g["b200"].fp8_flops > g["b200"].peak_flops
    assert g["h100-sxm"].fp8_flops == 2 * 989e12 + 1e12 and g["h100-sxm"].fp4_flops == 0
    assert g["l40s"].nvlink_domain == g["rtx-pro-6000"].nvlink_domain == 1
    table = hwmod.describe()
    for name in NEW_GPUS:
        assert name in table
        assert g[name].kernels == f"aic-{name}" and g[name].calibration == "measured"
    assert "NVLink 5" in table and "PCIe Gen5" in table


def test_new_gpus_run_end_to_end_and_blackwell_is_faster_than_hopper():
    hw = {gpu: HardwareConfig(model="llama-3-8b", gpu=gpu, engine_overhead="none")
          for gpu in ("h200", "b200", "b300", "gb200", "gb300", "rtx-pro-6000")}
    prefill = Batch([4096], [0])
    t = {g: factory.make_cost_model(h).iteration_time(prefill) for g, h in hw.items()}
    assert t["b200"] < t["h200"] and t["gb200"] < t["h200"]
    assert t["rtx-pro-6000"] > t["h200"]          # GDDR7 and a quarter of the B200's FLOP/s
    desc = factory.make_cost_model(hw["b200"]).describe()
    assert "AIConfigurator vLLM kernel tables of the b200" in desc
    res = simsched.simulate(SimConfig().replace(gpu="gb200", tensor_parallel_size=8,
                                                model="llama-3-70b", num_requests=20, rate=5.0,
                                                seed=1))
    assert res.summary()["num_finished"] == 20


def test_kernel_profile_selects_the_tables_and_none_changes_nothing():
    base = HardwareConfig(model="llama-3-8b", gpu="h200")
    same = HardwareConfig(model="llama-3-8b", gpu="h200", kernel_profile=None)
    aicfg = HardwareConfig(model="llama-3-8b", gpu="h200", kernel_profile="aiconfigurator")
    assert hwmod.gpu_spec(same) is hwmod.GPUS["h200"]
    assert hwmod.gpu_spec(aicfg) == dataclasses.replace(hwmod.GPUS["h200"], kernels="aic-h200")
    batches = [Batch([], [], 64, 64000), Batch([2048], [0]), Batch([512], [1000], 16, 20000)]
    default, chosen = factory.make_cost_model(base), factory.make_cost_model(aicfg)
    assert [factory.make_cost_model(same).iteration_time(b) for b in batches] == \
        [default.iteration_time(b) for b in batches]
    assert all(chosen.iteration_time(b) != default.iteration_time(b) for b in batches)
    # The config round-trips through its dict form.
    cfg = SimConfig().replace(gpu="h200", kernel_profile="aiconfigurator")
    assert cfg.hardware.kernel_profile == "aiconfigurator"
    assert from_dict(SimConfig, to_dict(cfg)) == cfg
    # The power-capped H100 reads the H100's tables (and keeps its cap).
    pcap = hwmod.gpu_spec(HardwareConfig(gpu="h100-sxm-pcap", kernel_profile="aiconfigurator"))
    assert pcap.kernels == "aic-h100-sxm" and pcap.prefill_slowdown == hwmod.PCAP_SLOWDOWN


def test_measured_all_reduce_replaces_the_fitted_latency_term():
    spec, gpu = hwmod.MODELS["llama-3-70b"], hwmod.GPUS["b200"]
    m = CalibratedCostModel(spec, gpu, 4, "llama-3-70b")           # vllm_v1
    tokens = 256
    per_call = aic.all_reduce("b200", 4, [tokens * spec.hidden_size * 2])[0]
    part = m.breakdown(Batch([], [], tokens, tokens * 1000))["communication"]
    assert part == pytest.approx((2 * spec.num_layers + 1) * per_call, rel=1e-9)


def test_unmeasured_head_sizes_and_kv_heads_scale_from_the_nearest_measured():
    # phi-2 (head size 80) on a GPU with tables for 64 and 128: the 64 table x 80/64.
    t80 = aic.context_attention("b200", 32, 32, 80, [2048])[0]
    t64 = aic.context_attention("b200", 32, 32, 64, [2048])[0]
    assert t80 == pytest.approx(t64 * 80 / 64)
    # 16 KV heads under 32 query heads (not measured): the 8-KV-head table at 16 query heads
    # (the same 2 query heads per KV head), read at twice the batch, twice the cost per token.
    b16, a16, s16 = aic.generation_attention("b200", 32, 16, 128)
    b8, a8, s8 = aic.generation_attention("b200", 16, 8, 128)
    np.testing.assert_allclose(b16, b8 / 2)
    np.testing.assert_allclose(a16, a8)
    np.testing.assert_allclose(s16, 2 * s8)
    # MHA past the measured 8 heads (Llama-2-7B: 32): the 8-head MHA table at 4x the batch;
    # one sequence costs what four 8-head sequences do, not 4x one 8-head sequence's time.
    bm, am, sm = aic.generation_attention("h200", 32, 32, 128)
    b1, a1, s1 = aic.generation_attention("h200", 8, 8, 128)
    np.testing.assert_allclose(bm, b1 / 4)
    np.testing.assert_allclose(sm, 4 * s1)


def test_reducer_writes_the_same_bytes_for_the_same_arrays(tmp_path):
    from tools.reduce_aiconfigurator import write_npz

    arrays = {"b": np.arange(5, dtype=np.float32), "a": np.ones((2, 3))}
    write_npz(tmp_path / "x.npz", arrays)
    write_npz(tmp_path / "y.npz", dict(reversed(list(arrays.items()))))
    assert (tmp_path / "x.npz").read_bytes() == (tmp_path / "y.npz").read_bytes()
    with zipfile.ZipFile(tmp_path / "x.npz") as z:
        assert [i.date_time for i in z.infolist()] == [(1980, 1, 1, 0, 0, 0)] * 2
    back = np.load(tmp_path / "x.npz", allow_pickle=False)
    np.testing.assert_array_equal(back["b"], arrays["b"])


def test_fp8_and_fp4_weights_and_kv_read_their_own_tables_where_measured():
    base = hwmod.MODELS["llama-3-8b"]
    b200 = hwmod.GPUS["b200"]
    bf16 = CalibratedCostModel(base, b200, 1, None, engine_overhead="none")
    fp8 = CalibratedCostModel(dataclasses.replace(base, weight_dtype="fp8"), b200, 1, None,
                              engine_overhead="none")
    assert fp8.kernels.linear_complete and bf16.kernels.linear_complete
    # The four GEMMs at 4,096 tokens from the FP8 table, plus the derived input quantisation.
    from simsched.cost import calibration as cal

    gemms = sum(aic.gemm("b200", "fp8", [4096], n, k)[0]
                for k, n in cal.gemm_shapes(base, 1)) * base.num_layers
    assert gemms < fp8.kernels.linear[4096] < bf16.kernels.linear[4096]
    # An FP8 KV cache: the FP8-KV decode table (cheaper per cached token than bf16's).
    kv8 = CalibratedCostModel(dataclasses.replace(base, kv_cache_dtype="fp8"), b200, 1, None,
                              engine_overhead="none")
    assert kv8.kernels.dec_s[64] < bf16.kernels.dec_s[64]
    # FP8 weights on the A100 (no FP8 GEMM table): the derived simsched.cost.moe path.
    a100 = dataclasses.replace(hwmod.GPUS["a100-80gb"], kernels="aic-a100-80gb")
    derived = CalibratedCostModel(dataclasses.replace(base, weight_dtype="fp8"), a100, 1, None)
    assert not derived.kernels.linear_complete
    # NVFP4 weights on Blackwell: the NVFP4 table, below FP8 at a prefill's 4,096 tokens; before
    # Blackwell (no FP4 tensor cores, no table) the derived weight-only path.
    fp4 = CalibratedCostModel(dataclasses.replace(base, weight_dtype="nvfp4"), b200, 1, None,
                              engine_overhead="none")
    gemms = sum(aic.gemm("b200", "nvfp4", [4096], n, k)[0]
                for k, n in cal.gemm_shapes(base, 1)) * base.num_layers
    assert fp4.kernels.linear_complete
    assert gemms < fp4.kernels.linear[4096] < fp8.kernels.linear[4096]
    h200 = dataclasses.replace(hwmod.GPUS["h200"], kernels="aic-h200")
    assert not CalibratedCostModel(dataclasses.replace(base, weight_dtype="nvfp4"), h200, 1,
                                   None).kernels.linear_complete


def test_gemm_never_takes_longer_than_with_more_tokens():
    # The Blackwell FP8 tables measure a 1-token GEMM at up to twice the larger token counts
    # after it (and isolated spikes further up); read as measured, the step tables' running maximum carried
    # that to every larger batch. A GEMM can be padded to more rows, so it never takes longer
    # than with them: every point is the least measured time at that many tokens or more.
    for gpu in aic.gpus():
        raw = aic.tables(gpu)                        # holes filled from their neighbours
        m_axis = raw["gemm_m"].astype(float)
        for dtype in aic.GEMM_DTYPES:
            if f"gemm_{dtype}" not in raw:
                continue
            j, k = list(raw["gemm_n"]).index(8192), list(raw["gemm_k"]).index(8192)
            measured = raw[f"gemm_{dtype}"][:, j, k].astype(float) * 1e-3
            t = aic.gemm(gpu, dtype, m_axis, 8192, 8192)
            assert np.all(np.diff(t) >= 0), (gpu, dtype)
            assert np.allclose(t, np.minimum.accumulate(measured[::-1])[::-1], rtol=1e-12)
    raw = _raw("b200")["gemm_fp8"][:, list(_raw("b200")["gemm_n"]).index(8192),
                                   list(_raw("b200")["gemm_k"]).index(8192)]
    assert raw[0] > 1.5 * raw[1:].min()              # the 1-token point the envelope drops
    # So a B200 decode step of an FP8 model is faster than the H200's (its FP8 GEMMs are
    # measured faster from 2 tokens on), not held at the 1-token time.
    step = {}
    for gpu, kernels in (("b200", None), ("h200", "aiconfigurator")):
        hw = HardwareConfig(model="llama-3.1-70b-fp8", gpu=gpu, tensor_parallel_size=4,
                            engine_overhead="none", kernel_profile=kernels)
        step[gpu] = factory.make_cost_model(hw).breakdown(Batch([], [], 16, 16 * 1500))
    assert step["b200"]["linear"] < step["h200"]["linear"]
