"""GPU kernel time of mixture-of-experts, MLA and quantised models, derived from the dense fits.

No MoE kernel was timed for this project: every GEMM here is the measured anchor's dense GEMM
model (:func:`simsched.cost.calibration.predict_linear`'s roofline over the fitted efficiency
curve, plus the fitted fixed time per GEMM) applied to the shapes the model actually runs. For
one layer on one GPU, with ``x`` the GPU's tokens:

* attention projections (QKV and output, or MLA's low-rank ones) and dense MLPs: as a dense
  model, split over tensor parallelism;
* an MoE layer: the router (``hidden x experts``, activation dtype), the shared experts (a dense
  MLP), and the routed experts as one grouped GEMM per projection over the ``D`` experts that
  receive tokens this step: ``D`` GEMMs of ``m = assignments / D`` tokens each, each timed by the
  dense model at ``m`` tokens (the efficiency of an ``m``-row GEMM). ``D`` is the expected
  number of distinct experts hit, ``N (1 - (1 - k/N)^n)`` under uniform routing;
  ``expert_routing_skew`` (Zipf) sets how unevenly the assignments fall on those experts, not
  how many are hit (so it only matters under expert parallelism, and never makes it faster);
* expert parallelism (``enable_expert_parallel``): the experts are spread over the MoE ranks
  (tp x data-parallel; expert i on rank i mod ranks), each rank computes its own experts'
  GEMMs and the layer waits for the slowest rank (expected assignments plus sqrt(2 ln ranks)
  standard deviations of the routing's randomness). With data-parallel attention the tokens
  are sent to their experts' ranks and back, a dispatch and a combine all-to-all
  (:func:`all_to_all_time`); with tensor-parallel attention alone (dp 1) every rank already
  holds every token and the block's output all-reduce (one of the step's two per layer)
  combines the experts' rows, as vLLM, SGLang and TensorRT-LLM run TP + EP without an
  all-to-all backend, so nothing more is sent. Without EP every rank holds a 1/ranks slice of
  every expert;
* element-wise work: the dense fit's per-layer constant and bytes, with the MoE activation over
  the top-k experts' width, the token permutation (scatter and gather of ``k`` copies) and, for
  FP8 weights, the dynamic quantisation of every GEMM's input.

Weight bytes follow ``weight_dtype``; on Hopper (the ``h200`` kernel anchor) FP8 GEMMs run at
twice the bf16 tensor-core rate, elsewhere (A100: FP8 weight-only kernels) and for int4
weight-only at the bf16 rate. The decode attention's KV reads scale with ``kv_cache_dtype``
(and MLA's compressed KV). What is assumed rather than measured: that the dense GEMM
efficiency at ``m`` rows holds for a grouped expert GEMM, the all-to-all latency
(:data:`A2A_LATENCY`), and the MLA attention kernels (timed as grouped-query ones reading the
latent's bytes) except where measured: under the H100's and H200's AIConfigurator kernels
(``hardware.kernel_profile="aiconfigurator"``; :func:`mla_attention`) a model of DeepSeek-V3's
MLA shape (DeepSeek-R1/V3, Kimi-K2.5) reads its prefill attention and decode attention's cost
per KV token from AIConfigurator's measured vLLM MLA module
(:mod:`simsched.cost.aiconfigurator_mla`).
"""

from __future__ import annotations

import math

import numpy as np

from simsched.cost import shapes
from simsched.cost.hardware import GPUS, GPUSpec, ModelSpec

# Seconds per all-to-all call beyond its bytes, per log2 of the ranks (launch and the peers'
# handshake; assumed, of the order of vLLM's NVLink all-to-all kernels, not measured here).
A2A_LATENCY = 8e-6
FP8_ANCHORS = ("h200",)          # kernel anchors whose GPUs have FP8 tensor cores (Hopper)
_GRID_EXACT = 1024               # token counts computed exactly; beyond, a geometric grid


def _on_grid(n: np.ndarray, fn) -> np.ndarray:
    """``fn`` over token counts ``n``: exact up to :data:`_GRID_EXACT`, interpolated on a
    geometric grid beyond (routing statistics are smooth there; this keeps big tables cheap)."""
    top = float(max(n.max(), 1.0))
    grid = np.unique(np.concatenate([np.arange(_GRID_EXACT + 1, dtype=float),
                                     np.geomspace(_GRID_EXACT, max(top, _GRID_EXACT), 256)]))
    vals = fn(grid)
    return np.stack([np.interp(n, grid, v) for v in vals]) if vals.ndim == 2 \
        else np.interp(n, grid, vals)


