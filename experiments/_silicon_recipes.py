"""vLLM's launch settings per silicon row: InferenceX's per-recipe scripts, else vLLM's defaults.

``experiments.validate_silicon`` reads them (it re-exports :class:`Recipe` and
:func:`vllm_recipe`). The scripts are InferenceX's ``benchmarks/single_node/fixed_seq_len/``
(``deprecated/`` where the vLLM ones now live) at commit 843c625:

| script | max sequences | batched tokens | memory | KV | prefix cache | max model len |
|---|---|---|---|---|---|---|
| ``gptoss_fp4_h100.sh`` / ``_h200.sh`` | C | 8,192 | 0.9 | auto | off | 10,240; H200: ISL+OSL+20 (1k/1k), +256 (8k) |
| ``gptoss_fp4_b200.sh`` (B300, GB200, GB300: assumed) | 512 | 8,192 | 0.9 | fp8 | off | ISL+OSL+20 (1k/1k), +256 (8k), else 10,240 |
| ``kimik2.5_int4_h200.sh`` / ``_b200.sh`` / ``_b300.sh`` | C | default | 0.95 | auto | off | the workflow's |
| ``kimik2.5_fp4_b200.sh`` / ``_b300.sh`` | C | default | 0.9 (0.8 with attention DP) | fp8 | off | the workflow's |
| ``minimaxm2.5_fp8_h200.sh`` | 512 | 32,768 | 0.95 | fp8 | off | the workflow's |
| ``minimaxm2.5_fp8_h100.sh`` | default | default | 0.9 | auto | default (on) | default |
| ``minimaxm2.5_fp8_b200.sh`` / ``_fp4_`` / ``_b300.sh`` | default | 2 x ISL | 0.9 | fp8 | off | the workflow's |

The workflow's max model length is not in the scripts: ISL + OSL + 256 is assumed. A GB200 or
GB300 row takes the B200's or B300's script (the same chips; NVL72 single-node scripts are not
published), and ``source`` says so. Rows without a script take vLLM's defaults on a >= 70 GiB
GPU behind its OpenAI server: 1,024 sequences, 8,192 batched tokens, 0.9 of the memory, prefix
caching on.
"""

from __future__ import annotations

import dataclasses

from experiments import _silicon_aic as silicon_aic


@dataclasses.dataclass(frozen=True)
class Recipe:
    """An engine's server settings for one row (None: the engine's default)."""

    source: str
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    max_model_len: int | None = None


VLLM_DEFAULT = dict(max_num_seqs=1024, max_num_batched_tokens=8192, gpu_memory_utilization=0.9)
FIXED = "InferenceX benchmarks/single_node/fixed_seq_len/"
_IX = FIXED + "deprecated/"
HOPPER = ("h100-sxm", "h200")
# A Blackwell GPU -> the GPU whose scripts it runs (GB200 / GB300: the B200's / B300's,
# assumed); experiments._silicon_engines reads it too.
BLACKWELL = {"b200": "b200", "b300": "b300", "gb200": "b200", "gb300": "b300"}


def script(path: str, gpu: str, script_gpu: str) -> str:
    """A recipe's ``source``: InferenceX's script ``path`` (under ``fixed_seq_len/``), written
    for ``script_gpu`` and run for ``gpu`` (said "assumed" where the two differ)."""
    return FIXED + path + ("" if gpu == script_gpu else f" (assumed for {gpu})")


def _gpt_oss_max_model_len(isl: int, osl: int) -> int:
    if (isl, osl) == (1024, 1024):
        return isl + osl + 20
    if 8192 in (isl, osl):
        return isl + osl + 256
    return 10240


