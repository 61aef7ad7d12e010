"""Prefill and fused-MoE terms of a vLLM deployment, fitted on AIConfigurator's silicon rows.

The ``vllm_v1`` profile (:mod:`simsched.cost.vllm_v1`) was fitted on dense vLLM 0.15
runs with short prompts. On the silicon rows (vLLM 0.12-0.18 on H100/H200, prompts of 1k-8k
tokens, MoE and FP8 models: ``experiments.validate_silicon``) one prefill takes longer than the
kernel tables' sum, and MoE layers longer than the dense GEMM model of their experts. Five named
terms say by how much, each per kernel class, layer or step, never per model:

* ``prefill_gemm_scale`` (x): the GEMM time (the linear table: projections, MLPs, experts,
  their element-wise work) of a step that prefills, against the kernel tables. A long
  compute-bound step runs at the power-limited clock: on an H200 a Llama-3.1-70B layer's FP8
  GEMMs back to back for a whole 7,424-token prefill take 1.14x their one-by-one time (bf16:
  1.15x; SM clock 1,365-1,440 MHz at 690 W; ``benchmarks/device/h200_prefill_sustained.py``);
  the fit also absorbs what else a prefill step does that the tables do not time.
* ``prefill_expert_scale`` (x): the routed experts' time (their GEMMs, or the measured fused
  layer where a table has it) in a step that prefills, against the dense GEMM model, on top of
  ``prefill_gemm_scale``: vLLM's fused-MoE kernels (Triton, Marlin for 4-bit experts) reach
  less of the GPU than a dense GEMM of the same rows when there are many (decode steps, whose
  experts are bound by their weight reads, keep the tables' time).
* ``prefill_layer_time`` (s per layer): host work per layer of a step that prefills: vLLM
  captures CUDA graphs only up to its capture sizes, so a prefill step launches its layers'
  kernels one by one (piecewise). On the H200 an eagerly launched layer of a Llama-3-8B shape
  costs 36-105 us of wall time beyond its CUDA graph at 256-2,048 tokens (same script): a few
  ms for a whole step, under the rows' scatter, so the fit holds it at 0.
* ``large_allreduce_scale`` (x): the tensor-parallel all-reduces above vLLM's custom
  all-reduce limit (8 MiB: a prefill's), against the kernel tables' NCCL (the A100 NCCL profile
  scaled by link bandwidth; AIConfigurator's measured NCCL on its own profiles). vLLM on Hopper
  may take other paths for them (symmetric-memory all-reduce over NVLink SHARP).
* ``decode_expert_scale`` (x): the routed experts' time in a step that only decodes, against
  the dense GEMM model (a step that prefills takes ``prefill_gemm_scale x
  prefill_expert_scale`` instead): the fused-MoE kernels' fixed work per expert and layer
  (routing, the token alignment, two grouped GEMMs and their launch tails) that a GEMM of the
  same rows does not have.

The expert terms apply to fine-grained experts only (:func:`fine_grained_experts`: no wider
than the model, as every MoE model of the silicon rows); coarse ones (Mixtral, Llama-4-Scout)
keep the tables' time. With the scales 1 and ``prefill_layer_time = 0`` (:data:`NEUTRAL`)
the model is the ``vllm_v1`` profile, bit for bit; that profile keeps them so. The fitted
values (``data/vllm_silicon_terms.json``, refitted by ``python -m
experiments.fit_silicon_terms``, which also reports leave-one-group-out errors) are the default
profile's, ``vllm_silicon`` (on the calibrated kernel tables they were fitted against; on
AIConfigurator's measured tables it leaves them out: :mod:`simsched.cost.calibrated`), and any
terms can be passed as ``engine_terms``
(:func:`simsched.cost.factory.engine_terms_cost_model` builds the cost model).
"""

from __future__ import annotations

import functools
import json
import math

import numpy as np

from simsched.cost import calibration as cal
from simsched.cost import host_time, vllm_v1

TERMS = ("prefill_gemm_scale", "prefill_expert_scale", "prefill_layer_time",
         "large_allreduce_scale", "decode_expert_scale")
NEUTRAL = {"prefill_gemm_scale": 1.0, "prefill_expert_scale": 1.0, "prefill_layer_time": 0.0,
           "large_allreduce_scale": 1.0, "decode_expert_scale": 1.0}
UNITS = {"prefill_gemm_scale": ("x", 1.0), "prefill_expert_scale": ("x", 1.0),
         "prefill_layer_time": ("us per layer and prefill step", 1e6),
         "large_allreduce_scale": ("x", 1.0), "decode_expert_scale": ("x", 1.0)}
DATA = cal.DATA_DIR / "vllm_silicon_terms.json"


def check(terms: dict, where: str = "engine_terms") -> dict:
    """The four terms of ``terms`` (absent: neutral), checked: scales > 0, the layer time
    >= 0, all finite; an error names ``where`` and the term."""
    out = {}
    for name in TERMS:
        value = terms.get(name, NEUTRAL[name])
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise ValueError(f"{where}.{name} must be a finite number, got {value!r}")
        if (name.endswith("scale") and value <= 0) or value < 0:
            raise ValueError(f"{where}.{name} must be {'> 0' if name.endswith('scale') else '>= 0'}"
                             f", got {value!r}")
        out[name] = float(value)
    return out


