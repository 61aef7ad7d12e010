"""Model and GPU catalog, configuration checks, KV-cache capacity and cost-model construction.

A model is described by its shape (the numbers of a Hugging Face ``config.json``), a GPU by its
datasheet peaks and by where its times come from: ``kernels`` names the calibration profile it
uses (the A100-80GB or H200 fits, or its own AIConfigurator tables, ``aic-<gpu>``;
``hardware.kernel_profile`` can choose the latter, :func:`gpu_spec`), ``serving`` the measured serving system whose whole-iteration engine terms it uses,
``calibration`` says whether it was measured or is extrapolated. :func:`describe` prints the table.
The two spec classes (:class:`~simsched.cost.specs.ModelSpec`,
:class:`~simsched.cost.specs.GPUSpec`) are defined in :mod:`simsched.cost.specs`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

from simsched.cost import deployed, shapes
from simsched.cost.profile_names import ALL_REDUCE_CHOICES, CUSTOM_ALL_REDUCE, engine_of
# The spec classes live in specs.py; re-exported, since configs and users import them from here.
from simsched.cost.specs import GPUSpec, ModelSpec, _read_hf_config  # noqa: F401

GIB = 2**30
TP_SIZES = (1, 2, 4, 8)


# Shapes from each model's Hugging Face config.json.
MODELS: dict[str, ModelSpec] = {
    "llama-2-7b": ModelSpec(32, 4096, 32, 32, 11008, 32000, max_context=4096),
    "llama-2-13b": ModelSpec(40, 5120, 40, 40, 13824, 32000, max_context=4096),
    "llama-2-70b": ModelSpec(80, 8192, 64, 8, 28672, 32000, max_context=4096),
    "llama-3-8b": ModelSpec(32, 4096, 32, 8, 14336, 128256, max_context=8192),
    # Llama-3.1-8B: Llama-3-8B's shape with a 128k context (long-prompt traces such as Mooncake).
    "llama-3.1-8b": ModelSpec(32, 4096, 32, 8, 14336, 128256, max_context=131072),
    "llama-3-70b": ModelSpec(80, 8192, 64, 8, 28672, 128256, max_context=8192),
    # Mistral-7B-v0.2+ (no sliding window): 32k context.
    "mistral-7b": ModelSpec(32, 4096, 32, 8, 14336, 32000, max_context=32768),
    # phi-2: parallel attention/MLP block with a plain GELU MLP.
    "phi-2": ModelSpec(32, 2560, 32, 32, 10240, 51200, gated_mlp=False, max_context=2048),
    # BLOOM-176B: 112 heads of 128 (no GQA), 4x GELU MLP, ALiBi (no rope), tied embeddings;
    # trained at 2,048 tokens, ALiBi runs longer (the real-serving runs use 8,192-token prompts).
    "bloom-176b": ModelSpec(70, 14336, 112, 112, 57344, 250880, gated_mlp=False,
                            max_context=2048, rope=False, tied_embeddings=True),
    # The dense models of the real vLLM 0.15 runs (simsched/cost/data/vllm_v1/). Shapes written
    # from the public Hugging Face config.json of each (from memory of those files, not fetched):
    # meta-llama/Llama-3.1-70B: Llama-3-70B's shape with a 128k context.
    "llama-3.1-70b": ModelSpec(80, 8192, 64, 8, 28672, 128256, max_context=131072),
    # codellama/CodeLlama-34b-hf: grouped-query attention (8 KV heads), 16k context.
    "codellama-34b": ModelSpec(48, 8192, 64, 8, 22016, 32000, max_context=16384),
    # mistralai/Mistral-Nemo-Base-2407: head_dim 128 (not 5,120 / 32), 128k context.
    "mistral-nemo-12b": ModelSpec(40, 5120, 32, 8, 14336, 131072, max_context=131072,
                                  head_dim=128),
    # Qwen/Qwen2.5-7B-Instruct: 28 layers, 4 KV heads, untied LM head, 32k context.
    "qwen2.5-7b": ModelSpec(28, 3584, 28, 4, 18944, 152064, max_context=32768),
    # 01-ai/Yi-34B: 56 heads, 8 KV heads, 4k context.
    "yi-34b": ModelSpec(60, 7168, 56, 8, 20480, 64000, max_context=4096),
    # Mixture-of-experts models (from memory of each public config.json, not fetched; bf16
    # checkpoints unless said). mistralai/Mixtral-8x7B-v0.1: 8 experts, top-2, every layer.
    "mixtral-8x7b": ModelSpec(32, 4096, 32, 8, 14336, 32000, max_context=32768,
                              num_experts=8, experts_per_token=2),
    # mistralai/Mixtral-8x22B-v0.1: 8 experts, top-2, 64k context.
    "mixtral-8x22b": ModelSpec(56, 6144, 48, 8, 16384, 32768, max_context=65536,
                               num_experts=8, experts_per_token=2),
    # meta-llama/Llama-4-Scout-17B-16E: 16 routed experts (top-1) and a shared expert of 8,192
    # in every layer (dense MLP width 16,384 unused); its 10M context capped at 128k here.
    "llama-4-scout-17b-16e": ModelSpec(48, 5120, 40, 8, 16384, 202048, max_context=131072,
                                       head_dim=128, num_experts=16, experts_per_token=1,
                                       num_shared_experts=1, expert_intermediate_size=8192),
    # Qwen/Qwen3-30B-A3B: 128 experts of 768, top-8, no shared expert, 4 KV heads of 128.
    "qwen3-30b-a3b": ModelSpec(48, 2048, 32, 4, 6144, 151936, max_context=40960, head_dim=128,
                               num_experts=128, experts_per_token=8,
                               expert_intermediate_size=768),
    # deepseek-ai/DeepSeek-V3: MLA (512-wide compressed KV + 64 rope channels), 3 dense layers
    # then 256 experts of 2,048 (top-8) and one shared expert; shipped in FP8.
    "deepseek-v3": ModelSpec(61, 7168, 128, 128, 18432, 129280, max_context=163840,
                             head_dim=128, num_experts=256, experts_per_token=8,
                             num_shared_experts=1, expert_intermediate_size=2048,
                             first_dense_layers=3, kv_lora_rank=512, q_lora_rank=1536,
                             qk_rope_head_dim=64, weight_dtype="fp8"),
}
# The models of current deployments (MLA, FP8/INT4/MXFP4 per part, sliding windows), from their
# public configs: simsched.cost.deployed lists each repository and the values used.
MODELS.update(deployed.MODELS)

# Dense (non-sparse) bf16 tensor FLOP/s, HBM bandwidth and NVLink bandwidth (total, both
# directions) from the NVIDIA datasheets: A100 (nvidia.com/content/dam/en-zz/Solutions/
# Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), H100 and H200
# (nvidia.com/en-us/data-center/h100/, /h200/), L40S (nvidia.com/en-us/data-center/l40s/,
# PCIe Gen4 x16 = 64 GB/s, no NVLink). Memory is what the driver exposes (nvidia-smi MiB).
# H100-SXM power-capped: the bundled DGX-H100 runs under a power cap take 1.30x as long in every
# prompt phase and the same time in decode: the cap lowers the clock while the GPU computes hard
# (prefill), not while it streams memory (decode).
PCAP_SLOWDOWN = 1.30
# FP8 / FP4 dense tensor FLOP/s, NVLink generation and domain: the same datasheets. The Blackwell
# and RTX Pro 6000 entries take their datasheet facts from AIConfigurator's system files
# (aic-core/src/aiconfigurator_core/systems/<system>.yaml @ 095f58a, which cite NVIDIA's
# datasheets; memory as nvidia-smi reports it there); NVLink 5 moves 1.8 TB/s per GPU (both
# directions), an HGX board joins 8 GPUs, a GB200/GB300 NVL72 rack 72; the RTX Pro 6000 Server
# Edition has no NVLink (PCIe Gen5 x16: 128 GB/s both directions).
# Profile prefix of AIConfigurator's measured tables (simsched.cost.profiles.aiconfigurator).
AIC = "aic-"
GPUS: dict[str, GPUSpec] = {
    "a100-40gb": GPUSpec("a100-40gb", 312e12, 1555e9, 40960 * 2**20, 600e9,
                         nvlink="NVLink 3", nvlink_domain=8),
    "a100-80gb": GPUSpec("a100-80gb", 312e12, 2039e9, 81920 * 2**20, 600e9,
                         calibration="measured", nvlink="NVLink 3", nvlink_domain=8),
    "h100-sxm": GPUSpec("h100-sxm", 989e12, 3350e9, 81559 * 2**20, 900e9, kernels="h200",
                        serving="dgx-h100", calibration="measured", fp8_flops=1979e12,
                        nvlink="NVLink 4", nvlink_domain=8),
    "h100-sxm-pcap": GPUSpec("h100-sxm-pcap", 989e12, 3350e9, 81559 * 2**20, 900e9,
                             kernels="h200", serving="dgx-h100-pcap", calibration="measured",
                             prefill_slowdown=PCAP_SLOWDOWN, fp8_flops=1979e12,
                             nvlink="NVLink 4", nvlink_domain=8),
    "h200": GPUSpec("h200", 989e12, 4800e9, 143771 * 2**20, 900e9, kernels="h200",
                    serving="dgx-h100", calibration="measured", fp8_flops=1979e12,
                    nvlink="NVLink 4", nvlink_domain=8),
    # The L40S reads its own measured AIConfigurator tables: the A100's fits scaled by the
    # datasheet (its default before) are the catalog's worst spec-sheet extrapolation (GDDR6 and
    # a large L2: docs/gpus.md, "Leave one GPU out").
    "l40s": GPUSpec("l40s", 362e12, 864e9, 46068 * 2**20, 64e9, kernels=AIC + "l40s",
                    calibration="measured", fp8_flops=733e12, nvlink="PCIe Gen4",
                    nvlink_domain=1),
    "b200": GPUSpec("b200", 2250e12, 7700e9, 180 * GIB, 1800e9, kernels=AIC + "b200",
                    serving="dgx-h100", calibration="measured", fp8_flops=4500e12,
                    fp4_flops=9000e12, nvlink="NVLink 5", nvlink_domain=8),
    "b300": GPUSpec("b300", 2250e12, 7750e9, 275040 * 2**20, 1800e9, kernels=AIC + "b300",
                    serving="dgx-h100", calibration="measured", fp8_flops=4500e12,
                    fp4_flops=14000e12, nvlink="NVLink 5", nvlink_domain=8),
    "gb200": GPUSpec("gb200", 2500e12, 8000e9, 189471 * 2**20, 1800e9, kernels=AIC + "gb200",
                     serving="dgx-h100", calibration="measured", fp8_flops=5000e12,
                     fp4_flops=10000e12, nvlink="NVLink 5", nvlink_domain=72),
    "gb300": GPUSpec("gb300", 2500e12, 8000e9, 284208 * 2**20, 1800e9, kernels=AIC + "gb300",
                     serving="dgx-h100", calibration="measured", fp8_flops=5000e12,
                     fp4_flops=15000e12, nvlink="NVLink 5", nvlink_domain=72),
    "rtx-pro-6000": GPUSpec("rtx-pro-6000", 467.8e12, 1792e9, 97887 * 2**20, 128e9,
                            kernels=AIC + "rtx-pro-6000", serving="dgx-h100",
                            calibration="measured", fp8_flops=935.6e12, fp4_flops=1871.2e12,
                            nvlink="PCIe Gen5", nvlink_domain=1),
}
_AIC_KERNELS = ("measured: AIConfigurator vLLM kernel tables (bf16 and FP8 GEMMs, prefill and "
                "decode attention, all-reduce); derived: element-wise ops, cached-prefix "
                "attention, MoE/MLA/INT4 models (H200 fits scaled by the datasheet)")
# What was measured for each GPU, and what is extrapolated from where (describe() prints it).
GPU_SOURCES: dict[str, tuple[str, str]] = {
    "a100-40gb": ("extrapolated: A100-80GB kernel fits scaled to 1.56 TB/s HBM",
                  "assumed: DGX-A100 terms"),
    "a100-80gb": ("measured: Vidur A100 kernel profiles",
                  "measured: DGX-A100 serving runs (Llama-2-70B TP 2/4/8)"),
    "h100-sxm": ("derived from the measured H200 (same chip; HBM bandwidth 3.35 vs 4.8 TB/s)",
                 "measured: DGX-H100 serving runs (Llama-2-70B TP 2/4/8)"),
    "h100-sxm-pcap": ("derived from the measured H200; prefill iterations 1.30x slower (cap)",
                      "measured: power-capped DGX-H100 serving runs (Llama-2-70B TP 2/4/8)"),
    "h200": ("measured: H200 operator profiles (this project, CUDA graphs)",
             "assumed: DGX-H100 terms (same host generation); no H200 serving runs"),
    "l40s": (_AIC_KERNELS, "assumed: DGX-A100 terms"),
    **{g: (_AIC_KERNELS, "assumed: DGX-H100 terms") for g in
       ("b200", "b300", "gb200", "gb300", "rtx-pro-6000")},
}
# hardware.kernel_profile: where a GPU's kernel times come from instead of its catalog default.
KERNEL_PROFILES = ("aiconfigurator",)
# GPUs that read another's AIConfigurator tables (the power cap is the same H100).
_AIC_TABLES = {"h100-sxm-pcap": "h100-sxm"}


def gpu_spec(hw) -> GPUSpec:
    """``hw.gpu``'s catalog entry; with ``hw.kernel_profile="aiconfigurator"`` its kernels come
    from that GPU's AIConfigurator tables (an error naming the field when none are shipped):
    those measured under the engine of ``hw.engine_overhead`` (``sglang``, ``trtllm``) where
    AIConfigurator has them (H100, H200), else its vLLM tables. ``hw.all_reduce="measured"``
    marks it to time the custom all-reduce from that GPU's measured tables (a config checks
    that choice when it is made: :func:`check_all_reduce`, from :func:`validate`); ``"auto"``
    does where it can (:func:`measures_all_reduce`)."""
    gpu = _kernel_gpu(hw)
    if measures_all_reduce(hw):
        return dataclasses.replace(gpu, all_reduce="measured")
    return gpu


def measures_all_reduce(hw) -> bool:
    """Whether ``hw`` times its custom all-reduce from measured tables: ``all_reduce="measured"``,
    or ``"auto"`` where that choice would be accepted (:func:`measured_all_reduce_refusal`)."""
    choice = getattr(hw, "all_reduce", "fitted")
    if choice == "auto":
        return measured_all_reduce_refusal(hw) is None
    return choice == "measured"


# GPUs whose all-reduces AIConfigurator measured on another catalog entry with the same links.
_AIC_ALL_REDUCE = {**_AIC_TABLES, "a100-40gb": "a100-80gb"}


def all_reduce_tables(gpu: str) -> str | None:
    """The AIConfigurator table set holding ``gpu``'s measured all-reduces (None: none)."""
    from simsched.cost import aiconfigurator as aic

    name = _AIC_ALL_REDUCE.get(gpu, gpu)
    return name if name in aic.gpus() and aic.measured_all_reduce_gpus(name) else None


