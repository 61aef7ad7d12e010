"""GPU kernel time of an iteration, as tables by token and sequence count, from the measured fits.

Every GPU takes its kernel fits from a *measured anchor* (``GPUSpec.kernels``):

* ``a100-80gb`` (Vidur's A100 kernel profiles, :mod:`simsched.cost.calibration`): the A100-80GB
  itself, and by extrapolation the A100-40GB and the L40S (same kernel generation: FlashAttention-2
  style ``mma.sync`` kernels, no Hopper TMA/wgmma);
* ``h200`` (this project's H200 profiles, :mod:`simsched.cost.calibration_h200`): the H200 itself,
  and the H100-SXM (same Hopper chip and clocks, HBM3 at 3.35 TB/s instead of 4.8) and its
  power-capped variant.

The rule for a GPU that is not its own anchor: compute-bound terms (GEMM roofline, prefill
attention FLOPs) scale with the datasheet peak FLOP/s, memory-bound ones (GEMM weight reads,
element-wise ops, decode attention's KV reads) with HBM bandwidth, fixed launch/latency terms do
not scale; all-reduces always come from the A100 NCCL profile scaled by interconnect bandwidth.

:class:`KernelTables` holds plain numpy arrays; :class:`simsched.cost.calibrated.CalibratedCostModel`
adds the engine's whole-iteration terms and turns them into Python lists for speed.
"""

from __future__ import annotations

import numpy as np

from simsched.cost import calibration as cal
from simsched.cost import calibration_h200 as h200
from simsched.cost.coefcache import anchor_coefficients
from simsched.cost.hardware import GPUS, REFERENCE_GPU, GPUSpec, ModelSpec

MIN_TABLE = 8192
ANCHORS = (REFERENCE_GPU, h200.GPU_NAME)


def _past_range(n: np.ndarray, tokens: np.ndarray, meas: np.ndarray, fit: np.ndarray,
                fit_end: float) -> np.ndarray:
    """Measured table interpolated; past its end, the last measured level grown like the fit."""
    per_layer = np.interp(n, tokens, meas)
    return np.where(n > tokens[-1], fit * (meas[-1] / fit_end), per_layer)