def all_to_all_time(tokens, ranks: int, spec: ModelSpec, link_bandwidth: float) -> np.ndarray:
    """Seconds of one MoE layer's dispatch and combine all-to-alls on one rank: each of its
    ``tokens`` sends ``experts_per_token`` hidden vectors, the ``(ranks - 1) / ranks`` of them
    bound to other ranks over ``link_bandwidth`` (bytes/s one GPU sends), twice; plus
    :data:`A2A_LATENCY` x log2(ranks) per call. 0 on one rank."""
    x = np.asarray(tokens, dtype=float)
    if ranks <= 1:
        return np.zeros_like(x)
    nbytes = x * spec.experts_per_token * spec.hidden_size * spec.bytes_per_param \
        * (ranks - 1) / ranks
    return 2.0 * (A2A_LATENCY * math.log2(ranks) + nbytes / link_bandwidth)


class _Gemm:
    """The dense GEMM model of one anchor's fit, for any shape and weight dtype."""

    def __init__(self, lin: dict, spec: ModelSpec, gpu: GPUSpec, experts: bool = False) -> None:
        self.lin, self.gpu = lin, gpu
        self.const = lin.get("gemm_const", 0.0)
        # Routed experts may ship in their own dtype (int4 / MXFP4 experts, bf16 attention).
        dtype = spec.expert_dtype if experts and spec.expert_dtype != "auto" \
            else spec.weight_dtype
        self.wb = shapes.expert_bytes_per_element(spec) if experts \
            else shapes.weight_bytes_per_element(spec)
        self.ab = float(spec.bytes_per_param)
        # FP8 weights run FP8 tensor cores on Hopper; 4-bit weights on Hopper are weight-only
        # (Marlin: dequantised to bf16 in the kernel), so they compute at the bf16 rate.
        fp8_rate = dtype == "fp8" and gpu.kernels in FP8_ANCHORS
        self.peak = gpu.peak_flops * (2.0 if fp8_rate else 1.0)
        self.quant = (1.0 + 1.0 / spec.bytes_per_param) if dtype == "fp8" else 0.0

    def bare(self, x, k: int, n: int, quantised: bool = True) -> np.ndarray:
        """Seconds of one GEMM of ``x`` rows by (k, n) weights without the fixed launch time:
        the roofline over the fitted efficiency at ``x`` rows."""
        x = np.maximum(np.asarray(x, dtype=float), 1.0)
        wb = self.wb if quantised else self.ab
        eff = np.interp(np.log(x), np.log(self.lin["eff_tokens"]), self.lin["eff"])
        roof = np.maximum(2.0 * x * k * n / (self.peak if quantised else self.gpu.peak_flops),
                          (wb * k * n + self.ab * x * (k + n)) / self.gpu.mem_bandwidth)
        return roof / eff

    def __call__(self, x, k: int, n: int, quantised: bool = True) -> np.ndarray:
        """Seconds of one GEMM launch of ``x`` rows by (k, n) weights."""
        return self.bare(x, k, n, quantised) + self.const