def check_all_reduce(hw) -> None:
    """``hw.all_reduce``: one of :data:`simsched.cost.profile_names.ALL_REDUCE_CHOICES`; ``measured``
    replaces the custom all-reduce of a vLLM-form engine profile on default kernels, on a GPU
    with measured all-reduces. A ValueError names the field otherwise."""
    choice = getattr(hw, "all_reduce", "fitted")
    if choice not in ALL_REDUCE_CHOICES:
        raise ValueError(f"hardware.all_reduce must be one of "
                         f"{list(ALL_REDUCE_CHOICES)}, got {choice!r}")
    refusal = measured_all_reduce_refusal(hw) if choice == "measured" else None
    if refusal is not None:
        raise ValueError(refusal)


def measured_all_reduce_refusal(hw) -> str | None:
    """Why ``all_reduce="measured"`` cannot time ``hw``'s custom all-reduce, naming the field
    (None: it can): it replaces that of a vLLM-form engine profile of the calibrated model on
    the default kernels, on a GPU with measured all-reduces. The one rule behind both
    :func:`check_all_reduce` (``measured`` refused) and ``auto`` (:func:`measures_all_reduce`)."""
    engine = getattr(hw, "engine_overhead", None)
    if engine not in CUSTOM_ALL_REDUCE:
        return (f"hardware.all_reduce='measured' replaces the custom all-reduce of the "
                f"engine profiles {sorted(CUSTOM_ALL_REDUCE)}; "
                f"hardware.engine_overhead is {engine!r}")
    if getattr(hw, "kernel_profile", None) is not None:
        return ("hardware.all_reduce='measured': hardware.kernel_profile="
                f"{hw.kernel_profile!r} times every all-reduce from its measured "
                "tables already; leave all_reduce 'fitted'")
    if getattr(hw, "cost_model", "calibrated") != "calibrated":
        return ("hardware.all_reduce='measured' times the calibrated cost model's "
                f"all-reduces; hardware.cost_model is {hw.cost_model!r}")
    if all_reduce_tables(hw.gpu) is None:
        return (f"hardware.all_reduce='measured': no measured all-reduces for "
                f"hardware.gpu={hw.gpu!r}")
    return None


