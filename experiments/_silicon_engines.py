"""The SGLang and TensorRT-LLM rows of ``experiments.validate_silicon``: recipes and settings.

:func:`register` adds an ``sglang`` and a ``trtllm`` :class:`~experiments.validate_silicon.Engine`
to ``validate_silicon.ENGINES`` (validate_silicon calls it on import), so

    python -m experiments.validate_silicon --engine sglang [--quick]
    python -m experiments.validate_silicon --engine trtllm [--quick]

rebuild those rows of ``hopper.csv`` as they were served. Each row runs simsched's engine of that
name (``scheduler.engine``: SGLang 0.5.9's or TensorRT-LLM 1.x's scheduler, :mod:`simsched.engine
.engines`) with its engine profile (``hardware.engine_overhead``: :mod:`simsched.cost.
engine_profiles`) and the server settings of the row's recipe (:func:`settings`), read from
InferenceX's per-recipe launch scripts where the row has one (``benchmarks/single_node/
fixed_seq_len/`` at commit 843c625):

* ``dsr1_fp8_h200.sh`` (SGLang, DeepSeek-R1 on the H200; taken for DeepSeek-V3 too, the same
  architecture, no script of its own): radix cache off, ``--max-running-requests`` 512 at 1k/1k
  (256 otherwise), ``--chunked-prefill-size`` and ``--max-prefill-tokens`` 32,768,
  ``--mem-fraction-static`` 0.82;
* ``dsr1_fp8_h200_trt.sh`` (TensorRT-LLM, DeepSeek-R1 / V3 on the H200): FP8 KV cache,
  ``free_gpu_memory_fraction`` 0.75, block reuse off, ``max_num_tokens`` = max(8,192,
  ISL + C + 64 rounded up to 64), attention DP and EP as the row's layout, with attention DP
  its ``attention_dp_config`` (``enable_balance``, ``timeout_iters`` 60,
  ``batching_wait_iters`` 0; the B200 script's too);
* ``deprecated/gptoss_fp4_h200_trt.sh`` (TensorRT-LLM, gpt-oss-120b on the H200):
  ``max_batch_size`` C, ``max_num_tokens`` 20,000, ``free_gpu_memory_fraction`` 0.85;
* on Blackwell (B200, B300; GB200 / GB300 take the B200's / B300's, said so): SGLang's
  ``dsr1_{fp4,fp8}_{b200,b300}.sh`` and TensorRT-LLM's ``dsr1_{fp4,fp8}_b200_trt.sh``,
  ``deprecated/gptoss_fp4_b200_trt.sh`` and ``deprecated/minimaxm2.5_fp4_{b200,b300}_trt.sh``
  (:func:`_blackwell` has each one's settings).

The other rows (InferenceX database rows without a published script) take the engine's
defaults (``SimConfig.preset('sglang' | 'trtllm')``: SGLang 0.5.9's ``ServerArgs`` on an 80-141
GiB GPU, TensorRT-LLM 1.x's ``LlmArgs``), and ``recipe`` says so; AIConfigurator's own runs take
its generator's limits on top of those defaults (:mod:`experiments._silicon_aic`).

Memory: SGLang's ``--mem-fraction-static`` is, like vLLM's ``gpu_memory_utilization``, a share of
the whole GPU for weights and KV cache (default: 0.85 assumed on 80-141 GiB GPUs, SGLang sizes it
from the GPU's memory); TensorRT-LLM's ``free_gpu_memory_fraction`` (default 0.9) is a share of
what is free *after* the weights are loaded, converted here to simsched's whole-GPU share
``w + f (1 - w)`` with ``w`` the weights' share of the GPU.

Refused, by name: rows on more GPUs than one NVLink domain (the worker as validate_silicon lays
it out, or ``moe_tp_size x moe_ep_size`` if more, above 8, or 72 on a GB200 / GB300 NVL72 rack:
serving across domains is not modelled); models without a
preset (Qwen3.5's hybrid linear attention, GLM-5) fall under ``validate_silicon``'s own reason.
"""

from __future__ import annotations

import functools

