"""Parameter, weight and KV-cache sizes of mixture-of-experts, MLA and quantised models.

Pure functions of a :class:`simsched.cost.specs.ModelSpec` (read by attribute, so this module
imports nothing of the catalog): which layers are MoE layers, how many parameters and weight
bytes a model has and how they shard over tensor-, pipeline- and expert-parallel GPUs, and the
KV bytes a token takes (grouped-query attention, or multi-head latent attention's compressed
KV), in the weight and KV-cache dtypes. A *plain* spec (dense, ``auto`` dtypes, no MLA) never
reaches this module's cost paths: its numbers stay those of :mod:`simsched.cost.hardware`.

Quantisation follows vLLM: ``fp8`` (and ``int4`` weight-only) applies to the linear layers'
weights (attention projections, MLPs, experts); embeddings, the LM head, norms and the MoE
router stay in the activation dtype (``bytes_per_param``).
"""

from __future__ import annotations

import math

import numpy as np

# Bytes per element of each dtype; "auto" is the activation dtype (the spec's bytes_per_param).
# The 4-bit formats carry their block scales: MXFP4 one 8-bit scale per 32 elements, NVFP4 one
# FP8 scale per 16 (the OCP MX and NVIDIA NVFP4 formats); int4 weight-only as vLLM's Marlin/
# compressed-tensors checkpoints store it (group scales of 32 or 128: under 2 %, left out).
DTYPE_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int4": 0.5, "mxfp4": 0.5 + 1 / 32,
               "nvfp4": 0.5 + 1 / 16}
WEIGHT_DTYPES = ("auto",) + tuple(DTYPE_BYTES)
KV_CACHE_DTYPES = ("auto", "bf16", "fp16", "fp8")


def check_fields(spec) -> None:
    """Check (and complete) a ``ModelSpec``'s MoE, MLA and dtype fields; a ValueError names
    the field. An MoE model's ``expert_intermediate_size`` 0 becomes ``intermediate_size``."""
    for name in ("num_experts", "experts_per_token", "num_shared_experts",
                 "expert_intermediate_size", "first_dense_layers", "kv_lora_rank",
                 "q_lora_rank", "qk_rope_head_dim"):
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"ModelSpec.{name} must be an integer >= 0, got {value!r}")
    step = spec.moe_layer_step
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"ModelSpec.moe_layer_step must be a positive integer, got {step!r}")
    if spec.num_experts:
        if not 1 <= spec.experts_per_token <= spec.num_experts:
            raise ValueError(f"ModelSpec.experts_per_token must be in [1, num_experts="
                             f"{spec.num_experts}], got {spec.experts_per_token!r}")
        if not spec.expert_intermediate_size:
            object.__setattr__(spec, "expert_intermediate_size", spec.intermediate_size)
    elif spec.experts_per_token or spec.num_shared_experts or spec.expert_intermediate_size:
        raise ValueError("ModelSpec.experts_per_token, num_shared_experts and "
                         "expert_intermediate_size need num_experts > 0 (an MoE model)")
    if spec.weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"ModelSpec.weight_dtype must be one of {list(WEIGHT_DTYPES)}"
                         f", got {spec.weight_dtype!r}")
    if spec.kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"ModelSpec.kv_cache_dtype must be one of "
                         f"{list(KV_CACHE_DTYPES)}, got {spec.kv_cache_dtype!r}")
    if spec.expert_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"ModelSpec.expert_dtype must be one of {list(WEIGHT_DTYPES)}, got "
                         f"{spec.expert_dtype!r}")
    if spec.expert_dtype != "auto" and not spec.num_experts:
        raise ValueError("ModelSpec.expert_dtype needs num_experts > 0 (an MoE model)")
    for name in ("sliding_window", "num_sliding_window_layers"):
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"ModelSpec.{name} must be an integer >= 0, got {value!r}")
    if spec.num_sliding_window_layers > spec.num_layers:
        raise ValueError(f"ModelSpec.num_sliding_window_layers ({spec.num_sliding_window_layers})"
                         f" exceeds num_layers ({spec.num_layers})")
    if bool(spec.sliding_window) != bool(spec.num_sliding_window_layers):
        raise ValueError("ModelSpec.sliding_window and num_sliding_window_layers go together "
                         "(both 0, or a window and the layers that use it)")
    if not isinstance(spec.attention_sinks, bool):
        raise ValueError(f"ModelSpec.attention_sinks must be a bool, got "
                         f"{spec.attention_sinks!r}")


def is_plain(spec) -> bool:
    """A dense model in its activation dtype with grouped-query attention (the original model)."""
    return not spec.num_experts and not spec.kv_lora_rank and spec.weight_dtype == "auto" \
        and spec.kv_cache_dtype == "auto" and not spec.sliding_window


