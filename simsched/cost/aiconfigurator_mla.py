"""AIConfigurator's measured MLA attention module (H100 and H200, vLLM), read from the shipped
tables of :mod:`simsched.cost.aiconfigurator`: vLLM's whole MLA attention module of
DeepSeek-V3's shape (projections, norms, rope, attention kernel, output projection), context by
query heads x batch x prompt tokens and generation by query heads x batch x KV tokens, per GEMM
weights and KV dtype. :func:`mla_available` says when a model may read it;
:func:`simsched.cost.moe.mla_attention` turns it into the attention kernel's time.
"""

from __future__ import annotations

import numpy as np

from simsched.cost.aiconfigurator import MS, along_heads, tables


# The MLA attention shape AIConfigurator measured (DeepSeek-V3's; Kimi-K2.5 shares it): hidden
# size, kv_lora_rank, q_lora_rank, qk_rope_head_dim, head_dim (qk_nope = v).
MLA_SHAPE = (7168, 512, 1536, 64, 128)


def mla_available(gpu: str, spec) -> bool:
    """Whether ``gpu``'s tables hold the MLA module measured for ``spec``'s attention shape."""
    try:
        t = tables(gpu)
    except ValueError:
        return False
    shape = (spec.hidden_size, spec.kv_lora_rank, spec.q_lora_rank, spec.qk_rope_head_dim,
             spec.head_dim)
    return "mla_gen_heads" in t and shape == MLA_SHAPE


def _mla_key(t: dict, phase: str, weight_dtype: str, kv: str) -> str:
    gemm = "fp8_block" if weight_dtype == "fp8" else "bfloat16"
    return f"mla_{phase}_{gemm}_{'fp8' if kv == 'fp8' else 'bfloat16'}"


def mla_context_module(gpu: str, hq: int, tokens, weight_dtype: str = "auto",
                       kv: str = "bfloat16") -> np.ndarray:
    """Seconds of vLLM's whole MLA attention module (projections, norms, rope, attention,
    output projection) prefilling one sequence of ``tokens`` (array) with ``hq`` query heads
    per GPU, as measured (batch 1): log-log in the tokens between measured prompt lengths,
    piecewise linear in the heads; ``tokens`` past the longest measured prompt read the longest
    (the caller extrapolates, :func:`simsched.cost.moe.mla_attention`)."""
    t = tables(gpu)
    key = _mla_key(t, "ctx", weight_dtype, kv)
    row = along_heads(t[key], t["mla_ctx_heads"], hq)[0]            # batch 1 x isl
    isl = t["mla_ctx_isl"].astype(float)
    ok = ~np.isnan(row)
    isl, row = isl[ok], row[ok]
    x = np.clip(np.asarray(tokens, dtype=float), 1.0, isl[-1])
    return np.exp(np.interp(np.log(x), np.log(isl), np.log(row))) * MS


def mla_generation_attention(gpu: str, hq: int, weight_dtype: str = "auto",
                             kv: str = "bfloat16"):
    """MLA decode attention as ``(batch sizes, fixed seconds, seconds per KV token read)`` of
    the measured generation module: per measured batch size the chord through its times at the
    shortest context of at least 1,024 tokens and the longest measured (as
    :func:`simsched.cost.aiconfigurator.generation_attention`). The per-token cost is the attention kernel's alone (the
    module's projections do not depend on the context); the fixed part is the whole module's
    (projections included)."""
    t = tables(gpu)
    key = _mla_key(t, "gen", weight_dtype, kv)
    grid = along_heads(t[key], t["mla_gen_heads"], hq)              # batch x seq
    batch, seq = t["mla_gen_batch"].astype(float), t["mla_gen_seq"].astype(float)
    a, s = np.zeros(len(batch)), np.zeros(len(batch))
    for i, b in enumerate(batch):
        ok = ~np.isnan(grid[i]) & (seq >= 1024)
        x, y = b * seq[ok], grid[i][ok] * MS
        slope = max((y[-1] - y[0]) / (x[-1] - x[0]), 0.0)
        a[i], s[i] = max(y[0] - slope * x[0], 0.0), slope
    return batch, a, s
