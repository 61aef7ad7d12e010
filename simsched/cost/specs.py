"""Shapes of models and datasheet peaks of GPUs: :class:`ModelSpec` and :class:`GPUSpec`.

The catalog of named models and GPUs, the configuration checks and the KV-cache sizing that use
them are in :mod:`simsched.cost.hardware` (which re-exports both classes); the sizes of a
non-plain model (MoE, MLA, fp8) in :mod:`simsched.cost.shapes`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from simsched.cost import shapes


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a decoder-only (Llama-family) transformer.

    ``head_dim``: channels per attention head; 0 (default) means ``hidden_size / num_heads``
    (set it where a config gives its own, as Mistral-NeMo's 128 with 5,120 / 32 = 160). ``rope``: rotary position embedding (an element-wise op per layer); False for ALiBi models
    (BLOOM), whose position bias is fused into attention. ``tied_embeddings``: the LM head shares
    the embedding matrix (counted once in the weights).

    Mixture of experts (all 0 for a dense model): ``num_experts`` routed experts of width
    ``expert_intermediate_size`` (0: ``intermediate_size``), ``experts_per_token`` (top-k) of them
    per token, ``num_shared_experts`` always-on experts of the same width; MoE layers are every
    ``moe_layer_step``-th layer after the first ``first_dense_layers`` (the others are dense
    MLPs of ``intermediate_size``). Multi-head latent attention (DeepSeek-V3; 0: grouped-query
    attention): ``kv_lora_rank`` (the compressed KV a token caches per layer, with
    ``qk_rope_head_dim`` rotary channels), ``q_lora_rank``; ``head_dim`` is then the per-head
    no-rope query/key and value width. ``weight_dtype``: the linear layers' weights (``auto``:
    the activation dtype of ``bytes_per_param``; ``fp8``; ``int4`` weight-only);
    ``kv_cache_dtype``: the KV cache's (``auto`` or ``fp8``). Per-part quantisation, as
    checkpoints ship it: ``expert_dtype`` the routed experts' weights (``auto``: as
    ``weight_dtype``; e.g. ``int4`` experts with bf16 attention for Kimi-K2.5, ``mxfp4`` for
    gpt-oss). Sliding-window attention (gpt-oss): ``num_sliding_window_layers`` of the layers
    attend to the last ``sliding_window`` tokens only (0: every layer attends to all);
    ``attention_sinks`` marks per-head sink logits (no cost of their own). Sizes:
    :mod:`simsched.cost.shapes`.
    """

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    gated_mlp: bool = True
    bytes_per_param: int = 2
    max_context: int = 4096
    rope: bool = True
    tied_embeddings: bool = False
    head_dim: int = 0
    num_experts: int = 0
    experts_per_token: int = 0
    num_shared_experts: int = 0
    expert_intermediate_size: int = 0
    moe_layer_step: int = 1
    first_dense_layers: int = 0
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    weight_dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    expert_dtype: str = "auto"
    sliding_window: int = 0
    num_sliding_window_layers: int = 0
    attention_sinks: bool = False

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads",
                     "intermediate_size", "vocab_size", "bytes_per_param", "max_context"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ModelSpec.{name} must be a positive integer, got {value!r}")
        if isinstance(self.head_dim, bool) or not isinstance(self.head_dim, int) \
                or self.head_dim < 0:
            raise ValueError(f"ModelSpec.head_dim must be a positive integer (or 0: hidden_size "
                             f"/ num_heads), got {self.head_dim!r}")
        if not self.head_dim:
            if self.hidden_size % self.num_heads:
                raise ValueError(f"ModelSpec.hidden_size ({self.hidden_size}) must be divisible "
                                 f"by num_heads ({self.num_heads}) unless head_dim is given")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ModelSpec.num_heads ({self.num_heads}) must be divisible by "
                             f"num_kv_heads ({self.num_kv_heads})")
        shapes.check_fields(self)

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any] | str | os.PathLike,
                       bytes_per_param: int = 2) -> "ModelSpec":
        """Build a spec from a Hugging Face ``config.json`` (Llama/Mistral/Phi keys; the MoE,
        MLA and FP8 keys of Mixtral, Llama-4, Qwen3-MoE and DeepSeek-V3).

        ``config`` is the parsed mapping, the path of the JSON file, or a model folder holding a
        ``config.json``.
        """
        if isinstance(config, (str, os.PathLike)):
            config = _read_hf_config(Path(config))
        if not isinstance(config, Mapping):
            raise ValueError(f"hf config must be a mapping or the path of a config.json, got "
                             f"{type(config).__name__}")
        if isinstance(config.get("text_config"), Mapping):    # Llama-4: the text model's keys
            config = {**config["text_config"],
                      "quantization_config": config.get("quantization_config")}
        if shapes.is_hybrid_linear_attention(config):
            raise ValueError("hf config: hybrid linear attention (Qwen3.5 / Qwen3-Next Gated "
                             "DeltaNet layers, Kimi-Linear) is not modelled: simsched times "
                             "softmax attention only")
        try:
            heads = int(config["num_attention_heads"])
            fields = dict(
                num_layers=int(config["num_hidden_layers"]),
                hidden_size=int(config["hidden_size"]),
                num_heads=heads,
                num_kv_heads=int(config.get("num_key_value_heads") or heads),
                intermediate_size=int(config["intermediate_size"]),
                vocab_size=int(config["vocab_size"]),
                # Llama-family MLPs are gated (SiLU); GPT/Phi-style use a plain GELU MLP.
                gated_mlp=str(config.get("hidden_act", "silu")).lower() in ("silu", "swiglu"),
                bytes_per_param=bytes_per_param,
                max_context=int(config.get("max_position_embeddings", 4096)),
                head_dim=int(config.get("head_dim") or 0),
            )
            fields.update(shapes.hf_variant_fields(config))
        except KeyError as exc:
            raise ValueError(f"hf config is missing field {exc.args[0]!r}") from None
        return cls(**fields)

    @property
    def is_plain(self) -> bool:
        """Dense, grouped-query attention, weights and KV in the activation dtype."""
        return shapes.is_plain(self)

    @property
    def num_params(self) -> int:
        """Parameters: embedding and LM head (once if tied) plus every layer's projections and norms."""
        if not self.is_plain:
            return sum(shapes.param_counts(self).values())
        h, d = self.hidden_size, self.head_dim
        attn = h * (self.num_heads + 2 * self.num_kv_heads) * d + self.num_heads * d * h
        mlp = h * self.intermediate_size * (3 if self.gated_mlp else 2)
        emb = (1 if self.tied_embeddings else 2) * self.vocab_size * h
        return emb + self.num_layers * (attn + mlp + 2 * h) + h

    @property
    def param_bytes(self) -> int:
        """Bytes of all weights (linear layers in ``weight_dtype``)."""
        if not self.is_plain:
            return int(shapes.weight_bytes(self))
        return self.num_params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token takes over all layers: 2 x layers x kv_heads x head_dim x bytes."""
        if not self.is_plain:
            return int(shapes.kv_bytes_per_token(self))
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.bytes_per_param


def _read_hf_config(path: Path) -> Mapping[str, Any]:
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"hf config file not found: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a JSON config ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


@dataclass(frozen=True)
class GPUSpec:
    """Datasheet peaks of one GPU: dense bf16 FLOP/s, HBM bytes/s, memory bytes, link bytes/s.

    ``kernels``: the calibration profile this GPU's kernel times come from (``a100-80gb`` or
    ``h200`` fits, or ``aic-<gpu>``: that GPU's AIConfigurator tables);
    ``serving``: the measured serving system (``dgx-a100``, ``dgx-h100``, ``dgx-h100-pcap``) whose
    fitted whole-iteration terms the ``eager_2023`` engine overhead uses; ``calibration``:
    ``measured`` or ``extrapolated``; ``prefill_slowdown``: GPU time of iterations that prefill
    is multiplied by it (a power cap binds when the GPU computes hard, not in decode).
    Spec-sheet facts the kernels do not read (shown by ``describe()``; 0 or empty: not given):
    ``fp8_flops`` / ``fp4_flops`` dense tensor FLOP/s (0: no such tensor cores),
    ``nvlink`` the link (``NVLink 3``..``NVLink 5``, ``PCIe``) and ``nvlink_domain`` the GPUs one
    NVLink domain joins (8 for an HGX board, 72 for an NVL72 rack, 1 without NVLink).
    ``all_reduce``: where the vLLM-form profiles' custom all-reduce time comes from, ``fitted``
    (the catalog's) or ``measured`` (set by ``hardware.all_reduce``;
    :func:`simsched.cost.vllm_v1.comm_table`).
    """

    name: str
    peak_flops: float
    mem_bandwidth: float
    memory_bytes: int
    interconnect_bandwidth: float
    kernels: str = "a100-80gb"
    serving: str = "dgx-a100"
    calibration: str = "extrapolated"
    prefill_slowdown: float = 1.0
    fp8_flops: float = 0.0
    fp4_flops: float = 0.0
    nvlink: str = ""
    nvlink_domain: int = 0
    all_reduce: str = "fitted"