from simsched import SimConfig
from simsched.cost import shapes
from simsched.cost.engine_profiles import engine_of
from simsched.cost.hardware import GPUS as GPU_SPECS
from simsched.cost.hardware import MODELS
from experiments._silicon_layout import deployment_gpus, domain_gpus, size
from experiments._silicon_recipes import BLACKWELL, FIXED, script

# (Hugging Face id, precision) -> preset, beyond validate_silicon's: the bf16 Llama-3.1-8B
# (TensorRT-LLM on the H100), the same checkpoint quantised to FP8 on load (SGLang's
# ``--quantization fp8``: per-tensor FP8 weights, the FP8 preset's shapes and dtype), and
# gpt-oss-120b labelled ``fp8`` (TensorRT-LLM 1.3 on the H100: the MXFP4 checkpoint, the only one
# published, with FP8 activations).
MODEL_PRESETS = {
    ("meta-llama/Llama-3.1-8B-Instruct", "bf16"): "llama-3.1-8b",
    ("meta-llama/Llama-3.1-8B-Instruct", "fp8"): "llama-3.1-8b-fp8",
    ("openai/gpt-oss-120b", "fp8"): "gpt-oss-120b",
}
ENGINES = ("sglang", "trtllm")
# Engine defaults where no recipe is published (simsched.config.presets: the same values).
SGLANG_DEFAULT = dict(max_num_seqs=4096, max_num_batched_tokens=8192, mem=0.85,
                      kv_cache_dtype="auto", prefix=True, options={})
TRTLLM_DEFAULT = dict(max_num_seqs=2048, max_num_batched_tokens=8192, mem=0.9,
                      kv_cache_dtype="auto", prefix=True, options={})


def refuse(row) -> str:
    """Why an SGLang / TensorRT-LLM row cannot be simulated beyond validate_silicon's own
    reasons ('' when it can)."""
    gpus, domain = deployment_gpus(row), domain_gpus(row.gpu)
    if gpus > domain:
        return (f"multi-node deployment ({gpus} GPUs): serving across nodes is not "
                f"modelled (one {domain}-GPU NVLink domain)")
    return ""


