"""Error reports of the calibrated cost model against the bundled measurements: the A100 kernel
profiles (:func:`linear_errors`), the H200 operator profiles (:func:`h200_errors`) and the
real-serving runs (:func:`real_serving_errors`, :func:`leave_one_tp_out`)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from simsched.cost import calibration_h200 as h200
from simsched.cost import serving
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


# ----------------------------------------------------------------------------- real serving


def replay(model: CalibratedCostModel, prompt_size: int, batch_size: int,
           token_size: int) -> tuple[float, float]:
    """(prompt time, mean decode iteration) of one measured run replayed through ``model``,
    iteration by iteration as :func:`simsched.cost.serving.iterations` schedules it."""
    pre, dec, w = serving.iterations(prompt_size, batch_size, token_size)
    return (float(sum(model.iteration_time(b) for b in pre)),
            float(np.dot([model.iteration_time(b) for b in dec], w)))


def _legacy_gpu(name: str):
    """The GPU entry as simsched had it before the H200 and real-serving calibration: every
    GPU an extrapolation of the A100 fits (the power-capped H100 did not exist: plain H100)."""
    gpu = GPUS[name]
    return dataclasses.replace(gpu, kernels=REFERENCE_GPU, prefill_slowdown=1.0,
                               peak_flops=GPUS["h100-sxm"].peak_flops
                               if name == "h100-sxm-pcap" else gpu.peak_flops)


def real_serving_errors(engine_overhead: str = "eager_2023", legacy: bool = False,
                        terms: dict | None = None) -> pd.DataFrame:
    """Every measured run (mean over repetitions) against its replay through the cost model.

    ``legacy=True`` replays through the model as it was before this calibration (A100-fitted
    kernels everywhere, ``measured_2023`` overhead); ``terms`` overrides the fitted whole-iteration
    terms per system. Errors are signed percentages (positive: simulated too slow).
    """
    runs = serving.scenarios()
    models: dict = {}
    rows = []
    for r in runs.itertuples():
        key = (r.model, r.gpu, r.tp)
        if key not in models:
            gpu = _legacy_gpu(r.gpu) if legacy else GPUS[r.gpu]
            models[key] = CalibratedCostModel(
                MODELS[r.model], gpu, int(r.tp), model_name=r.model,
                engine_overhead="measured_2023" if legacy else engine_overhead,
                engine_terms=None if terms is None else terms[gpu.serving])
        prompt, token = replay(models[key], r.prompt_size, r.batch_size, r.token_size)
        rows.append({"model": r.model, "gpu": r.gpu, "tp": r.tp, "prompt_size": r.prompt_size,
                     "batch_size": r.batch_size, "token_size": r.token_size,
                     "prompt_measured": r.prompt_time, "prompt_simulated": prompt,
                     "token_measured": r.token_time, "token_simulated": token,
                     "prompt_error": (prompt / r.prompt_time - 1) * 100,
                     "token_error": (token / r.token_time - 1) * 100, "anomaly": r.anomaly})
    return pd.DataFrame(rows)


def group_mape(errs: pd.DataFrame) -> pd.DataFrame:
    """MAPE % of prefill and decode per (model, GPU, TP), anomalies left out."""
    ok = errs[~errs.anomaly]
    return ok.groupby(["model", "gpu", "tp"]).agg(
        runs=("prompt_error", "size"), prefill=("prompt_error", lambda e: e.abs().mean()),
        decode=("token_error", lambda e: e.abs().mean())).reset_index()


def leave_one_tp_out() -> pd.DataFrame:
    """Per measured system and TP degree: refit the whole-iteration terms without that TP's
    Llama-2-70B runs and report the held-out runs' prefill and decode MAPE %."""
    runs = serving.scenarios()
    rows = []
    for system, gpu in serving.FIT_GPUS.items():
        sel = runs[(runs.model == serving.FIT_MODEL) & (runs.gpu == gpu) & ~runs.anomaly]
        for tp in sorted(sel.tp.unique()):
            terms = serving.fit_terms(sel[sel.tp != tp])
            held = sel[sel.tp == tp]
            prompt, token = serving.Features(held).predict(terms)
            rows.append({"system": system, "gpu": gpu, "held_out_tp": int(tp),
                         "prefill": mape(prompt, held.prompt_time),
                         "decode": mape(token, held.token_time)})
    return pd.DataFrame(rows)
