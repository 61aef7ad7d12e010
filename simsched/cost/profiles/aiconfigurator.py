"""Profiles from AIConfigurator's measured vLLM kernels, one per GPU, and SGLang's and
TensorRT-LLM's on the H100 and H200 (``aic-sglang-h200``, ...), which
``hardware.kernel_profile="aiconfigurator"`` picks for an engine profile of that name.

The tables and how they are read: :mod:`simsched.cost.aiconfigurator`.

A GPU whose ``GPUSpec.kernels`` is ``aic-<gpu>`` (the B200, B300, GB200, GB300 and RTX Pro 6000 by
default; any GPU with tables when ``hardware.kernel_profile="aiconfigurator"``) takes its kernel
times from that GPU's own measured tables:

* linear: the four GEMMs of a layer (QKV, output, MLP up/gate, MLP down) read off the bf16 GEMM
  grid at the layer's per-GPU shapes; the LM head likewise, one row per sequence;
* prefill attention: the measured causal time of a chunk (one sequence, batch 1); the cost of a
  chunk token against a cached token is derived from it (the same FLOP rate as the longest
  measured prompt: a prefix adds ``4 d hq`` FLOPs per pair);
* decode attention: per measured batch size a fixed time plus a cost per KV token read, fitted to
  the measured context lengths, interpolated between batch sizes;
* all-reduce: vLLM's custom all-reduce (CUDA graph) where measured, NCCL beyond;
* weights: bf16 (``auto``, ``bf16``, ``fp16``) and FP8 (``fp8``: the per-tensor-scaled FP8 GEMM
  table, plus the derived cost of quantising each GEMM's input) where the GPU has that table; a
  KV cache in FP8 reads the FP8-KV attention tables (without them: the bf16 tables, decode's
  per-token cost in proportion to the bytes);
* derived, not measured: element-wise ops (norms, rope, activation, residual adds) and the token
  embedding from the H200 fits scaled by HBM bandwidth; MoE, MLA and INT4 models (and FP8 weights
  on a GPU without FP8 GEMMs) take their linear part from :mod:`simsched.cost.moe` with the H200
  linear fits scaled by the datasheet.
"""

from __future__ import annotations

import numpy as np

from simsched.cost import aiconfigurator as aic
from simsched.cost import calibration as cal
from simsched.cost import calibration_h200 as h200
from simsched.cost import fits
from simsched.cost.hardware import GPUS
from simsched.cost.profiles import CalibrationProfile
from simsched.cost.shapes import DTYPE_BYTES

PREFIX = "aic-"


