"""Build the cost model a hardware config names (calibrated models cached per process)."""

from __future__ import annotations

import functools

from simsched.cost.base import LinearCostModel, UnitCostModel
from simsched.cost.calibrated import CalibratedCostModel
from simsched.cost.hardware import GPUS, model_spec


@functools.lru_cache(maxsize=64)
def _cached_cost_model(spec, gpu, tp: int, model: str, engine_overhead: str):
    # Keyed by the (frozen) specs themselves, so a re-registered model never reuses a stale fit.
    return CalibratedCostModel(spec, gpu, tp, model_name=model, engine_overhead=engine_overhead)


def make_cost_model(hw):
    """The cost model named by ``hw.cost_model``: calibrated, linear or unit."""
    if hw.cost_model == "unit":
        return UnitCostModel()
    if hw.cost_model == "linear":
        return LinearCostModel()
    if hw.cost_model != "calibrated":
        raise ValueError(f"hardware.cost_model must be one of ['calibrated', 'linear', 'unit'], "
                         f"got {hw.cost_model!r}")
    spec = model_spec(hw)   # the config's own shape, or the catalog's
    return _cached_cost_model(spec, GPUS[hw.gpu], hw.tensor_parallel_size, hw.model,
                              hw.engine_overhead)