def _layer_parts(spec: ModelSpec, tp: int, gemm: _Gemm, x: np.ndarray) -> tuple:
    """(attention projection seconds, their element-wise bytes per token, GEMM inputs' widths)
    of one layer for ``x`` tokens per GPU."""
    h, d, hq = spec.hidden_size, spec.head_dim, spec.num_heads // tp
    if spec.kv_lora_rank:
        c, r, q = spec.kv_lora_rank, spec.qk_rope_head_dim, spec.q_lora_rank
        t = gemm(x, h, c + r) + gemm(x, c, hq * 2 * d) + gemm(x, hq * d, h)
        t = t + (gemm(x, h, q) + gemm(x, q, hq * (d + r)) if q else gemm(x, h, hq * (d + r)))
        rope, inputs = 2 * (hq + 1) * r, 3 * h + c + hq * d + (q or 0)
    else:
        kv = max(1, spec.num_kv_heads // tp)
        t = gemm(x, h, (hq + 2 * kv) * d) + gemm(x, hq * d, h)
        rope, inputs = (2 * (hq + kv) * d if spec.rope else 0), h + hq * d
    return t, 4 * h + rope + 6 * h, inputs


def linear_tables(spec: ModelSpec, gpu: GPUSpec, tp: int, lin: dict, n: np.ndarray,
                  parallel=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(linear seconds of all layers, all-to-all seconds of all layers, the routed experts'
    share of the linear seconds) by the GPU's token count ``n`` for an MoE, MLA or quantised
    model (``parallel``: a :class:`simsched.config.parallel.ParallelConfig` or None)."""
    dp = parallel.data_parallel_size if parallel is not None else 1
    ep = bool(parallel is not None and parallel.enable_expert_parallel)
    skew = parallel.expert_routing_skew if parallel is not None else 0.0
    gemm = _Gemm(lin, spec, gpu)
    h, g = spec.hidden_size, (2 if spec.gated_mlp else 1)
    elt_unit = lin["elt_per_byte"] * GPUS[lin["gpu"]].mem_bandwidth / gpu.mem_bandwidth \
        * spec.bytes_per_param
    quant = (1.0 + 1.0 / spec.bytes_per_param) if spec.weight_dtype == "fp8" else 0.0
    x = np.maximum(n, 1.0)
    attn, elt_tok, inputs = _layer_parts(spec, tp, gemm, x)
    inter = spec.intermediate_size
    dense = attn + gemm(x, h, g * inter // tp) + gemm(x, inter // tp, h)
    dense_elt = elt_tok + 3 * inter // tp + quant * (inputs + h + inter // tp)
    dense = dense + lin["elt_const"] + x * dense_elt * elt_unit
    moe_layers = shapes.num_moe_layers(spec)
    total = dense * (spec.num_layers - moe_layers)
    a2a, experts = np.zeros_like(x), np.zeros_like(x)
    if moe_layers:
        moe, moe_a2a, routed = _moe_layer(spec, gpu, tp, dp, ep, skew, gemm, x, parallel)
        moe = moe + attn + lin["elt_const"] + x * (elt_tok + quant * inputs) * elt_unit
        total = total + moe * moe_layers
        a2a = moe_a2a * moe_layers
        experts = routed * moe_layers
    total[0] = a2a[0] = experts[0] = 0.0
    return (np.maximum.accumulate(total), np.maximum.accumulate(a2a),
            np.maximum.accumulate(experts))


def _moe_layer(spec, gpu, tp, dp, ep, skew, gemm, x, parallel) -> tuple:
    """(seconds of one MoE block on the slowest rank, its all-to-all seconds, the routed
    experts' part of the block's seconds: their GEMMs, or the measured fused layer) for ``x``
    tokens per GPU (``x * dp`` tokens over the data-parallel ranks)."""
    h, g, k = spec.hidden_size, (2 if spec.gated_mlp else 1), spec.experts_per_token
    width, num = spec.expert_intermediate_size, spec.num_experts
    ranks = tp * dp
    quant = gemm.quant
    xg = _Gemm(gemm.lin, spec, gpu, experts=True)                    # the routed experts
    xquant = xg.quant
    t = gemm(x, h, num, quantised=False)                            # router
    shared = spec.num_shared_experts * width
    elt = 4.0 * k * h                                               # scatter + gather
    if shared:
        t = t + gemm(x, h, g * shared // tp) + gemm(x, shared // tp, h)
        elt = elt + 3 * shared // tp + quant * (h + shared // tp)
    base_t, base_elt = t, elt - 4.0 * k * h        # without the routed experts' own work
    # Skew sets how a step's assignments divide over the experts (the load each rank gets),
    # not how many experts the step reads: the distinct experts hit are uniform routing's.
    # (A Zipf that also thinned the experts hit would let skew *save* weight reads, so a
    # memory-bound decode ran faster the more skewed its routing: issue 40, defect 3.)
    p = shapes.expert_hit_probabilities(num, k, skew)
    uniform = shapes.expert_hit_probabilities(num, k, 0.0)
    total = x * dp
    if ep and ranks > 1:
        owner = np.arange(num) % ranks

        def per_rank(grid):
            hit = np.stack([(1.0 - (1.0 - uniform[owner == r][None, :])
                             ** grid[:, None]).sum(axis=1) for r in range(ranks)])
            return np.concatenate([hit, _assignments(p, owner, ranks, k, grid),
                                   _assignments(uniform, owner, ranks, k, grid)])

        stats = _on_grid(total, per_rank)
        hit, assign = np.maximum(stats[:ranks], 1e-9), stats[ranks:2 * ranks]
        even = stats[2 * ranks:]
        # The busiest rank takes no less than under uniform routing: skew only adds rows to
        # it, and a GEMM of more rows is never faster (the fitted efficiency curve can rise
        # faster than the roofline between two of its points).
        rank_t = hit * np.maximum(_expert_pair(xg, assign / hit, h, g * width, width),
                                  _expert_pair(xg, even / hit, h, g * width, width)) \
            + 2 * gemm.const
        t = t + rank_t.max(axis=0)
        slow = np.maximum(assign.max(axis=0), even.max(axis=0))
        elt = elt + (3 * width + xquant * (h + width)) * slow / np.maximum(x, 1.0)
        link = gpu.interconnect_bandwidth / 2 if ranks <= parallel.gpus_per_node \
            else parallel.inter_node_bandwidth
        # Attention tensor-parallel only (dp 1): every rank holds every token, picks its own
        # experts' rows and the block's output all-reduce combines them (counted with the
        # step's all-reduces), so nothing is dispatched; across data-parallel ranks the
        # tokens are sent to their experts' ranks and back.
        a2a = all_to_all_time(x, ranks, spec, link) if dp > 1 else np.zeros_like(x)
    else:
        # Every rank holds a slice of every expert: an uneven load still splits evenly.
        hit = np.maximum(_on_grid(total, lambda grid: shapes.expected_distinct_experts(
            grid, num, k)), 1e-9)
        m = total * k / hit
        w = width // ranks
        t = t + hit * (xg.bare(m, h, g * w) + xg.bare(m, w, h)) + 2 * gemm.const
        elt = elt + k * dp * (3 * w + xquant * (h + w))
        a2a = np.zeros_like(x)
    routed = t - base_t
    measured = _measured_experts(spec, gpu, ranks, ep, total)
    if measured is not None:
        # The fused MoE layer as measured on this GPU (routing, permutation, expert GEMMs,
        # activation): it replaces the derived experts; the router GEMM and shared experts
        # stay derived.
        t, elt, routed = base_t + measured, base_elt, measured
    unit = gemm.lin["elt_per_byte"] * GPUS[gemm.lin["gpu"]].mem_bandwidth \
        / gpu.mem_bandwidth * spec.bytes_per_param
    return t + gemm.lin["elt_const"] + x * elt * unit, a2a, routed


def _measured_experts(spec: ModelSpec, gpu: GPUSpec, ranks: int, ep: bool, tokens):
    """Seconds of the routed experts of one MoE layer from the GPU's measured AIConfigurator
    MoE table (profiles ``aic-<gpu>`` only; None where this shape was not measured)."""
    if not gpu.kernels.startswith("aic-"):
        return None
    from simsched.cost import aiconfigurator as aic    # numpy only; read on demand

    dtype = spec.expert_dtype if spec.expert_dtype != "auto" else spec.weight_dtype
    tp, eps = (1, ranks) if ep and ranks > 1 else (ranks, 1)
    return aic.moe(gpu.kernels[len("aic-"):], dtype, spec.hidden_size,
                   spec.expert_intermediate_size, spec.experts_per_token, spec.num_experts,
                   tp, eps, tokens)


def _assignments(p: np.ndarray, owner: np.ndarray, ranks: int, k: int,
                 grid: np.ndarray) -> np.ndarray:
    """Assignments each rank receives for ``grid`` tokens routed by ``p``: its expected share
    plus sqrt(2 ln ranks) standard deviations (the slowest of ``ranks`` draws)."""
    share = np.array([p[owner == r].sum() for r in range(ranks)])
    sd = np.sqrt(np.maximum(grid[None, :] * share[:, None] * (1.0 - share[:, None] / k), 0.0))
    return grid[None, :] * share[:, None] + math.sqrt(2 * math.log(ranks)) * sd


def _expert_pair(gemm: _Gemm, m: np.ndarray, h: int, up: int, width: int) -> np.ndarray:
    """Seconds of one expert's up and down GEMMs at ``m`` rows, without launch times."""
    return gemm.bare(m, h, up) + gemm.bare(m, width, h)


def kv_read_scale(spec: ModelSpec, tp: int) -> float:
    """Decode attention's KV bytes relative to the dense bf16 grouped-query layout the kernel
    fits assume (KV dtype; MLA's compressed latent)."""
    # (Over the full-attention layers on both sides: sliding-window layers are scaled apart,
    # simsched.cost.kernels.KernelTables._sliding_window.)
    plain = 2 * shapes.full_attention_layers(spec) * max(1, spec.num_kv_heads // tp) \
        * spec.head_dim * spec.bytes_per_param
    return shapes.kv_bytes_per_token(spec, tp) / plain


def apply(tables, coef: dict, n: np.ndarray, parallel=None) -> None:
    """Replace ``tables``' linear part (and scale its decode attention) for a non-plain model;
    set ``tables.moe_comm`` (expert-parallel all-to-all seconds by token count) and
    ``tables.moe_experts`` (the routed experts' part of ``linear``)."""
    spec, gpu, tp = tables.spec, tables.gpu, tables.tp
    if spec.num_experts or spec.kv_lora_rank or spec.weight_dtype != "auto":
        # (A dense model with only an FP8 KV cache keeps its measured linear table.)
        tables.linear, tables.moe_comm, tables.moe_experts = linear_tables(
            spec, gpu, tp, coef["linear"], n, parallel)
    scale = kv_read_scale(spec, tp)
    tables.dec_s = tables.dec_s * scale
    tables.sat_s = tables.sat_s * scale
    if spec.kv_lora_rank:
        mla_attention(tables, coef, n)


def mla_table_set(gpu: GPUSpec) -> str | None:
    """The AIConfigurator table set whose measured MLA module times ``gpu``'s MLA attention: the
    profile's own (``aic-<gpu>``, e.g. ``hardware.kernel_profile="aiconfigurator"`` on an H100
    or H200) where it holds MLA tables; None otherwise (the grouped-query approximation stays).
    The GPUs' default kernels keep the approximation: on the silicon rows (Kimi-K2.5, H200)
    the measured MLA moved their median TPOT error from 12.8 % to 12.9 %."""
    if not gpu.kernels.startswith("aic-"):
        return None
    from simsched.cost import aiconfigurator as aic    # numpy only; read on demand

    name = gpu.kernels[len("aic-"):]
    known = aic.gpus() + aic.engine_sets()
    return name if name in known and "mla_gen_heads" in aic.tables(name) else None


def mla_attention(tables, coef: dict, n: np.ndarray) -> bool:
    """Time an MLA model's attention from the measured vLLM MLA module where its GPU and shape
    were measured (:func:`mla_table_set`, ``aiconfigurator_mla.mla_available``); returns whether it
    did. Prefill attention (``pre_t0``) of a ``c``-token chunk: the measured module's time for
    one sequence of ``c`` tokens less its time for 1 token (the module's fixed launches and
    element-wise work, which the linear part's per-layer constants already charge), less the
    same growth of the derived projection GEMMs (which the linear part charges); never below
    0, non-decreasing, and past the longest measured prompt quadratic in ``c``; ``pre_slope``
    at the longest measured prompt's rate per causal pair. Decode attention's cost per KV token
    read (``dec_s``): the measured generation module's, with no separate floor; decode's fixed
    part stays derived."""
    from simsched.cost import aiconfigurator as aic
    from simsched.cost import aiconfigurator_mla as mla

    spec, tp = tables.spec, tables.tp
    name = mla_table_set(tables.gpu)
    if name is None or not mla.mla_available(name, spec):
        return False
    layers, hq = spec.num_layers, max(1, spec.num_heads // tp)
    kv = "fp8" if spec.kv_cache_dtype == "fp8" else "bfloat16"
    w = spec.weight_dtype
    longest = float(aic.tables(name)["mla_ctx_isl"][-1])
    x = np.maximum(n, 1.0)
    gemm = _Gemm(coef["linear"], spec, tables.gpu)
    xs = np.append(np.minimum(x, longest), longest)          # n is increasing; then the longest
    one = np.ones(1)

    def module(tok):
        return mla.mla_context_module(name, hq, tok, w, kv)

    grow = (module(xs) - module(one)) \
        - (_layer_parts(spec, tp, gemm, xs)[0] - _layer_parts(spec, tp, gemm, one)[0])
    att = np.maximum.accumulate(np.maximum(grow, 0.0))
    t_long, att = float(att[-1]), att[:-1]
    att = np.where(x > longest, t_long * (x / longest) ** 2, att)
    t0 = att * layers
    t0[0] = 0.0
    tables.pre_t0 = np.maximum.accumulate(t0)
    tables.pre_slope = np.full_like(n, 2.0 * t_long / longest ** 2 * layers)
    batch, _, per_token = mla.mla_generation_attention(name, hq, w, kv)
    # n x dec_s (one more cached token per sequence) never falls as sequences are added.
    tables.dec_s = np.maximum.accumulate(np.interp(x, batch, per_token) * layers * x) / x
    tables.sat_a = tables.sat_s = 0.0
    return True