@functools.lru_cache(maxsize=None)
def shipped() -> dict:
    """The shipped record (``terms``, how they were fitted and the figures of that fit)."""
    try:
        record = json.loads(DATA.read_text())
    except FileNotFoundError:
        raise ValueError(f"{DATA}: the fitted silicon terms are missing; run `python -m "
                         f"experiments.fit_silicon_terms --update`") from None
    check(record.get("terms", {}), str(DATA))
    return record


def fitted() -> dict:
    """The five fitted silicon terms alone (scales as factors, the layer time in seconds)."""
    return check(shipped()["terms"], str(DATA))


def terms() -> dict:
    """The ``vllm_v1`` terms with the fitted silicon terms added (seconds; scales as factors):
    pass as ``engine_terms`` to a calibrated cost model
    (:func:`simsched.cost.factory.engine_terms_cost_model`)."""
    return {**vllm_v1.terms(), **fitted()}


def fine_grained_experts(k) -> np.ndarray | None:
    """The routed experts' part of ``k.linear`` where the expert terms apply: fine-grained
    experts, no wider than the model (``expert_intermediate_size <= hidden_size``: every MoE
    model of the silicon rows, 1,536-2,880 columns), else None. Coarse experts (Mixtral,
    Llama-4-Scout's 8,192 columns) keep the tables' time: on the real Llama-4-Scout FP8 runs
    the terms fitted on fine-grained experts made E2E 8 -> 56 % off
    (``experiments.fit_silicon_terms --check-vllm015``)."""
    experts = getattr(k, "moe_experts", None)
    if experts is None or k.spec.expert_intermediate_size > k.spec.hidden_size:
        return None
    return experts


def prefill_extra(k, terms: dict) -> np.ndarray | None:
    """The seconds a step that prefills adds, by token count, for kernel tables ``k`` under
    ``terms``; None for neutral terms, so the model stays the shipped one bit for bit."""
    t = check(terms)
    linear = k.linear
    experts = fine_grained_experts(k)
    decode_scale = t["decode_expert_scale"] if experts is not None else 1.0
    if t["prefill_gemm_scale"] == 1.0 and t["prefill_layer_time"] == 0.0 \
            and t["prefill_expert_scale"] == 1.0 and decode_scale == 1.0:
        return None
    extra = (t["prefill_gemm_scale"] - 1.0) * linear \
        + k.spec.num_layers * t["prefill_layer_time"]
    if experts is not None:
        # On top of the linear table as scale_experts gives it: a prefill step's experts take
        # prefill_gemm_scale x prefill_expert_scale x the tables, whatever decode_expert_scale.
        extra = extra + (t["prefill_gemm_scale"] * (t["prefill_expert_scale"] - 1.0)
                         - (decode_scale - 1.0)) * experts
    extra[0] = 0.0
    return extra


def scale_experts(k, terms: dict) -> np.ndarray:
    """The linear table of kernel tables ``k`` with the routed experts' part scaled by
    ``decode_expert_scale`` (what a step that only decodes takes; a prefill step's experts are
    :func:`prefill_extra`'s). Neutral, or a model without routed experts: ``k.linear`` itself."""
    scale = check(terms)["decode_expert_scale"]
    experts = fine_grained_experts(k)
    if scale == 1.0 or experts is None:
        return k.linear
    return k.linear + (scale - 1.0) * experts


def scale_comm(k, comm: np.ndarray, terms: dict) -> np.ndarray:
    """The all-reduce table ``comm`` of kernel tables ``k`` with the calls above the custom
    all-reduce limit scaled by ``large_allreduce_scale`` (neutral: ``comm`` itself)."""
    scale = check(terms)["large_allreduce_scale"]
    if scale == 1.0:
        return comm
    n = np.arange(len(comm), dtype=float)
    large = n * k.spec.hidden_size * k.spec.bytes_per_param >= vllm_v1.CUSTOM_AR_MAX_BYTES
    # More tokens never cost less: a faster large call is never below the custom one before it.
    return np.maximum.accumulate(np.where(large, comm * scale, comm))


def neutral() -> dict:
    """The ``vllm_v1`` terms with neutral silicon terms: the ``vllm_v1`` profile, bit for bit."""
    return {**vllm_v1.terms(), **NEUTRAL}


def parse(text: str) -> dict | None:
    """Engine terms from text (a command line's ``--terms``): None for ``shipped`` (the
    profile's own), :func:`terms` for ``fitted``, :func:`neutral` for ``neutral``, else
    comma-separated ``NAME=VALUE`` pairs set on the ``vllm_v1`` terms (neutral silicon terms),
    or on ``fitted`` or ``neutral`` named first (``fitted,sync_step_time=0.0005``: the host-time
    terms of :mod:`simsched.cost.host_time` are known too); a bad pair raises ValueError naming
    it."""
    if text == "shipped":
        return None
    parts = [p.strip() for p in text.split(",")]
    if parts[0] in ("fitted", "neutral"):
        out = terms() if parts.pop(0) == "fitted" else neutral()
    else:
        out = neutral()
    known = {**out, **host_time.NEUTRAL}
    for pair in parts:
        name, _, value = pair.partition("=")
        if name.strip() not in known:
            raise ValueError(f"unknown term {name.strip()!r}; known: {sorted(known)}")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"{pair!r} is not NAME=NUMBER") from None
    check(out, "--terms")
    host_time.check(out, "--terms")
    return out