def _blackwell(row, script_gpu: str) -> Recipe | None:
    model, gpu, c = row.model, row.gpu, int(row.concurrency)
    isl, osl = int(row.isl), int(row.osl)
    workflow = isl + osl + 256

    def source(name: str, written_for: str = script_gpu) -> str:     # the vLLM scripts' folder
        return script("deprecated/" + name, gpu, written_for)

    if model == "gpt-oss-120b":
        # gptoss_fp4_b200.sh: 512 sequences, 8,192 batched tokens, 0.9, FP8 KV, no prefix.
        return Recipe(source("gptoss_fp4_b200.sh", "b200"), 512, 8192, 0.9, "fp8", False,
                      max(_gpt_oss_max_model_len(isl, osl), isl + osl))
    if model == "kimi-k2.5":
        return Recipe(source(f"kimik2.5_int4_{script_gpu}.sh"), c, 8192, 0.95, "auto", False,
                      workflow)
    if model == "kimi-k2.5-nvfp4":
        # kimik2.5_fp4_b200.sh: 0.9, or 0.8 with data-parallel attention; FP8 KV.
        adp = row.attention_dp_size
        mem = 0.8 if adp == adp and adp > 1 else 0.9
        return Recipe(source(f"kimik2.5_fp4_{script_gpu}.sh"), c, 8192, mem, "fp8", False,
                      workflow)
    if model in ("minimax-m2.5", "minimax-m2.5-nvfp4"):
        # minimaxm2.5_{fp8,fp4}_b200.sh: 0.9, FP8 KV, 2 x ISL batched tokens, no prefix.
        kind = "fp8" if model == "minimax-m2.5" else "fp4"
        return Recipe(source(f"minimaxm2.5_{kind}_{script_gpu}.sh"),
                      VLLM_DEFAULT["max_num_seqs"], 2 * isl, 0.9, "fp8", False, workflow)
    return None


def vllm_recipe(row) -> Recipe:
    """The vLLM launch settings of ``row``'s recipe (the module docstring's table)."""
    model, gpu, c = row.model, row.gpu, int(row.concurrency)
    isl, osl = int(row.isl), int(row.osl)
    if gpu in BLACKWELL:
        recipe = _blackwell(row, BLACKWELL[gpu])
        if recipe is not None:
            return recipe
    elif model == "gpt-oss-120b" and gpu in HOPPER:
        # gptoss_fp4_h100.sh / _h200.sh: max-num-seqs = C, 8,192 batched tokens, 0.9, no
        # prefix caching; max-model-len 10,240 (H200: ISL + OSL + 20 at 1k/1k, + 256 at 8k).
        mml = _gpt_oss_max_model_len(isl, osl) if gpu == "h200" else 10240
        return Recipe(_IX + f"gptoss_fp4_{gpu[:4]}.sh", c, 8192, 0.9, "auto", False,
                      max(mml, isl + osl))
    elif model == "kimi-k2.5" and gpu in HOPPER:
        # kimik2.5_int4_h200.sh: 0.95, max-num-seqs = C, no prefix caching, the workflow's
        # max-model-len (not in the script: ISL + OSL + 256 assumed), batched tokens default.
        return Recipe(_IX + "kimik2.5_int4_h200.sh", c, 8192, 0.95, "auto", False,
                      isl + osl + 256)
    elif model == "minimax-m2.5" and gpu == "h200":
        # minimaxm2.5_fp8_h200.sh: 0.95, 512 sequences, 32,768 batched tokens, FP8 KV, no
        # prefix caching, the workflow's max-model-len (ISL + OSL + 256 assumed).
        return Recipe(_IX + "minimaxm2.5_fp8_h200.sh", 512, 32768, 0.95, "fp8", False,
                      isl + osl + 256)
    elif model == "minimax-m2.5" and gpu == "h100-sxm":
        # minimaxm2.5_fp8_h100.sh: 0.9, everything else vLLM's default.
        return Recipe(_IX + "minimaxm2.5_fp8_h100.sh", **VLLM_DEFAULT,
                      max_model_len=isl + osl + 256)
    # Llama-3.1 (InferenceX database dumps without their script) and AIConfigurator's own
    # Qwen3 / Llama-3.1-8B runs: no recipe published; vLLM's defaults.
    return Recipe("vLLM defaults (no recipe published)", **VLLM_DEFAULT,
                  max_model_len=isl + osl + 256)


# vLLM made async scheduling its default after 0.12 (PR #27614, merged in December 2025).
LAST_SYNC_VERSION = (0, 12)
SYNC_MEASURED_BEFORE = "2026-01-01"


def vllm_async_default(row) -> bool:
    """Whether the vLLM version that measured ``row`` schedules asynchronously by default: after
    0.12; a row without a version (InferenceX's Llama-3.1-70B and some gpt-oss-120b runs) is
    taken as a release of its measurement date, up to 0.12 if measured in 2025."""
    version = getattr(row, "backend_version", None)
    if isinstance(version, str) and version:
        return silicon_aic.version_tuple(version)[:2] > LAST_SYNC_VERSION
    source = str(getattr(row, "silicon_data_source", ""))
    measured = source.partition("measured=")[2][:10]
    return not (measured and measured < SYNC_MEASURED_BEFORE)
