"""Presets of the models people deploy on current GPUs, from their public Hugging Face configs.

Each entry is the ``config.json`` (and, for the quantised checkpoints, ``quantization_config`` /
``hf_quant_config.json``) of the named repository, read for this project (values below); the
catalog (:data:`simsched.cost.hardware.MODELS`) registers them all. Per-part quantisation is as
the checkpoint ships it: ``weight_dtype`` for attention and dense layers, ``expert_dtype`` for
the routed experts.

| preset | repository | what the config says |
|---|---|---|
| ``deepseek-r1`` | deepseek-ai/DeepSeek-R1 | DeepSeek-V3's shape (MLA, 256 experts), FP8 block-scaled |
| ``kimi-k2.5`` | moonshotai/Kimi-K2.5 | 61 layers, 7,168 wide, 64 MLA heads (latent 512 + 64 rope, q rank 1,536), 384 experts of 2,048 (top 8) + 1 shared, first layer dense (18,432), vocab 163,840, 256k context; experts INT4 weight-only (compressed-tensors, group 32), attention bf16 |
| ``gpt-oss-120b`` / ``gpt-oss-20b`` | openai/gpt-oss-120b, -20b | 36 / 24 layers, 2,880 wide, 64 heads of 64, 8 KV heads, 128 / 32 experts of 2,880 (top 4), vocab 201,088, 128k context; layers alternate sliding (window 128) and full attention; attention sinks; experts MXFP4, attention/router/embeddings bf16 |
| ``qwen3-235b-a22b-fp8`` | Qwen/Qwen3-235B-A22B-FP8 | 94 layers, 4,096 wide, 64 heads, 4 KV heads of 128, 128 experts of 1,536 (top 8), vocab 151,936, 40,960 context; FP8 block-scaled (128 x 128) |
| ``qwen3-32b`` (``-fp8``) | Qwen/Qwen3-32B (-FP8) | 64 layers, 5,120 wide, 64 heads, 8 KV heads of 128, MLP 25,600, vocab 151,936, 40,960 context |
| ``minimax-m2.5`` | MiniMaxAI/MiniMax-M2.5 | 62 layers, 3,072 wide, 48 heads, 8 KV heads of 128, 256 experts of 1,536 (top 8), no shared expert, vocab 200,064, 196,608 context; FP8 block-scaled |
| ``llama-3.1-8b-fp8`` / ``llama-3.1-70b-fp8`` | nvidia/Llama-3.1-8B-Instruct-FP8, the FP8 70B | Llama-3.1's shapes, FP8 weights (per-tensor scales) |
| ``deepseek-r1-nvfp4`` (``deepseek-v3-nvfp4``) | nvidia/DeepSeek-R1-0528-FP4(-v2) | DeepSeek-V3's shape; routed experts NVFP4 (block 16), the rest bf16 |
| ``kimi-k2.5-nvfp4`` | nvidia/Kimi-K2.5-NVFP4 | Kimi-K2.5's shape; routed experts NVFP4, attention, shared expert and dense layer bf16 |
| ``minimax-m2.5-nvfp4`` | nvidia/MiniMax-M2.5-NVFP4 | MiniMax-M2.5's shape; experts NVFP4, attention and router bf16 |

Sources: the Kimi-K2.5 values from AIConfigurator's copy of its config
(``src/aiconfigurator/model_configs/moonshotai--Kimi-K2.5_config.json``); gpt-oss's and
MiniMax-M2's from the public configs (transformers' ``GptOssConfig`` defaults are gpt-oss-120b's;
MiniMax-M2.5 shares MiniMax-M2's shape). The NVFP4 checkpoints are NVIDIA Model Optimizer
exports, which keep the layers they leave unquantised in bf16 (the FP8 sources are dequantised
first); DeepSeek's export also quantises the shared experts and the three dense MLPs (and, in
v2, attention's output projection), which simsched's two parts (``weight_dtype``,
``expert_dtype``) price as bf16: a few GB of a 400 GB model. Hybrid linear-attention models
(Qwen3.5, Qwen3-Next: Gated DeltaNet layers between full-attention ones) are refused:
:data:`REFUSED`.
"""