def _kernel_gpu(hw) -> GPUSpec:
    """``hw.gpu``'s catalog entry with the kernels ``hw.kernel_profile`` chooses."""
    gpu = GPUS[hw.gpu]
    choice = getattr(hw, "kernel_profile", None)
    if choice is None:
        return gpu
    if choice not in KERNEL_PROFILES:
        raise ValueError(f"hardware.kernel_profile must be None or one of "
                         f"{list(KERNEL_PROFILES)}, got {choice!r}")
    from simsched.cost.profiles import PROFILES   # profiles import this module

    name = AIC + _AIC_TABLES.get(hw.gpu, hw.gpu)
    # The engine's own tables (aic-<engine>-<gpu>: SGLang, TensorRT-LLM) where measured.
    # A profile on an engine's (profile_names.CARRIED) reads that engine's tables.
    engine = engine_of(getattr(hw, "engine_overhead", ""))
    own = f"{AIC}{engine}-{_AIC_TABLES.get(hw.gpu, hw.gpu)}"
    if own in PROFILES:
        return dataclasses.replace(gpu, kernels=own, calibration="measured")
    if name not in PROFILES:
        have = sorted(p[len(AIC):] for p in PROFILES if p.startswith(AIC))
        raise ValueError(f"hardware.kernel_profile='aiconfigurator': no AIConfigurator kernel "
                         f"tables for hardware.gpu={hw.gpu!r}; measured: {have}")
    return dataclasses.replace(gpu, kernels=name, calibration="measured")


