"""Build the cost model a hardware config names (calibrated models cached per process)."""

from __future__ import annotations

import functools
from typing import Callable

from simsched.cost import deployment
from simsched.cost.base import LinearCostModel, UnitCostModel
from simsched.cost.calibrated import CalibratedCostModel
from simsched.cost.hardware import gpu_spec, model_spec
from simsched.cost.parallel import ParallelCostModel


@functools.lru_cache(maxsize=64)
def _cached_cost_model(spec, gpu, tp: int, model: str, engine_overhead: str):
    # Keyed by the (frozen) specs themselves, so a re-registered model never reuses a stale fit.
    return CalibratedCostModel(spec, gpu, tp, model_name=model, engine_overhead=engine_overhead)


@functools.lru_cache(maxsize=16)
def _cached_parallel_model(spec, gpu, tp: int, model: str, engine_overhead: str, parallel):
    return ParallelCostModel(spec, gpu, tp, parallel, model, engine_overhead=engine_overhead)


# Few: a fit, an ensemble or a silicon pass uses each term set for a handful of runs, and a
# long-context model's tables take ~100 MB.
@functools.lru_cache(maxsize=4)
def _cached_variant(spec, gpu, tp: int, model: str, engine_overhead: str, parallel,
                    keyword: str, terms: tuple):
    # keyword: "adjust" (deployment terms) or "engine_terms" (the engine profile's own terms).
    extra = {keyword: dict(terms)}
    if parallel is not None:
        return ParallelCostModel(spec, gpu, tp, parallel, model, engine_overhead=engine_overhead,
                                 **extra)
    return CalibratedCostModel(spec, gpu, tp, model_name=model, engine_overhead=engine_overhead,
                               **extra)


def _variant(hw, keyword: str, terms: dict):
    return _cached_variant(model_spec(hw), gpu_spec(hw), hw.tensor_parallel_size, hw.model,
                           hw.engine_overhead, getattr(hw, "parallel", None), keyword,
                           tuple(sorted(terms.items())))


def clear_caches() -> None:
    """Drop every cached cost model (a run over many long-context models frees their tables)."""
    for cached in (_cached_cost_model, _cached_parallel_model, _cached_variant):
        cached.cache_clear()


def adjusted_cost_model(hw, terms: dict):
    """The calibrated cost model of ``hw`` corrected by deployment ``terms``
    (:mod:`simsched.cost.deployment`), cached per term set."""
    return _variant(hw, "adjust", deployment.check_terms(terms))


def engine_terms_cost_model(hw, engine_terms: dict):
    """The calibrated cost model of ``hw`` with its engine profile's terms replaced by
    ``engine_terms`` (e.g. :func:`simsched.cost.vllm_silicon.terms`, the ``vllm_v1`` terms with
    the prefill and fused-MoE terms fitted on the silicon rows): pass it to ``simulate(cfg,
    cost_model=...)``. Cached per (model, GPU, layout, terms)."""
    return _variant(hw, "engine_terms", engine_terms)


def _calibrated(hw) -> CalibratedCostModel:
    spec = model_spec(hw)   # the config's own shape, or the catalog's
    if getattr(hw, "profile", None) is not None:    # a calibrated deployment profile
        prof = deployment.check_for(hw.profile, hw.gpu, hw.engine_overhead)
        return adjusted_cost_model(hw, prof.terms)
    if getattr(hw, "parallel", None) is not None:   # pipeline / data-parallel / expert layout
        return _cached_parallel_model(spec, gpu_spec(hw), hw.tensor_parallel_size, hw.model,
                                      hw.engine_overhead, hw.parallel)
    return _cached_cost_model(spec, gpu_spec(hw), hw.tensor_parallel_size, hw.model,
                              hw.engine_overhead)


# The cost models ``hardware.cost_model`` names (the config, the CLI and make_cost_model read
# this registry): name -> builder from a hardware config.
COST_MODELS: dict[str, Callable] = {
    "calibrated": _calibrated,
    "linear": lambda hw: LinearCostModel(),
    "unit": lambda hw: UnitCostModel(),
}


def make_cost_model(hw):
    """The cost model named by ``hw.cost_model`` (one of :data:`COST_MODELS`)."""
    try:
        build = COST_MODELS[hw.cost_model]
    except (KeyError, TypeError):
        raise ValueError(f"hardware.cost_model must be one of {sorted(COST_MODELS)}, "
                         f"got {hw.cost_model!r}") from None
    return build(hw)
