"""The A100-calibrated cost model: iteration time from measured kernels, per model, GPU and TP.

An iteration costs, per GPU (tensor-parallel ranks run in lock step):

* ``linear``: every layer's QKV/output projections, MLP and element-wise ops for all tokens;
  measured per-layer times interpolated piecewise-linearly in the token count for a profiled
  (model, TP) on the A100, otherwise the roofline with A100-fitted efficiencies;
* ``attention``: prefill chunks (causal time of the chunk plus chunk x cached tokens) and the
  decodes (a function of how many sequences and how many KV bytes they read), fitted on a
  70B-shaped profile and scaled by query width (prefill) or KV bytes (decode) for other models;
* ``communication``: two all-reduces of ``tokens x hidden`` activations per layer when TP > 1;
* ``embedding``: token embedding and the LM head (one logit row per sequence);
* ``overhead``: vLLM's CPU-side scheduling, input preparation, sampling and output processing.

On any GPU other than the A100-80GB every term is an **extrapolation**: the A100-fitted
efficiencies are assumed to hold and times are scaled by the datasheet FLOP/s, HBM and
interconnect bandwidths. Nothing there was measured.

Speed: all token-count and sequence-count dependent parts are precomputed into plain Python
lists, so :meth:`CalibratedCostModel.iteration_time` is a handful of list look-ups.
"""

from __future__ import annotations

import numpy as np

from simsched.cost import calibration as cal
from simsched.cost.base import Batch
from simsched.cost.hardware import GPUS, REFERENCE_GPU, GPUSpec, ModelSpec

MIN_TABLE = 8192