from __future__ import annotations

import dataclasses

from simsched.cost.specs import ModelSpec

_LLAMA_8B = ModelSpec(32, 4096, 32, 8, 14336, 128256, max_context=131072)
_LLAMA_70B = ModelSpec(80, 8192, 64, 8, 28672, 128256, max_context=131072)
_QWEN3_32B = ModelSpec(64, 5120, 64, 8, 25600, 151936, max_context=40960, head_dim=128)
_DEEPSEEK_V3 = ModelSpec(61, 7168, 128, 128, 18432, 129280, max_context=163840,
                         head_dim=128, num_experts=256, experts_per_token=8,
                         num_shared_experts=1, expert_intermediate_size=2048,
                         first_dense_layers=3, kv_lora_rank=512, q_lora_rank=1536,
                         qk_rope_head_dim=64, weight_dtype="fp8")
_KIMI_K25 = ModelSpec(61, 7168, 64, 64, 18432, 163840, max_context=262144, head_dim=128,
                      num_experts=384, experts_per_token=8, num_shared_experts=1,
                      expert_intermediate_size=2048, first_dense_layers=1, kv_lora_rank=512,
                      q_lora_rank=1536, qk_rope_head_dim=64, expert_dtype="int4")
_MINIMAX_M25 = ModelSpec(62, 3072, 48, 8, 1536, 200064, max_context=196608, head_dim=128,
                         num_experts=256, experts_per_token=8, expert_intermediate_size=1536,
                         weight_dtype="fp8")


def _gpt_oss(layers: int, experts: int) -> ModelSpec:
    return ModelSpec(layers, 2880, 64, 8, 2880, 201088, max_context=131072, head_dim=64,
                     num_experts=experts, experts_per_token=4, expert_intermediate_size=2880,
                     expert_dtype="mxfp4", sliding_window=128,
                     num_sliding_window_layers=layers // 2, attention_sinks=True)


MODELS: dict[str, ModelSpec] = {
    "deepseek-r1": _DEEPSEEK_V3,
    "kimi-k2.5": _KIMI_K25,
    "gpt-oss-120b": _gpt_oss(36, 128),
    "gpt-oss-20b": _gpt_oss(24, 32),
    "qwen3-235b-a22b-fp8": ModelSpec(94, 4096, 64, 4, 12288, 151936, max_context=40960,
                                     head_dim=128, num_experts=128, experts_per_token=8,
                                     expert_intermediate_size=1536, weight_dtype="fp8"),
    "qwen3-32b": _QWEN3_32B,
    "qwen3-32b-fp8": dataclasses.replace(_QWEN3_32B, weight_dtype="fp8"),
    "minimax-m2.5": _MINIMAX_M25,
    # NVIDIA's NVFP4 exports: routed experts NVFP4, the rest bf16 (module docstring).
    **{f"{name}-nvfp4": dataclasses.replace(spec, weight_dtype="auto", expert_dtype="nvfp4")
       for name, spec in (("deepseek-r1", _DEEPSEEK_V3), ("deepseek-v3", _DEEPSEEK_V3),
                          ("kimi-k2.5", _KIMI_K25), ("minimax-m2.5", _MINIMAX_M25))},
    "llama-3.1-8b-fp8": dataclasses.replace(_LLAMA_8B, weight_dtype="fp8"),
    "llama-3.1-70b-fp8": dataclasses.replace(_LLAMA_70B, weight_dtype="fp8"),
}

# Models simsched cannot time, by name, and why (hardware.model naming one is refused with it).
REFUSED: dict[str, str] = {
    name: "hybrid linear attention (Gated DeltaNet layers between full-attention layers) is not "
          "modelled: simsched times softmax attention only"
    for name in ("qwen3.5-397b-a17b", "qwen3.5-122b-a10b", "qwen3.5-35b-a3b", "qwen3.5-27b",
                 "qwen3-next-80b-a3b")
}
