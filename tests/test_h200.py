"""The H200 operator fits and the GPUs that take their kernels from them (H100, power-capped H100)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simsched.config import HardwareConfig
from simsched.cost import calibration_h200 as h200
from simsched.cost import factory, report
from simsched.cost import hardware as hwmod
from simsched.cost.base import Batch
from simsched.cost.calibrated import CalibratedCostModel
from simsched.cost.kernels import KernelTables


@pytest.fixture(scope="module")
def errs():
    return report.h200_errors()


def test_h200_fit_targets(errs):
    summary = report.family_summary(errs)
    # Targets of the issue, on the bundled profile (reached: 4.0 / 4.9 / 5.8 %).
    assert summary.loc["linear", "fit"] <= 5.0
    assert summary.loc["prefill attention", "fit"] <= 10.0
    assert summary.loc["decode attention", "fit"] <= 10.0
    # The simulator's own linear term for a profiled model is the measured table.
    assert errs[errs.family == "linear"].table.max() <= 5.0


def test_h200_leave_one_model_out(errs):
    summary = report.family_summary(errs)
    # Fit on three models, predict the fourth: every family and every held-out model <= 10 %.
    assert (summary.loo_worst_model <= 10.0).all(), summary
    assert (summary.loo <= 7.0).all()


def test_before_numbers_match_the_issue(errs):
    # The A100 extrapolation simsched used: attention far off (issue: 98 % and 68 % MAPE).
    summary = report.family_summary(errs)
    assert summary.loc["prefill attention", "before"] > 80
    assert summary.loc["decode attention", "before"] > 60
    assert summary.loc["decode attention", "before_signed"] > 50  # too slow


def test_h100_uses_the_h200_fit_not_the_roofline():
    hw = HardwareConfig(model="llama-2-70b", gpu="h100-sxm", tensor_parallel_size=4)
    m = factory.make_cost_model(hw)
    assert m.kernels.anchor == "h200"
    legacy = CalibratedCostModel(hwmod.MODELS["llama-2-70b"], report._legacy_gpu("h100-sxm"), 4,
                                 "llama-2-70b")
    b = Batch([], [], 128, 128 * 3000)  # attention-heavy: the A100 extrapolation was far off
    assert m.breakdown(b)["attention"] < 0.85 * legacy.breakdown(b)["attention"]
    assert m.iteration_time(b) < legacy.iteration_time(b)
    # Same chip as the H200, less bandwidth: memory-bound decode slower by the bandwidth ratio
    # in its weight-read part, compute-bound prefill attention the same.
    h2 = KernelTables(hwmod.MODELS["llama-2-70b"], hwmod.GPUS["h200"], 4, "llama-2-70b")
    h1 = m.kernels
    assert h1.pre_t0[4096] == pytest.approx(h2.pre_t0[4096], rel=1e-12)
    assert h1.dec_s[1] / h2.dec_s[1] == pytest.approx(4800 / 3350, rel=1e-9)
    assert 1.2 < h1.linear[1] / h2.linear[1] < 4800 / 3350 + 1e-9


def test_h200_decode_step_matches_its_profile_better_than_before():
    spec = hwmod.MODELS["llama-3-8b"]
    new = CalibratedCostModel(spec, hwmod.GPUS["h200"], 1, "llama-3-8b", engine_overhead="none")
    # The old model: the A100 extrapolation with measured_2023, the default engine overhead then.
    old = CalibratedCostModel(spec, report._legacy_gpu("h200"), 1, "llama-3-8b",
                              engine_overhead="measured_2023")
    it = h200.load("iteration")
    b128 = Batch([], [], 128, 128 * 1024)
    # The issue: the old model gave 17.8 ms at batch 128 against ~9.6 ms of operator time.
    assert old.iteration_time(b128) * 1e3 == pytest.approx(17.8, abs=0.1)
    new_err, old_err = [], []
    for r in it.itertuples():
        b = Batch([], [], r.batch, r.batch * r.context)
        new_err.append(new.iteration_time(b) * 1e3 / r.graph_gpu_ms - 1)
        old_err.append(old.iteration_time(b) * 1e3 / r.graph_gpu_ms - 1)
    # The measured step runs kernels the operator profile lacks (unfused fp32 RMSNorm, the KV
    # write, argmax): GPU time only, the model is 8-20 % under, never over.
    assert all(-0.21 < e < 0 for e in new_err)
    assert np.mean(np.abs(new_err)) < np.mean(np.abs(old_err))
    assert max(np.abs(new_err[-2:])) < 0.15 and min(old_err[-2:]) > 0.6


def test_l2_reuse_is_fitted_but_not_used_in_serving():
    coef = h200.fit_all()["decode_attention"]
    small = 10e6
    assert h200.predict_decode_attention(coef, small)[0] < \
        h200.predict_decode_attention(coef, small, l2=False)
    k = KernelTables(hwmod.MODELS["llama-2-7b"], hwmod.GPUS["h200"], 1, "llama-2-7b")
    kv_layer = 2 * 32 * 128 * 2
    per_layer = (k.dec_a[1] + k.dec_s[1] * 1000) / 32
    assert per_layer == pytest.approx(coef["a0"] + coef["s_hbm"] * 1000 * kv_layer, rel=1e-9)


def test_power_cap_slows_prefill_not_decode():
    kw = dict(model="llama-2-70b", tensor_parallel_size=4)
    cap = factory.make_cost_model(HardwareConfig(gpu="h100-sxm-pcap", **kw))
    plain = factory.make_cost_model(HardwareConfig(gpu="h100-sxm", **kw))
    dec = Batch([], [], 16, 16000)
    assert cap.iteration_time(dec) == pytest.approx(plain.iteration_time(dec), rel=1e-12)
    pre = Batch([2048], [0])
    gpu = sum(v for k, v in plain.breakdown(pre).items() if k != "overhead")
    assert cap.iteration_time(pre) - plain.iteration_time(pre) == pytest.approx(
        gpu * (hwmod.PCAP_SLOWDOWN - 1), rel=1e-9)


@pytest.mark.parametrize("gpu", ["h100-sxm", "h200", "h100-sxm-pcap", "a100-80gb"])
@pytest.mark.parametrize("overhead", ["measured_2023", "eager_2023", "overlapped", "none"])
def test_monotone(gpu, overhead):
    # More tokens or sequences never take less time, for every GPU and overhead choice.
    m = factory.make_cost_model(HardwareConfig(model="llama-2-70b", gpu=gpu,
                                               tensor_parallel_size=4, engine_overhead=overhead))
    seqs = [m.iteration_time(Batch([], [], n, n * 700)) for n in range(1, 300, 3)]
    assert np.all(np.diff(seqs) >= 0)
    ctx = [m.iteration_time(Batch([], [], 8, c)) for c in range(8, 60000, 997)]
    assert np.all(np.diff(ctx) >= 0)
    pre = [m.iteration_time(Batch([c], [0])) for c in range(1, 9000, 61)]
    assert np.all(np.diff(pre) >= 0)
    cached = [m.iteration_time(Batch([256], [k])) for k in range(0, 4000, 50)]
    assert np.all(np.diff(cached) >= 0)


@pytest.mark.parametrize("gpu", ["a100-80gb", "h100-sxm", "h200"])
def test_more_tp_never_slower_for_the_linear_part(gpu):
    for model in ("llama-2-70b", "llama-2-7b", "bloom-176b"):
        prev = None
        for tp in hwmod.TP_SIZES:
            try:
                hw = HardwareConfig(model=model, gpu=gpu, tensor_parallel_size=tp)
            except ValueError:
                continue
            lin = np.array(factory.make_cost_model(hw).kernels.linear[1:8193])
            if prev is not None:
                assert np.all(lin <= prev * (1 + 1e-9)), (model, gpu, tp)
            prev = lin


def test_catalog_says_what_is_measured():
    text = hwmod.describe()
    for name, gpu in hwmod.GPUS.items():
        line = next(ln for ln in text.splitlines() if ln.startswith(name + " "))
        assert gpu.calibration in line
    measured = {n for n, g in hwmod.GPUS.items() if g.calibration == "measured"}
    assert {"a100-80gb", "h100-sxm", "h100-sxm-pcap", "h200"} <= measured
    # The A100-40GB scales the A100-80GB's fits; the L40S reads its own measured tables.
    assert hwmod.GPUS["a100-40gb"].calibration == "extrapolated"
    assert "extrapolated" in factory.make_cost_model(HardwareConfig(gpu="a100-40gb")).describe()
    assert hwmod.GPUS["l40s"].kernels == "aic-l40s" and "l40s" in measured
    assert "H200" in factory.make_cost_model(HardwareConfig(gpu="h100-sxm")).describe()
    custom = dataclasses.replace(hwmod.GPUS["a100-80gb"], name="my-gpu")
    assert "user-defined" in CalibratedCostModel(hwmod.MODELS["llama-2-7b"], custom).describe()


def test_bloom_preset():
    spec = hwmod.MODELS["bloom-176b"]
    assert spec.num_kv_heads == spec.num_heads == 112 and spec.head_dim == 128
    assert not spec.rope and not spec.gated_mlp and spec.tied_embeddings
    assert spec.num_params == pytest.approx(176.2e9, rel=0.01)
    hw = HardwareConfig(model="bloom-176b", gpu="a100-80gb", tensor_parallel_size=8)
    assert hwmod.kv_capacity_blocks(hw, 16) > 1000
    with pytest.raises(ValueError, match="tensor_parallel_size"):  # 88 GB of weights per GPU
        hwmod.kv_capacity_blocks(HardwareConfig(model="bloom-176b", tensor_parallel_size=4), 16)
