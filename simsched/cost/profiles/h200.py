"""The H200 profile: this project's H200 operator profiles, CUDA graphs
(:mod:`simsched.cost.calibration_h200`). The H100-SXM and its power-capped variant use it too (same
Hopper chip and clocks, HBM3 at 3.35 TB/s instead of 4.8)."""

from __future__ import annotations

import numpy as np

from simsched.cost import calibration as cal
from simsched.cost import calibration_h200 as h200
from simsched.cost import fits
from simsched.cost.hardware import GPUS
from simsched.cost.profiles import CalibrationProfile

FIT = fits.register(fits.ShippedFit(
    h200.GPU_NAME, h200.fit_all,
    sources=("data/h200/linear.csv", "data/h200/attn_prefill.csv", "data/h200/attn_decode.csv",
             "calibration.py", "calibration_h200.py", "linalg.py", "hardware.py", "specs.py")))


def _past_range(n: np.ndarray, tokens: np.ndarray, meas: np.ndarray, fit: np.ndarray,
                fit_end: float) -> np.ndarray:
    """Measured table interpolated; past its end, the last measured level grown like the fit."""
    per_layer = np.interp(n, tokens, meas)
    return np.where(n > tokens[-1], fit * (meas[-1] / fit_end), per_layer)


class H200Profile(CalibrationProfile):
    """Linear ops measured per profiled (model, TP) plus rope, fitted otherwise; prefill attention
    as launch + per-row + causal FLOPs; decode attention as launch + KV bytes at the HBM rate."""

    name = h200.GPU_NAME
    description = "H200 operator profiles (this project, CUDA graphs)"
    fit = FIT

    def build(self, tables, coef: dict, n: np.ndarray) -> None:
        spec, gpu, tp, model_name = tables.spec, tables.gpu, tables.tp, tables.model_name
        ref = GPUS[h200.GPU_NAME]
        layers, d = spec.num_layers, spec.head_dim
        lin = coef["linear"]
        fit_gpu = h200.predict_linear(lin, spec, tp, gpu, n)
        frame = h200.compute_frame()
        if model_name in h200.H200_MODELS and \
                tp in set(frame.tp[frame.model == model_name]):
            tokens, meas = h200.measured_linear(model_name, tp)
            # The profile has no rope: add the element-wise fit's estimate of it.
            meas = meas + (h200.predict_linear(lin, spec, tp, ref, tokens)
                           - h200.predict_linear(lin, spec, tp, ref, tokens, rope=False))
            fit_ref = h200.predict_linear(lin, spec, tp, ref, n)
            per_layer = _past_range(n, tokens, meas, fit_ref,
                                    h200.predict_linear(lin, spec, tp, ref, tokens[-1:])[0])
            if gpu != ref:
                per_layer = per_layer * fit_gpu / fit_ref
        else:
            per_layer = fit_gpu
        bw_ratio = ref.mem_bandwidth / gpu.mem_bandwidth
        flop_ratio = ref.peak_flops / gpu.peak_flops
        emb_t = lin["elt_const"] + lin["elt_per_byte"] * bw_ratio \
            * 2.0 * n * spec.hidden_size * spec.bytes_per_param
        tables.finish_linear(per_layer, emb_t)

        eff = np.interp(np.log(np.maximum(n, 1.0)), np.log(lin["eff_tokens"]), lin["eff"])
        lm_head = cal.lm_head_roofline(spec, tp, gpu, n) / eff + lin.get("gemm_const", 0.0)
        lm_head[0] = 0.0
        tables.lm_head = lm_head

        # ---- prefill attention: launch + per-row + per-row-head + causal FLOPs (FLOP part
        # scaled by peak FLOP/s); cached tokens add 4 d hq FLOPs per chunk token x cached token.
        pc = coef["prefill_attention"]
        hq = spec.num_heads // tp
        s_flop = pc["s_flop"] * flop_ratio
        t0 = (pc["c0"] + pc["c_tok"] * n + pc["c_tok_head"] * n * hq
              + s_flop * 2.0 * n * n * d * hq) * layers
        t0[0] = 0.0
        tables.pre_t0 = t0
        tables.pre_slope = np.full_like(n, s_flop * 4.0 * d * hq * layers)

        # ---- decode attention: launch + KV bytes at the HBM rate (no L2 reuse in serving)
        dc = coef["decode_attention"]
        kv_layer_bytes = 2 * max(1, spec.num_kv_heads // tp) * d * spec.bytes_per_param
        tables.dec_a = np.full_like(n, dc["a0"] * layers)
        tables.dec_s = np.full_like(n, dc["s_hbm"] * kv_layer_bytes * bw_ratio * layers)
        tables.sat_a, tables.sat_s = float(tables.dec_a[0]), float(tables.dec_s[0])


PROFILE = H200Profile()