def kernel_source(gpu: GPUSpec) -> str:
    """Where ``gpu``'s kernel times come from (measured, derived or extrapolated)."""
    if gpu.kernels.startswith(AIC):
        tables = gpu.kernels[len(AIC):]
        for engine, label in (("sglang-", "SGLang"), ("trtllm-", "TensorRT-LLM")):
            if tables.startswith(engine):      # an engine's own tables (<engine>-<gpu>)
                return _AIC_KERNELS.replace("vLLM kernel tables", f"{label} kernel tables of "
                                            f"the {tables[len(engine):]}")
        return _AIC_KERNELS.replace("tables", f"tables of the {tables}")
    return GPU_SOURCES.get(gpu.name, (f"extrapolated from the {gpu.kernels} fits "
                                      f"(user-defined GPU)", ""))[0]

REFERENCE_GPU = "a100-80gb"  # the GPU the Vidur profiles were measured on


def describe() -> str:
    """A table of the GPU catalog: datasheet peaks and, per GPU, what is measured or extrapolated.

    ``kernels`` is where the kernel times come from, ``whole iteration`` where the ``eager_2023``
    engine terms (collective sync, host launch floor, serial CPU) come from.
    """
    lines = [f"{'gpu':<14} {'calibration':<12} {'TFLOP/s':>8} {'FP8':>5} {'FP4':>5} "
             f"{'HBM TB/s':>9} {'GiB':>5} {'link':<10} {'domain':>6}  kernels | whole iteration"]
    for name, g in GPUS.items():
        kern, whole = GPU_SOURCES.get(name, ("extrapolated: A100 fits (user-defined GPU)",
                                             "assumed: DGX-A100 terms"))
        lines.append(f"{name:<14} {g.calibration:<12} {g.peak_flops / 1e12:>8.0f} "
                     f"{g.fp8_flops / 1e12:>5.0f} {g.fp4_flops / 1e12:>5.0f} "
                     f"{g.mem_bandwidth / 1e12:>9.2f} {g.memory_bytes / GIB:>5.0f} "
                     f"{g.nvlink or '-':<10} {g.nvlink_domain:>6}  {kern} | {whole}")
    return "\n".join(lines)