class KernelTables:
    """Per-iteration GPU kernel seconds of ``spec`` on ``gpu`` at TP ``tp``, by token count.

    Attributes (numpy arrays indexed by token or sequence count, all layers included): ``linear``,
    ``comm`` (two all-reduces per layer), ``emb`` (token embedding), ``lm_head`` (one logit row per
    sequence), ``pre_t0`` / ``pre_slope`` (prefill attention: causal time of a chunk, and cost per
    chunk token x cached token), ``dec_a`` / ``dec_s`` (decode attention by sequence count: fixed
    part and cost per cached token read) with the floor ``sat_a + sat_s x cached tokens``.
    ``coefficients`` maps anchor names to fitted coefficients (default: the coefficient cache;
    an A100 coefficient dict as :func:`simsched.cost.calibration.fit_all` returns also works).
    """

    def __init__(self, spec: ModelSpec, gpu: GPUSpec, tp: int = 1, model_name: str | None = None,
                 coefficients: dict | None = None, table_tokens: int | None = None) -> None:
        if not isinstance(spec, ModelSpec):
            raise ValueError(f"spec must be a ModelSpec, got {type(spec).__name__}")
        if not isinstance(gpu, GPUSpec):
            raise ValueError(f"gpu must be a GPUSpec, got {type(gpu).__name__}")
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tp must be a positive integer, got {tp!r}")
        if gpu.kernels not in ANCHORS:
            raise ValueError(f"gpu.kernels must be one of {list(ANCHORS)}, got {gpu.kernels!r}")
        if coefficients is None or "linear" in coefficients:
            # Only the anchors this GPU needs (its own, and the A100 for the all-reduces) are
            # fitted or read; a plain A100 coefficient dict (as fit_all() returns) stands for it.
            needed = {REFERENCE_GPU: coefficients or anchor_coefficients(REFERENCE_GPU)}
            if gpu.kernels != REFERENCE_GPU:
                needed[gpu.kernels] = anchor_coefficients(gpu.kernels)
            coefficients = needed
        self.spec, self.gpu, self.tp, self.model_name = spec, gpu, tp, model_name
        self.anchor = gpu.kernels
        self.size = max(MIN_TABLE, spec.max_context, table_tokens or 0) + 1
        n = np.arange(self.size, dtype=float)
        if self.anchor == REFERENCE_GPU:
            self._a100(coefficients[REFERENCE_GPU], n)
        else:
            self._h200(coefficients[h200.GPU_NAME], n)
        # ---- tensor-parallel all-reduces: after attention and after the MLP in every layer
        ref = GPUS[REFERENCE_GPU]
        link_ratio = ref.interconnect_bandwidth / gpu.interconnect_bandwidth
        msg = n * spec.hidden_size * spec.bytes_per_param
        comm = 2 * spec.num_layers * cal.predict_all_reduce(
            coefficients[REFERENCE_GPU]["all_reduce"], tp, msg, link_ratio)
        comm = np.maximum.accumulate(comm)
        comm[0] = 0.0
        self.comm = comm
        self.num_collectives = 2 * spec.num_layers if tp > 1 else 0

    # ------------------------------------------------------------------ A100 anchor

    def _a100(self, coef: dict, n: np.ndarray) -> None:
        spec, gpu, tp, model_name = self.spec, self.gpu, self.tp, self.model_name
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
        self._finish_linear(per_layer, emb_t)

        # ---- LM head by sequence count (A100 efficiency curve)
        eff = np.interp(np.log(np.maximum(n, 1.0)), np.log(coef["linear"]["eff_tokens"]),
                        coef["linear"]["eff"])
        lm_head = cal.lm_head_roofline(spec, tp, gpu, n) / eff
        lm_head[0] = 0.0
        self.lm_head = lm_head

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
        big = n > dc["batches"][-1]
        dec_a = np.where(big, (dc["a0"] + dc["a1"] * n) * layers, dec_a)
        self.pre_t0, self.pre_slope, self.dec_a, self.dec_s = t0, slope, dec_a, dec_s
        self.sat_a = dc["sat_a"] * layers
        self.sat_s = dc["sat_s"] * kv_layer_bytes * bw_ratio * layers

    def _finish_linear(self, per_layer: np.ndarray, emb_t: np.ndarray) -> None:
        per_layer[0] = 0.0
        emb_t[0] = 0.0
        # Measured kernels jitter by a few percent between neighbouring token counts; a running
        # maximum keeps "more tokens never cost less" without moving any point by more than that.
        per_layer = np.maximum.accumulate(per_layer)
        self.emb = np.maximum.accumulate(emb_t)
        self.linear = per_layer * self.spec.num_layers

    # ------------------------------------------------------------------ H200 anchor

    def _h200(self, coef: dict, n: np.ndarray) -> None:
        spec, gpu, tp, model_name = self.spec, self.gpu, self.tp, self.model_name
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
        self._finish_linear(per_layer, emb_t)

        eff = np.interp(np.log(np.maximum(n, 1.0)), np.log(lin["eff_tokens"]), lin["eff"])
        lm_head = cal.lm_head_roofline(spec, tp, gpu, n) / eff + lin.get("gemm_const", 0.0)
        lm_head[0] = 0.0
        self.lm_head = lm_head

        # ---- prefill attention: launch + per-row + per-row-head + causal FLOPs (FLOP part
        # scaled by peak FLOP/s); cached tokens add 4 d hq FLOPs per chunk token x cached token.
        pc = coef["prefill_attention"]
        hq = spec.num_heads // tp
        s_flop = pc["s_flop"] * flop_ratio
        t0 = (pc["c0"] + pc["c_tok"] * n + pc["c_tok_head"] * n * hq
              + s_flop * 2.0 * n * n * d * hq) * layers
        t0[0] = 0.0
        self.pre_t0 = t0
        self.pre_slope = np.full_like(n, s_flop * 4.0 * d * hq * layers)

        # ---- decode attention: launch + KV bytes at the HBM rate (no L2 reuse in serving)
        dc = coef["decode_attention"]
        kv_layer_bytes = 2 * max(1, spec.num_kv_heads // tp) * d * spec.bytes_per_param
        self.dec_a = np.full_like(n, dc["a0"] * layers)
        self.dec_s = np.full_like(n, dc["s_hbm"] * kv_layer_bytes * bw_ratio * layers)
        self.sat_a, self.sat_s = float(self.dec_a[0]), float(self.dec_s[0])