def weight_bytes_per_element(spec) -> float:
    """Bytes of one linear-layer weight element."""
    return float(spec.bytes_per_param) if spec.weight_dtype == "auto" \
        else DTYPE_BYTES[spec.weight_dtype]


def expert_bytes_per_element(spec) -> float:
    """Bytes of one routed-expert weight element (``expert_dtype``, else ``weight_dtype``)."""
    if spec.expert_dtype == "auto":
        return weight_bytes_per_element(spec)
    return DTYPE_BYTES[spec.expert_dtype]


def full_attention_layers(spec) -> int:
    """Layers that attend to the whole context (the others: a sliding window)."""
    return spec.num_layers - spec.num_sliding_window_layers


def kv_bytes_per_element(spec) -> float:
    """Bytes of one cached K or V element."""
    return float(spec.bytes_per_param) if spec.kv_cache_dtype == "auto" \
        else DTYPE_BYTES[spec.kv_cache_dtype]


def is_moe_layer(spec, layer: int) -> bool:
    """Whether layer ``layer`` (0-based) is an MoE layer: past the first dense layers, every
    ``moe_layer_step``-th (Llama-4's interleaving; DeepSeek-V3's ``first_k_dense_replace``)."""
    return bool(spec.num_experts) and layer >= spec.first_dense_layers \
        and (layer + 1) % spec.moe_layer_step == 0


def num_moe_layers(spec) -> int:
    """MoE layers of the model (0 for a dense one)."""
    return sum(is_moe_layer(spec, i) for i in range(spec.num_layers))


def attention_params(spec) -> int:
    """One layer's attention projection parameters (QKV and output; MLA's low-rank ones)."""
    h, d, hq = spec.hidden_size, spec.head_dim, spec.num_heads
    if spec.kv_lora_rank:
        r, c, q = spec.qk_rope_head_dim, spec.kv_lora_rank, spec.q_lora_rank
        q_proj = (h * q + q * hq * (d + r)) if q else h * hq * (d + r)
        return q_proj + h * (c + r) + c * hq * 2 * d + hq * d * h
    return h * (hq + 2 * spec.num_kv_heads) * d + hq * d * h


def mlp_params(spec, intermediate: int) -> int:
    """Parameters of one (gated or plain) MLP of width ``intermediate``."""
    return spec.hidden_size * intermediate * (3 if spec.gated_mlp else 2)


def param_counts(spec) -> dict:
    """Parameters by kind: ``embedding`` (token embedding and LM head, once if tied),
    ``dense`` (attention, dense MLPs, shared experts), ``experts`` (routed experts), ``other``
    (norms, routers)."""
    h, moe = spec.hidden_size, num_moe_layers(spec)
    dense_layers = spec.num_layers - moe
    shared = spec.num_shared_experts * spec.expert_intermediate_size
    return {
        "embedding": (1 if spec.tied_embeddings else 2) * spec.vocab_size * h,
        "dense": spec.num_layers * attention_params(spec)
        + dense_layers * mlp_params(spec, spec.intermediate_size)
        + moe * (mlp_params(spec, shared) if shared else 0),
        "experts": moe * spec.num_experts * mlp_params(spec, spec.expert_intermediate_size),
        "other": spec.num_layers * 2 * h + h + moe * h * spec.num_experts,
    }


def weight_bytes(spec, tp: int = 1, pp: int = 1, moe_ranks: int | None = None) -> float:
    """Weight bytes on one GPU: dense weights split over ``tp``, routed experts over
    ``moe_ranks`` (tp x data-parallel ranks; default ``tp``), all layers over ``pp`` stages."""
    c, wb, ab = param_counts(spec), weight_bytes_per_element(spec), spec.bytes_per_param
    ranks = moe_ranks or tp
    # Norms and routers (tiny) are counted as split over tp, as the dense sizing does, so a
    # dense model's weights per GPU are the same on both paths.
    return ((c["embedding"] * ab + c["dense"] * wb + c["other"] * ab) / tp
            + c["experts"] * expert_bytes_per_element(spec) / ranks) / pp