class AIConfiguratorProfile(CalibrationProfile):
    """One GPU's AIConfigurator tables as a calibration profile (``name``: ``aic-<gpu>``)."""

    def __init__(self, gpu: str) -> None:
        self.gpu_name = gpu       # a GPU, or an engine's table set ``<engine>-<gpu>``
        self.name = PREFIX + gpu
        m = aic.entry(gpu)
        engine = m.get("engine", "vllm")
        what = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}[engine]
        self.description = (f"AIConfigurator {what} {m[engine]} kernel tables, "
                            f"{m.get('gpu', gpu)} (Apache-2.0)")

    def coefficients(self) -> dict:
        """The H200 fits (element-wise ops, MoE/MLA paths); the tables are read in :meth:`build`."""
        return fits.coefficients(h200.GPU_NAME)

    def describe(self) -> dict[str, str]:
        """Per kernel class: measured, derived or extrapolated, and from what."""
        return aic.coverage(self.gpu_name)

    def _dtypes(self, spec) -> tuple[str | None, str, float]:
        """(GEMM table for the linear layers or None when this profile does not time them,
        KV table, factor on decode's per-token cost for a KV dtype without its own table)."""
        t = aic.tables(self.gpu_name)
        gemm = None
        if not spec.num_experts and not spec.kv_lora_rank:
            gemm = {"auto": "bfloat16", "bf16": "bfloat16", "fp16": "bfloat16",
                    "fp8": "fp8", "nvfp4": "nvfp4"}.get(spec.weight_dtype)
            if gemm is not None and f"gemm_{gemm}" not in t:
                gemm = None          # e.g. FP8 weights on the A100: the derived path
        if spec.kv_cache_dtype == "fp8":
            if any(k.startswith("gen_fp8_") for k in t):
                return gemm, "fp8", 1.0
            return gemm, "bfloat16", 1.0 / spec.bytes_per_param
        return gemm, "bfloat16", 1.0

    def build(self, tables, coef: dict, n: np.ndarray) -> None:
        spec, gpu, tp = tables.spec, tables.gpu, tables.tp
        g = self.gpu_name
        layers, d = spec.num_layers, spec.head_dim
        hq, hkv = spec.num_heads // tp, max(1, spec.num_kv_heads // tp)
        lin = coef["linear"]
        bw_ratio = GPUS[lin["gpu"]].mem_bandwidth / gpu.mem_bandwidth
        gemm_dtype, kv, kv_scale = self._dtypes(spec)
        # A dense model whose weights have a measured GEMM table is timed here in full; MoE, MLA
        # and INT4 models get their linear part from simsched.cost.moe (derived) afterwards.
        tables.linear_complete = gemm_dtype is not None

        # ---- linear: measured GEMMs + derived element-wise ops, per layer
        shapes = cal.gemm_shapes(spec, tp)
        per_layer = sum(aic.gemm(g, gemm_dtype or "bfloat16", n, width, depth)
                        for depth, width in shapes)
        elt = cal.elementwise_bytes(spec, tp, n)
        if gemm_dtype in ("fp8", "nvfp4"):
            # vLLM quantises each GEMM's input to the weights' format (NVFP4: E2M1 with an FP8
            # scale per 16): read it, write the format's bytes per element.
            out = DTYPE_BYTES[gemm_dtype]
            elt = elt + n * sum(depth for depth, _ in shapes) * (spec.bytes_per_param + out)
        per_layer = per_layer + lin["elt_const"] + lin["elt_per_byte"] * bw_ratio * elt
        emb_t = lin["elt_const"] + lin["elt_per_byte"] * bw_ratio \
            * 2.0 * n * spec.hidden_size * spec.bytes_per_param
        tables.finish_linear(per_layer, emb_t)
        lm_head = aic.gemm(g, "bfloat16", n, spec.vocab_size // tp, spec.hidden_size)
        lm_head[0] = 0.0
        tables.lm_head = np.maximum.accumulate(lm_head)

        # ---- prefill attention: measured causal chunk time; a cached prefix at the FLOP rate
        # of the longest measured prompt.
        t0 = aic.context_attention(g, hq, hkv, d, n, kv) * layers
        t0[0] = 0.0
        tables.pre_t0 = np.maximum.accumulate(t0)
        longest = float(aic.tables(g)["ctx_isl"][-1])
        s_flop = float(aic.context_attention(g, hq, hkv, d, [longest], kv)[0]) \
            / (2.0 * longest * longest * d * hq)
        tables.pre_slope = np.full_like(n, s_flop * 4.0 * d * hq * layers)

        # ---- decode attention by sequence count: fixed part + per KV token read
        batch, a, s = aic.generation_attention(g, hq, hkv, d, kv)
        x = np.maximum(n, 1.0)
        dec_a = np.interp(x, batch, a) * layers
        dec_s = np.interp(x, batch, s) * layers * kv_scale
        # n x dec_s (one more cached token per sequence) never falls as sequences are added.
        per_seq = np.maximum.accumulate(dec_s * x)
        dec_s = per_seq / x
        tables.dec_a, tables.dec_s = dec_a, dec_s
        tables.sat_a = tables.sat_s = 0.0

        # ---- all-reduce per call (KernelTables charges two per layer)
        msg = n * spec.hidden_size * spec.bytes_per_param
        tables.all_reduce_per_call = aic.all_reduce(g, tp, msg)


def profiles() -> list[AIConfiguratorProfile]:
    """One profile per GPU with shipped tables, and one per other engine's table set
    (``aic-sglang-h200``, ...)."""
    return [AIConfiguratorProfile(g) for g in aic.gpus() + aic.engine_sets()]



def profile_name(gpu: str) -> str:
    """The profile name of ``gpu``'s AIConfigurator tables (a clear error if none shipped)."""
    if gpu not in aic.gpus():
        raise ValueError(f"hardware.kernel_profile='aiconfigurator': no AIConfigurator kernel "
                         f"tables for {gpu!r}; measured: {aic.gpus()}")
    return PREFIX + gpu
