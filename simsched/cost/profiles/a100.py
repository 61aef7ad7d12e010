"""The A100-80GB profile: Vidur's A100 kernel profiles (:mod:`simsched.cost.calibration`).

Also the GPU the extrapolated A100-40GB and L40S use (same kernel generation: FlashAttention-2
style ``mma.sync`` kernels, no Hopper TMA/wgmma), and the source of the all-reduce and CPU-overhead
fits every GPU uses.
"""

from __future__ import annotations

import numpy as np

from simsched.cost import calibration as cal
from simsched.cost import fits
from simsched.cost.hardware import GPUS, REFERENCE_GPU
from simsched.cost.profiles import CalibrationProfile

FIT = fits.register(fits.ShippedFit(
    REFERENCE_GPU, cal.fit_all,
    sources=("data/compute.csv", "data/attention_prefill.csv", "data/attention_decode.csv",
             "data/all_reduce.csv", "data/cpu_overheads.csv", "calibration.py", "linalg.py",
             "hardware.py", "specs.py")))


class A100Profile(CalibrationProfile):
    """Linear ops measured per profiled (model, TP), roofline with fitted efficiencies otherwise;
    attention scaled from the 70B-shape TP2 profile by query width, FLOP/s and bandwidth."""

    name = REFERENCE_GPU
    description = "A100-80GB kernel profiles (Vidur, MIT)"
    fit = FIT

    def build(self, tables, coef: dict, n: np.ndarray) -> None:
        spec, gpu, tp, model_name = tables.spec, tables.gpu, tables.tp, tables.model_name
        ref = GPUS[REFERENCE_GPU]
        layers = spec.num_layers
        roof_gpu = cal.predict_linear(coef["linear"], spec, tp, gpu, n)
        profiled = model_name in cal.PROFILED_MODELS and \
            tp in set(cal.load("compute").query("model == @model_name").tp)
        if profiled:
            tokens, meas, emb = cal.measured_linear(model_name, tp)
            per_layer = np.interp(n, tokens, meas)
            emb_t = np.interp(n, tokens, emb)
            # Past the profiled range keep the measured level, grown like the roofline.
            roof_ref = cal.predict_linear(coef["linear"], spec, tp, ref, n)
            past = n > tokens[-1]
            scale_end = meas[-1] / cal.predict_linear(coef["linear"], spec, tp, ref,
                                                      tokens[-1:])[0]
            per_layer = np.where(past, roof_ref * scale_end, per_layer)
            emb_t = np.where(past, emb[-1] * n / tokens[-1], emb_t)
            if gpu != ref:
                # Extrapolation: the measured A100 time times the roofline's GPU/A100 ratio.
                per_layer = per_layer * roof_gpu / roof_ref
        else:
            per_layer = roof_gpu
            bw_ratio = ref.mem_bandwidth / gpu.mem_bandwidth
            emb_t = coef["linear"]["elt_const"] + coef["linear"]["elt_per_byte"] * bw_ratio \
                * 2.0 * n * spec.hidden_size * spec.bytes_per_param
        tables.finish_linear(per_layer, emb_t)

        # ---- LM head by sequence count (A100 efficiency curve)
        eff = np.interp(np.log(np.maximum(n, 1.0)), np.log(coef["linear"]["eff_tokens"]),
                        coef["linear"]["eff"])
        lm_head = cal.lm_head_roofline(spec, tp, gpu, n) / eff
        lm_head[0] = 0.0
        tables.lm_head = lm_head

        # ---- attention, scaled from the reference (70B-shape, TP2) profile
        flop_ratio = ref.peak_flops / gpu.peak_flops
        bw_ratio = ref.mem_bandwidth / gpu.mem_bandwidth
        qdim = spec.num_heads // tp * spec.head_dim
        q_scale = qdim / cal.ATTN_REF_QDIM * flop_ratio * layers
        pc = coef["prefill_attention"]
        t0 = cal.predict_prefill_attention(pc, n, 0.0) * q_scale
        slope = np.interp(n, pc["chunks"], pc["slope"]) * q_scale
        t0 = np.maximum.accumulate(t0)
        t0[0] = 0.0
        kv_layer_bytes = 2 * max(1, spec.num_kv_heads // tp) * spec.head_dim * spec.bytes_per_param
        dc = coef["decode_attention"]
        # Per-sequence fixed cost does not scale with bytes; the per-byte slope does.
        dec_a = np.interp(n, dc["batches"], dc["a"]) * layers
        dec_s = np.interp(n, dc["batches"], dc["s"]) * kv_layer_bytes * bw_ratio * layers
        # The slope is interpolated per byte of the whole batch, so between profiled batch sizes
        # whose slopes fall steeply (16 -> 24) n x slope, the cost of one more cached token per
        # sequence, can dip (by up to 2 %, at 22-24 sequences). A running maximum of n x slope
        # keeps "more sequences of the same context never cost less", as the linear tables do.
        per_seq = np.maximum.accumulate(dec_s * n)
        dip = per_seq > dec_s * n
        dec_s[dip] = per_seq[dip] / n[dip]
        big = n > dc["batches"][-1]
        dec_a = np.where(big, (dc["a0"] + dc["a1"] * n) * layers, dec_a)
        tables.pre_t0, tables.pre_slope, tables.dec_a, tables.dec_s = t0, slope, dec_a, dec_s
        tables.sat_a = dc["sat_a"] * layers
        tables.sat_s = dc["sat_s"] * kv_layer_bytes * bw_ratio * layers


PROFILE = A100Profile()