def register_model(name: str, spec: ModelSpec) -> None:
    """Add (or replace) a model in this process's catalog so configs can name it.

    The catalog is a module global: worker processes of a sweep (spawned, or on Ray) do not see
    it. To run a custom model anywhere, put its shape in the config instead:
    ``HardwareConfig(model="my-model", model_spec=spec)``.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"model name must be a non-empty string, got {name!r}")
    if not isinstance(spec, ModelSpec):
        raise ValueError(f"spec must be a ModelSpec, got {type(spec).__name__}")
    MODELS[name] = spec


def as_model_spec(value: Any) -> ModelSpec:
    """A :class:`ModelSpec` from a spec, a mapping of its fields or of a Hugging Face
    ``config.json``, or the path of such a file (what ``hardware.model_spec`` accepts)."""
    if isinstance(value, ModelSpec):
        return value
    if isinstance(value, (str, os.PathLike)):
        return ModelSpec.from_hf_config(value)
    if isinstance(value, Mapping):
        if "num_hidden_layers" in value:
            return ModelSpec.from_hf_config(value)
        try:
            return ModelSpec(**value)
        except TypeError as exc:
            raise ValueError(f"hardware.model_spec: {exc}") from None
    raise ValueError(f"hardware.model_spec must be a ModelSpec, a mapping, the path of a "
                     f"config.json or None, got {value!r}")


def _spec(hw) -> ModelSpec:
    """The shape of ``hw``'s model: ``hw.model_spec`` if set, else the catalog's entry."""
    spec = getattr(hw, "model_spec", None)
    if spec is not None:
        return spec
    if hw.model in deployed.REFUSED and hw.model not in MODELS:
        raise ValueError(f"hardware.model {hw.model!r} is refused: {deployed.REFUSED[hw.model]}")
    if hw.model not in MODELS:
        raise ValueError(f"hardware.model must be one of {sorted(MODELS)} (or give its shape "
                         f"in hardware.model_spec), got {hw.model!r}")
    return MODELS[hw.model]


def validate(hw) -> None:
    """Check model, GPU and tensor-parallel degree; raise ValueError naming the bad field.

    A config carrying its own ``model_spec`` needs no catalog entry (so it works in any worker
    process), but may not reuse a catalog name for a different shape.
    """
    spec = _spec(hw)
    if getattr(hw, "model_spec", None) is not None and hw.model in MODELS \
            and MODELS[hw.model] != spec:
        raise ValueError(f"hardware.model {hw.model!r} names a catalog model of another shape "
                         f"than hardware.model_spec; give the custom model its own name")
    if hw.gpu not in GPUS:
        raise ValueError(f"hardware.gpu must be one of {sorted(GPUS)}, got {hw.gpu!r}")
    gpu_spec(hw)   # hardware.kernel_profile names a profile this GPU has
    check_all_reduce(hw)
    tp = hw.tensor_parallel_size
    if tp not in TP_SIZES:
        raise ValueError(f"hardware.tensor_parallel_size must be one of {list(TP_SIZES)}, "
                         f"got {tp!r}")
    # Heads are split across GPUs; KV heads may also be replicated when tp exceeds them (vLLM).
    if spec.num_heads % tp or (spec.num_kv_heads % tp and tp % spec.num_kv_heads):
        raise ValueError(f"hardware.tensor_parallel_size={tp} must divide {hw.model}'s "
                         f"{spec.num_heads} attention heads and {spec.num_kv_heads} KV heads")


def model_spec(hw) -> ModelSpec:
    """The shape of ``hw``'s model: ``hw.model_spec`` if set, else the catalog entry of ``hw.model``."""
    validate(hw)
    return _spec(hw)


