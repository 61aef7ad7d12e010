"""Error reports of the calibrated cost model against the bundled measurements."""

from __future__ import annotations

import numpy as np
import pandas as pd

from simsched.cost import calibration_h200 as h200
from simsched.cost.calibrated import CalibratedCostModel
from simsched.cost.calibration import (ATTN_REF_QDIM, PROFILED_MODELS, elementwise_bytes, fit_all,
                                       fit_linear, load, mape, measured_linear, predict_linear,
                                       predict_prefill_attention)
from simsched.cost.hardware import GPUS, MODELS, REFERENCE_GPU


def signed_error(pred, meas) -> float:
    """Mean signed percentage error (positive: predicted too slow), in percent."""
    pred, meas = np.asarray(pred, dtype=float), np.asarray(meas, dtype=float)
    return float(np.mean((pred - meas) / meas) * 100.0)


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


def _a100_extrapolated_attention(spec, tp: int, gpu, n=None, batch=None, context=None):
    """Per-layer attention as simsched timed the H200 before it was measured: the A100 (70B-shape,
    TP2) fits scaled by query width and peak FLOP/s (prefill) or KV bytes and bandwidth (decode)."""
    coef = fit_all()
    ref = GPUS[REFERENCE_GPU]
    if n is not None:
        q_scale = spec.num_heads // tp * spec.head_dim / ATTN_REF_QDIM \
            * ref.peak_flops / gpu.peak_flops
        return predict_prefill_attention(coef["prefill_attention"], n, 0.0) * q_scale
    dc = coef["decode_attention"]
    batch, context = np.asarray(batch, dtype=float), np.asarray(context, dtype=float)
    kv_layer = 2 * max(1, spec.num_kv_heads // tp) * spec.head_dim * spec.bytes_per_param
    nbytes = batch * context * kv_layer * ref.mem_bandwidth / gpu.mem_bandwidth
    a = np.where(batch > dc["batches"][-1], dc["a0"] + dc["a1"] * batch,
                 np.interp(batch, dc["batches"], dc["a"]))
    s = np.interp(batch, dc["batches"], dc["s"])
    return np.maximum(a + s * nbytes, dc["sat_a"] + dc["sat_s"] * nbytes)


def _row(family, subset, meas, before, seen, loo, **extra) -> dict:
    return {"family": family, "subset": subset, "points": len(meas),
            "before": mape(before, meas), "before_signed": signed_error(before, meas),
            "fit": mape(seen, meas), "loo": mape(loo, meas), **extra}


def h200_errors() -> pd.DataFrame:
    """Per operator family and (model, TP): MAPE % of the H200 fits on the bundled H200 profile.

    ``before`` is the A100 extrapolation simsched used for the H200 before it was measured (and its
    mean signed error); ``fit`` the H200 fit on all four models; ``loo`` the fit without the model
    (leave-one-model-out); for linear ops ``table`` is the simulator's own term for a profiled model
    (the measured table, interpolated and made monotone), judged on every other point after
    dropping it.
    """
    gpu = GPUS[h200.GPU_NAME]
    a100_lin, full = fit_all()["linear"], h200.fit_all()
    rows = []
    frame = h200.compute_frame()
    for model in h200.H200_MODELS:
        spec = MODELS[model]
        loo_lin = h200.fit_linear(exclude=model)
        loo_pre = h200.fit_prefill_attention(exclude=model)
        loo_dec = h200.fit_decode_attention(exclude=model)
        for tp in sorted(frame.query("model == @model").tp.unique()):
            tp = int(tp)
            n, meas = h200.measured_linear(model, tp)
            no_rope = elementwise_bytes(spec, tp, n) - elementwise_bytes(spec, tp, n, False)
            before = predict_linear(a100_lin, spec, tp, gpu, n) \
                - no_rope * a100_lin["elt_per_byte"] * GPUS[REFERENCE_GPU].mem_bandwidth \
                / gpu.mem_bandwidth
            odd = np.arange(1, len(n) - 1, 2)
            table = np.interp(n[odd], np.delete(n, odd), np.delete(meas, odd))
            rows.append(_row("linear", f"{model} tp{tp}", meas, before,
                             h200.predict_linear(full["linear"], spec, tp, gpu, n, rope=False),
                             h200.predict_linear(loo_lin, spec, tp, gpu, n, rope=False),
                             table=mape(table, meas[odd])))
            hq, hkv = h200.heads(model, tp)
            pre = h200.load("attn_prefill").query("model == @model and tp == @tp")
            if len(pre):
                meas = pre.prefill_attention_ms.to_numpy() * 1e-3
                rows.append(_row(
                    "prefill attention", f"{model} tp{tp}", meas,
                    _a100_extrapolated_attention(spec, tp, gpu, n=pre.num_tokens),
                    h200.predict_prefill_attention(full["prefill_attention"], pre.num_tokens, hq),
                    h200.predict_prefill_attention(loo_pre, pre.num_tokens, hq)))
            dec = h200.load("attn_decode").query("model == @model and tp == @tp")
            if len(dec):
                meas = dec.decode_attention_ms.to_numpy() * 1e-3
                nbytes = h200.decode_bytes(dec.batch, dec.context, hkv)
                rows.append(_row(
                    "decode attention", f"{model} tp{tp}", meas,
                    _a100_extrapolated_attention(spec, tp, gpu, batch=dec.batch,
                                                 context=dec.context),
                    h200.predict_decode_attention(full["decode_attention"], nbytes),
                    h200.predict_decode_attention(loo_dec, nbytes)))
    return pd.DataFrame(rows)


def family_summary(errs: pd.DataFrame) -> pd.DataFrame:
    """Point-weighted MAPE per family (before, fit, leave-one-model-out) from :func:`h200_errors`."""
    w = errs.points

    def avg(col):
        return (errs[col] * w).groupby(errs.family).sum() / w.groupby(errs.family).sum()

    out = pd.DataFrame({c: avg(c) for c in ("before", "before_signed", "fit", "loo")})
    out["loo_worst_model"] = errs.assign(model=errs.subset.str.split(" ").str[0]) \
        .assign(wl=errs.loo * w).groupby(["family", "model"]) \
        .apply(lambda g: g.wl.sum() / g.points.sum(), include_groups=False) \
        .groupby(level=0).max()
    return out.reindex(list(h200.FAMILIES))