def kv_bytes_per_token(spec, tp: int = 1, pp: int = 1) -> float:
    """KV-cache bytes one token takes on one GPU: K and V of the GPU's KV heads in every layer
    of its stage, or MLA's compressed latent (``kv_lora_rank + qk_rope_head_dim``, the same on
    every tensor-parallel rank)."""
    # Sliding-window layers keep only their window per sequence (vLLM's hybrid KV-cache
    # manager gives them their own, window-sized pool): a token's bytes are the full layers'.
    layers = math.ceil(full_attention_layers(spec) / pp)
    kvb = kv_bytes_per_element(spec)
    if spec.kv_lora_rank:
        return layers * (spec.kv_lora_rank + spec.qk_rope_head_dim) * kvb
    return 2 * layers * max(1, spec.num_kv_heads // tp) * spec.head_dim * kvb


def expert_hit_probabilities(num_experts: int, top_k: int, skew: float = 0.0) -> np.ndarray:
    """Probability that one token routes to each expert: ``k / N`` each under uniform routing;
    with ``skew`` s > 0 expert i's share of the routing follows Zipf (proportional to
    ``(i + 1)^-s``), each capped at 1 (a token picks an expert at most once) with the excess
    shared by the others."""
    share = np.arange(1, num_experts + 1, dtype=float) ** -float(skew)
    p = top_k * share / share.sum()
    # A token picks an expert at most once: cap at 1 and hand the excess to the others in
    # proportion (so every token still makes top_k picks).
    for _ in range(num_experts):
        over = p > 1.0
        if not over.any():
            break
        free = ~over & (p < 1.0)
        excess = (p[over] - 1.0).sum()
        p[over] = 1.0
        p[free] += excess * p[free] / p[free].sum()
    return p


def expected_distinct_experts(num_tokens, num_experts: int, top_k: int,
                              skew: float = 0.0) -> np.ndarray:
    """Expected experts that receive at least one of ``num_tokens`` tokens: ``sum_i 1 - (1 -
    p_i)^n``, i.e. ``N (1 - (1 - k/N)^n)`` under uniform routing (tokens route independently)."""
    n = np.asarray(num_tokens, dtype=float)
    p = expert_hit_probabilities(num_experts, top_k, skew)
    return (1.0 - (1.0 - p[None, :]) ** n.reshape(-1, 1)).sum(axis=1).reshape(n.shape)


def hf_variant_fields(config) -> dict:
    """The MoE, MLA and quantisation fields of a ``ModelSpec`` read from a Hugging Face
    ``config.json`` mapping (Mixtral, Llama-4, Qwen3-MoE, DeepSeek-V3 key names); empty for a
    dense model. Llama-4 keeps its dense MLP width in ``intermediate_size_mlp``: the returned
    ``intermediate_size`` then replaces the expert width the caller read."""
    out: dict = {}
    experts = int(config.get("num_local_experts") or config.get("n_routed_experts")
                  or config.get("num_experts") or 0)
    if experts:
        out.update(num_experts=experts, experts_per_token=int(config["num_experts_per_tok"]))
        width = config.get("moe_intermediate_size") or config["intermediate_size"]
        out["expert_intermediate_size"] = int(width)
        if "intermediate_size_mlp" in config:         # Llama-4: one shared expert, dense MLPs
            out["intermediate_size"] = int(config["intermediate_size_mlp"])
            out["num_shared_experts"] = 1
            out["moe_layer_step"] = int(config.get("interleave_moe_layer_step") or 1)
        else:
            out["num_shared_experts"] = int(config.get("n_shared_experts") or 0)
            out["moe_layer_step"] = int(config.get("moe_layer_freq")
                                        or config.get("decoder_sparse_step") or 1)
            out["first_dense_layers"] = int(config.get("first_k_dense_replace") or 0)
    if config.get("kv_lora_rank"):
        out.update(kv_lora_rank=int(config["kv_lora_rank"]),
                   q_lora_rank=int(config.get("q_lora_rank") or 0),
                   qk_rope_head_dim=int(config.get("qk_rope_head_dim") or 0),
                   head_dim=int(config.get("v_head_dim") or config.get("qk_nope_head_dim")))
    window, types = config.get("sliding_window"), config.get("layer_types") or []
    if window and "sliding_attention" in types:      # gpt-oss: alternating layer types
        out.update(sliding_window=int(window),
                   num_sliding_window_layers=sum(t == "sliding_attention" for t in types))
    if config.get("model_type") == "gpt_oss":
        out["attention_sinks"] = True
    quant = config.get("quantization_config") or {}
    method = str(quant.get("quant_method", "")).lower() if isinstance(quant, dict) else ""
    if method == "mxfp4" and experts:                # gpt-oss: MXFP4 experts, bf16 attention
        out["expert_dtype"] = "mxfp4"
    elif method == "fp8":
        out["weight_dtype"] = "fp8"
    elif method in ("awq", "gptq") and int(quant.get("bits", 4)) == 4:
        out["weight_dtype"] = "int4"
    return out


def is_hybrid_linear_attention(config) -> bool:
    """Whether a Hugging Face config mapping describes a hybrid linear-attention model (Qwen3.5 /
    Qwen3-Next's ``layer_types`` with ``linear_attention``, Kimi-Linear's ``linear_attn_config``),
    which simsched refuses: it times softmax attention only."""
    types = config.get("layer_types") or []
    return "linear_attention" in types or "linear_attn_config" in config \
        or str(config.get("model_type", "")).startswith(("qwen3_next", "qwen3_5"))