def _extend(table: list, n: int) -> float:
    """Linear extrapolation past the end of a table using its last 1/8 as the slope."""
    last = len(table) - 1
    back = max(1, last // 8)
    return table[last] + (table[last] - table[last - back]) / back * (n - last)


class CalibratedCostModel:
    """Iteration time of ``spec`` on ``gpu`` at tensor-parallel degree ``tp``, from A100 fits.

    Immutable after construction (instances are cached and shared between runs).
    ``coefficients`` defaults to :func:`simsched.cost.calibration.fit_all`.
    """

    def __init__(self, spec: ModelSpec, gpu: GPUSpec, tp: int = 1, model_name: str | None = None,
                 coefficients: dict | None = None, table_tokens: int | None = None) -> None:
        if not isinstance(spec, ModelSpec):
            raise ValueError(f"spec must be a ModelSpec, got {type(spec).__name__}")
        if not isinstance(gpu, GPUSpec):
            raise ValueError(f"gpu must be a GPUSpec, got {type(gpu).__name__}")
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tp must be a positive integer, got {tp!r}")
        self.spec, self.gpu, self.tp, self.model_name = spec, gpu, tp, model_name
        coef = coefficients if coefficients is not None else cal.fit_all()
        size = max(MIN_TABLE, spec.max_context, table_tokens or 0) + 1
        n = np.arange(size, dtype=float)
        ref = GPUS[REFERENCE_GPU]
        layers = spec.num_layers

        # ---- linear ops and embedding, by token count
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
        per_layer[0] = 0.0
        emb_t[0] = 0.0
        # Measured kernels jitter by a few percent between neighbouring token counts; a running
        # maximum keeps "more tokens never cost less" without moving any point by more than that.
        per_layer = np.maximum.accumulate(per_layer)
        emb_t = np.maximum.accumulate(emb_t)
        linear = per_layer * layers

        # ---- tensor-parallel all-reduces: after attention and after the MLP in every layer
        link_ratio = ref.interconnect_bandwidth / gpu.interconnect_bandwidth
        msg = n * spec.hidden_size * spec.bytes_per_param
        comm = 2 * layers * cal.predict_all_reduce(coef["all_reduce"], tp, msg, link_ratio)
        comm = np.maximum.accumulate(comm)
        comm[0] = 0.0

        # ---- by sequence count: LM head (A100 efficiency curve) and CPU overhead
        eff = np.interp(np.log(np.maximum(n, 1.0)), np.log(coef["linear"]["eff_tokens"]),
                        coef["linear"]["eff"])
        lm_head = cal.lm_head_roofline(spec, tp, gpu, n) / eff
        lm_head[0] = 0.0
        cpu = cal.predict_cpu_overhead(coef["cpu"], tp, n)

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
        self._sat_a = dc["sat_a"] * layers
        self._sat_s = dc["sat_s"] * kv_layer_bytes * bw_ratio * layers

        self._linear, self._comm, self._emb = linear.tolist(), comm.tolist(), emb_t.tolist()
        self._lm_head, self._cpu = lm_head.tolist(), cpu.tolist()
        self._per_token = (linear + comm + emb_t).tolist()
        self._per_seq = (lm_head + cpu).tolist()
        self._pre_t0, self._pre_slope = t0.tolist(), slope.tolist()
        self._dec_a, self._dec_s = dec_a.tolist(), dec_s.tolist()
        self._size = size

    def __repr__(self) -> str:
        return f"CalibratedCostModel({self.model_name or self.spec}, {self.gpu.name}, tp={self.tp})"

    # ------------------------------------------------------------------ fast path

    def iteration_time(self, batch: Batch) -> float:
        """Seconds the iteration takes (sum of :meth:`breakdown`, without building a dict)."""
        size = self._size
        n_dec = batch.num_decode_seqs
        new = batch.prefill_new_tokens
        t = 0.0
        if new:
            tokens = n_dec + sum(new)
            seqs = n_dec + len(new)
            t0, slope = self._pre_t0, self._pre_slope
            for c, k in zip(new, batch.prefill_cached_tokens):
                if c < size:
                    t += t0[c] + c * k * slope[c]
                else:
                    t += t0[-1] * (c / (size - 1)) ** 2 + c * k * slope[-1]
        else:
            tokens = seqs = n_dec
        if tokens < size:
            t += self._per_token[tokens] + self._per_seq[seqs]
        else:
            t += _extend(self._per_token, tokens) + _extend(self._per_seq, seqs)
        if n_dec:
            ctx = batch.decode_context_sum
            if n_dec < size:
                d = self._dec_a[n_dec] + self._dec_s[n_dec] * ctx
            else:
                d = _extend(self._dec_a, n_dec) + self._dec_s[-1] * ctx
            floor = self._sat_a + self._sat_s * ctx
            t += d if d > floor else floor
        return t

    # ------------------------------------------------------------------ slow path

    def _at(self, table: list, i: int) -> float:
        return table[i] if i < self._size else _extend(table, i)

    def breakdown(self, batch: Batch) -> dict:
        """Seconds per part: linear, attention, communication, embedding, overhead.

        The values sum to :meth:`iteration_time` (up to float rounding).
        """
        tokens, seqs = batch.num_tokens, batch.num_seqs
        pre = 0.0
        for c, k in zip(batch.prefill_new_tokens, batch.prefill_cached_tokens):
            if c < self._size:
                pre += self._pre_t0[c] + c * k * self._pre_slope[c]
            else:
                pre += self._pre_t0[-1] * (c / (self._size - 1)) ** 2 + c * k * self._pre_slope[-1]
        dec = 0.0
        if batch.num_decode_seqs:
            n, ctx = batch.num_decode_seqs, batch.decode_context_sum
            slope = self._dec_s[n] if n < self._size else self._dec_s[-1]
            dec = max(self._at(self._dec_a, n) + slope * ctx, self._sat_a + self._sat_s * ctx)
        return {
            "linear": self._at(self._linear, tokens),
            "attention": pre + dec,
            "communication": self._at(self._comm, tokens),
            "embedding": self._at(self._emb, tokens) + self._at(self._lm_head, seqs),
            "overhead": self._at(self._cpu, seqs),
        }
