"""Error reports of the calibrated cost model against the bundled measurements."""

from __future__ import annotations

import numpy as np
import pandas as pd

from simsched.cost.calibrated import CalibratedCostModel
from simsched.cost.calibration import (PROFILED_MODELS, fit_linear, load, mape, measured_linear,
                                       predict_linear)
from simsched.cost.hardware import GPUS, MODELS, REFERENCE_GPU


def linear_errors(max_tokens: int = 4096) -> pd.DataFrame:
    """Linear-op MAPE per profiled (model, TP) over 1..max_tokens: seen and leave-one-model-out.

    ``seen`` is the simulator's own linear term for a profiled model (the measured table,
    interpolated and made monotone) against every measured point; ``interp_holdout`` the same
    interpolation judged on every other point after dropping it; ``roofline_seen`` the roofline
    fitted on all models and ``loo`` the roofline fitted without the model.
    """
    gpu = GPUS[REFERENCE_GPU]
    full = fit_linear()
    rows = []
    for model in PROFILED_MODELS:
        loo = fit_linear(exclude=model)
        spec = MODELS[model]
        for tp in sorted(load("compute").query("model == @model").tp.unique()):
            n, meas, _ = measured_linear(model, tp)
            keep = n <= max_tokens
            n, meas = n[keep], meas[keep]
            # Interpolation error: predict every other point from its neighbours only.
            odd = np.arange(1, len(n) - 1, 2)
            interp = np.interp(n[odd], np.delete(n, odd), np.delete(meas, odd))
            table = CalibratedCostModel(spec, gpu, int(tp), model_name=model)._linear
            rows.append({"model": model, "tp": int(tp), "points": len(n),
                         "seen": mape(np.take(table, n) / spec.num_layers, meas),
                         "interp_holdout": mape(interp, meas[odd]),
                         "roofline_seen": mape(predict_linear(full, spec, tp, gpu, n), meas),
                         "loo": mape(predict_linear(loo, spec, tp, gpu, n), meas)})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- attention