def max_model_len(hw) -> int:
    """``hw.max_model_len`` if set, else the model's context length."""
    spec = model_spec(hw)
    if hw.max_model_len is not None:
        if hw.max_model_len > spec.max_context:
            raise ValueError(f"hardware.max_model_len ({hw.max_model_len}) exceeds {hw.model}'s "
                             f"context length {spec.max_context}")
        return hw.max_model_len
    return spec.max_context


def kv_bytes_per_token(hw) -> int:
    """KV-cache bytes one token takes on each GPU (KV heads split, or replicated, across TP)."""
    spec = model_spec(hw)
    par = getattr(hw, "parallel", None)
    if par is not None or not spec.is_plain:   # pipeline stages' layers, KV dtype, MLA latent
        pp = par.pipeline_parallel_size if par is not None else 1
        return int(shapes.kv_bytes_per_token(spec, hw.tensor_parallel_size, pp))
    kv_heads_per_gpu = max(1, spec.num_kv_heads // hw.tensor_parallel_size)
    return 2 * spec.num_layers * kv_heads_per_gpu * spec.head_dim * spec.bytes_per_param


def activation_reserve_bytes(hw) -> int:
    """Memory kept back from the KV cache per GPU: CUDA context and workspaces plus activations.

    vLLM sizes the cache after a profiling forward pass of ``max(2048, max_model_len)`` tokens;
    its peak activations are roughly the widest per-token tensors (QKV and the gated MLP's
    up-projection) for that many tokens, plus ~1 GiB of CUDA context/cuBLAS/NCCL workspace.
    """
    spec, tp = model_spec(hw), hw.tensor_parallel_size
    tokens = max(2048, max_model_len(hw))
    widest = 4 * spec.hidden_size + 2 * spec.intermediate_size * (2 if spec.gated_mlp else 1) // tp
    return GIB + tokens * widest * spec.bytes_per_param


def kv_capacity_blocks(hw, block_size: int) -> int:
    """KV blocks per GPU as vLLM computes them: (memory x utilisation - weights - reserve) / block.

    With ``hw.parallel`` or a non-plain model the weights per GPU follow
    :func:`simsched.cost.shapes.weight_bytes` (weight dtype, experts over tp x dp ranks, pp
    stages) and a data-parallel replica has ``data_parallel_size`` GPUs' blocks.

    Raises ValueError when the weights (sharded over ``tensor_parallel_size`` GPUs) and the
    reserve leave no room for even one block.
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"cache.block_size must be a positive integer, got {block_size!r}")
    spec, gpu = model_spec(hw), GPUS[hw.gpu]
    budget = gpu.memory_bytes * hw.gpu_memory_utilization
    par = getattr(hw, "parallel", None)
    if par is None and spec.is_plain:
        weights = spec.param_bytes / hw.tensor_parallel_size
        ranks = 1
    else:  # dense weights over tp, routed experts over tp x dp, everything over pp stages
        ranks = par.data_parallel_size if par is not None else 1
        weights = shapes.weight_bytes(spec, hw.tensor_parallel_size,
                                      par.pipeline_parallel_size if par is not None else 1,
                                      hw.tensor_parallel_size * ranks)
    free = budget - weights - activation_reserve_bytes(hw)
    # Every data-parallel rank caches its own sequences: the replica has dp GPUs' blocks.
    blocks = int(free // (kv_bytes_per_token(hw) * block_size)) * ranks
    if blocks < 1:
        raise ValueError(
            f"hardware: {hw.model} weights ({weights / GIB:.1f} GiB per GPU) do not fit in "
            f"{hw.gpu_memory_utilization:.0%} of one {hw.gpu} ({gpu.memory_bytes / GIB:.0f} GiB) "
            f"at hardware.tensor_parallel_size={hw.tensor_parallel_size}; raise "
            f"tensor_parallel_size or gpu_memory_utilization")
    return blocks