def settings(row, engine: str) -> dict:
    """The launch settings of ``row``'s recipe for ``engine`` (``sglang`` or ``trtllm``):
    ``source``, ``max_num_seqs``, ``max_num_batched_tokens``, ``mem`` (the engine's own memory
    flag), ``kv_cache_dtype``, ``prefix`` (radix cache / block reuse), ``options``
    (``scheduler.engine_options``) and, for TensorRT-LLM, ``chunked``."""
    model, gpu, c = row.model, row.gpu, int(row.concurrency)
    isl, osl = int(row.isl), int(row.osl)
    deepseek = model in ("deepseek-r1", "deepseek-v3")
    if gpu in BLACKWELL and engine in ENGINES:
        found = _blackwell(row, engine)
        if found is not None:
            return found
    if engine == "sglang":
        if deepseek and gpu == "h200":
            # dsr1_fp8_h200.sh: --disable-radix-cache, --max-running-requests 512 (1k/1k) or
            # 256, --chunked-prefill-size / --max-prefill-tokens 32768, --mem-fraction-static
            # 0.82 (DeepSeek-V3: no script; R1's, the same architecture, assumed).
            source = FIXED + "dsr1_fp8_h200.sh" + (" (assumed for V3)" if model != "deepseek-r1"
                                                  else "")
            return dict(source=source, max_num_seqs=512 if (isl, osl) == (1024, 1024) else 256,
                        max_num_batched_tokens=32768, mem=0.82, kv_cache_dtype="auto",
                        prefix=False, options={"max_prefill_tokens": 32768})
        return dict(source="SGLang 0.5.9 defaults (no recipe published)", **SGLANG_DEFAULT)
    if engine != "trtllm":
        raise ValueError(f"engine must be one of {list(ENGINES)}, got {engine!r}")
    if deepseek and gpu == "h200":
        # dsr1_fp8_h200_trt.sh: FP8 KV, free_gpu_memory_fraction 0.75, enable_block_reuse
        # false, max_num_tokens max(8192, ceil((C + ISL + 64) / 64) x 64), no chunking.
        source = FIXED + "dsr1_fp8_h200_trt.sh" + (" (assumed for V3)" if model != "deepseek-r1"
                                                  else "")
        tokens = max(8192, (c + isl + 64 + 63) // 64 * 64)
        return dict(source=source, max_num_seqs=TRTLLM_DEFAULT["max_num_seqs"],
                    max_num_batched_tokens=tokens, mem=0.75, kv_cache_dtype="fp8",
                    prefix=False, options=_adp_balance(row), chunked=False)
    if model == "gpt-oss-120b" and gpu == "h200":
        # deprecated/gptoss_fp4_h200_trt.sh: max_batch_size C, max_num_tokens 20000,
        # free_gpu_memory_fraction 0.85, KV auto, block reuse default (on).
        return dict(source=FIXED + "deprecated/gptoss_fp4_h200_trt.sh", max_num_seqs=c,
                    max_num_batched_tokens=20000, mem=0.85, kv_cache_dtype="auto",
                    prefix=True, options={}, chunked=False)
    return dict(source="TensorRT-LLM 1.x defaults (no recipe published)", chunked=False,
                **TRTLLM_DEFAULT)


def _blackwell(row, engine: str) -> dict | None:
    """InferenceX's B200 / B300 scripts (None: no script for the row's model and engine)."""
    model, c, isl = row.model, int(row.concurrency), int(row.isl)
    gpu = BLACKWELL[row.gpu]
    fp4 = model.endswith("-nvfp4")
    adp = size(row.attention_dp_size) > 1
    tp = int(row.tp_size) if row.tp_size == row.tp_size else 8
    deepseek = model.startswith(("deepseek-r1", "deepseek-v3"))
    if engine == "sglang" and deepseek and fp4:
        # dsr1_fp4_{b200,b300}.sh: 256 running, 0.85, FP8 KV, chunks of 16,384 (32,768 with
        # attention DP on the B200), the radix cache forced to miss (B300: disabled).
        chunk = 32768 if adp and gpu == "b200" else 16384
        return dict(source=script(f"dsr1_fp4_{gpu}.sh", row.gpu, gpu), max_num_seqs=256,
                    max_num_batched_tokens=chunk, mem=0.85, kv_cache_dtype="fp8",
                    prefix=False, options={"max_prefill_tokens": 16384})
    if engine == "sglang" and deepseek:
        # dsr1_fp8_{b200,b300}.sh: TP 8: 128 running, 0.82, 32,768-token chunks and prefills;
        # TP 4: 32, 0.95, 8,192. FP8 KV, radix cache off.
        seqs, mem, chunk = (32, 0.95, 8192) if tp == 4 else (128, 0.82, 32768)
        return dict(source=script(f"dsr1_fp8_{gpu}.sh", row.gpu, gpu), max_num_seqs=seqs,
                    max_num_batched_tokens=chunk, mem=mem, kv_cache_dtype="fp8",
                    prefix=False, options={"max_prefill_tokens": chunk})
    if engine != "trtllm":
        return None
    if deepseek:
        # dsr1_{fp4,fp8}_b200_trt.sh: FP8 KV, free fraction 0.8 (FP8 at 8k/1k on TP 4: 0.75),
        # block reuse off, max_num_tokens max(8,192, ISL + C + 64 rounded up to 64).
        mem = 0.75 if not fp4 and tp == 4 and (isl, int(row.osl)) == (8192, 1024) else 0.8
        tokens = max(8192, (c + isl + 64 + 63) // 64 * 64)
        name = f"dsr1_{'fp4' if fp4 else 'fp8'}_b200_trt.sh"
        return dict(source=script(name, row.gpu, "b200"), chunked=False,
                    max_num_seqs=TRTLLM_DEFAULT["max_num_seqs"], max_num_batched_tokens=tokens,
                    mem=mem, kv_cache_dtype="fp8", prefix=False, options=_adp_balance(row))
    if model == "gpt-oss-120b":
        # gptoss_fp4_b200_trt.sh: max_batch_size 512, max_num_tokens 20,000, 0.85, FP8 KV.
        return dict(source=script("deprecated/gptoss_fp4_b200_trt.sh", row.gpu, "b200"),
                    chunked=False, max_num_seqs=512, max_num_batched_tokens=20000, mem=0.85,
                    kv_cache_dtype="fp8", prefix=False, options={})
    if model == "minimax-m2.5-nvfp4":
        # minimaxm2.5_fp4_{b200,b300}_trt.sh: max_num_tokens 16,384, 0.9, FP8 KV, no reuse.
        return dict(source=script(f"deprecated/minimaxm2.5_fp4_{gpu}_trt.sh", row.gpu, gpu),
                    chunked=False, max_num_seqs=TRTLLM_DEFAULT["max_num_seqs"],
                    max_num_batched_tokens=16384, mem=0.9, kv_cache_dtype="fp8", prefix=False,
                    options={})
    return None


def _adp_balance(row) -> dict:
    """The TensorRT-LLM DeepSeek scripts' ``attention_dp_config`` where the row runs attention
    DP (``enable_balance`` on, ``timeout_iters`` 60, ``batching_wait_iters`` 0), else nothing."""
    return {"attention_dp_enable_balance": True, "attention_dp_timeout_iters": 60,
            "attention_dp_batching_wait_iters": 0} if size(row.attention_dp_size) > 1 else {}


def memory_share(row, engine: str, mem: float, tp: int) -> float:
    """simsched's ``gpu_memory_utilization`` for the engine's memory flag ``mem``: SGLang's is
    already a whole-GPU share; TensorRT-LLM's is a share of the memory left after the weights."""
    if engine == "sglang":
        return mem
    spec, gpu = MODELS[row.model], GPU_SPECS[row.gpu]
    ranks = deployment_gpus(row)
    w = shapes.weight_bytes(spec, tp=tp, moe_ranks=ranks) / gpu.memory_bytes
    return min(0.99, w + mem * max(0.0, 1.0 - w))


def recipe(recipe_cls, engine: str, row):
    """``row``'s settings as validate_silicon's ``Recipe`` (the shared fields)."""
    s = settings(row, engine)
    isl, osl = int(row.isl), int(row.osl)
    return recipe_cls(s["source"], s["max_num_seqs"], s["max_num_batched_tokens"], s["mem"],
                      s["kv_cache_dtype"], s["prefix"], isl + osl + 256)


def configure(engine: str, cfg, row):
    """``cfg`` (validate_silicon's shared settings of ``row``) run by ``engine`` as its recipe
    sets it: the engine's scheduler and profile, its page size, its options, its memory flag
    converted, TensorRT-LLM's unchunked context."""
    s = settings(row, engine)
    tp = cfg.hardware.tensor_parallel_size
    # The profile the Engine names when it is one of this engine's (its preset's, or the
    # plain sglang beside sglang_silicon), else the engine's own.
    profile = cfg.hardware.engine_overhead
    changes = {"scheduler.engine": engine,
               "hardware.engine_overhead": profile if engine_of(profile) == engine else engine,
               "cache.block_size": 1 if engine == "sglang" else 32,
               "scheduler.engine_options": dict(s["options"]),
               "gpu_memory_utilization": memory_share(row, engine, s["mem"], tp)}
    if engine == "trtllm":
        changes["scheduler.enable_chunked_prefill"] = s["chunked"]
    return cfg.replace(**changes)


def register(engines: dict, engine_cls, recipe_cls, model_presets: dict) -> None:
    """Add the ``sglang`` and ``trtllm`` engines to validate_silicon's ``engines`` (built with its
    ``Engine`` and ``Recipe`` classes, passed in: validate_silicon may run as ``__main__``) and
    this module's model presets to ``model_presets``."""
    for key, preset in MODEL_PRESETS.items():
        model_presets.setdefault(key, preset)
    for name in ENGINES:
        # The engine's profile and all-reduce as its preset sets them (SGLang's profile carries
        # vLLM's silicon terms).
        hw = SimConfig.preset(name).hardware
        engines[name] = engine_cls(name, functools.partial(recipe, recipe_cls, name),
                                   engine_overhead=hw.engine_overhead, all_reduce=hw.all_reduce,
                                   configure=functools.partial(configure, name), refuse=refuse)
