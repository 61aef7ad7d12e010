"""Fit the cost model's kernel terms to the bundled H200 operator profiles.

The measurements (``simsched/cost/data/h200/``, measured for this project with CUDA graphs: pure GPU
time) are per-layer operator times in milliseconds for four Llama shapes at TP 1/2/4/8. The fits
mirror the A100 ones (:mod:`simsched.cost.calibration`), one per operator family:

* linear ops: ``sum over GEMMs of roofline / efficiency(tokens) + 4 x gemm_const`` plus element-wise
  ops as ``const + bytes x per_byte``; ``gemm_const`` (a fixed time per GEMM: launch and tail
  latency, which dominates the small shards at few tokens) is chosen on a grid, the efficiencies
  are the median roofline / measured ratio per token count after taking it off;
* prefill attention (causal, one sequence of n tokens, ``hq`` query heads on the GPU):
  ``c0 + c_tok x n + c_tok_head x n x hq + FLOPs x s_flop`` with ``FLOPs = 2 n^2 d hq``: a launch
  cost, per-row and per-row-and-head costs (reading Q/K/V, writing O) and the causal FLOPs;
* decode attention: ``a0 + s_l2 x min(bytes, l2_bytes) + s_hbm x max(bytes - l2_bytes, 0)`` for the
  KV bytes read. The profile replays the same K/V tensors back to back, so reads up to about the
  L2 size come from cache; in serving every layer's KV is evicted by the weights streamed in
  between, so the simulator uses ``a0 + s_hbm x bytes`` (the ``l2`` part is a measurement
  artefact, fitted only so the HBM rate is not biased by it).

Rope is not in the profile; the simulator adds it through the element-wise fit. Everything
returns seconds; the fits are shipped as ``data/fits/h200.json`` (:mod:`simsched.cost.fits`).
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from simsched.cost import calibration as cal
from simsched.cost import linalg
from simsched.cost.hardware import GPUS, MODELS, ModelSpec

H200_DIR = cal.DATA_DIR / "h200"
GPU_NAME = "h200"
H200_MODELS = ("llama-2-7b", "llama-3-8b", "llama-2-13b", "llama-2-70b")
GEMM_CONST_GRID = np.arange(0.0, 5.01e-6, 0.25e-6)
L2_GRID = np.arange(10e6, 60.1e6, 5e6)
FAMILIES = ("linear", "prefill attention", "decode attention")


@functools.lru_cache(maxsize=None)
def load(name: str) -> pd.DataFrame:
    """A bundled H200 CSV (``linear``, ``attn_prefill``, ``attn_decode``, ``iteration``)."""
    path = H200_DIR / f"{name}.csv"
    if not path.is_file():
        raise ValueError(f"name: no bundled H200 data file {path.name!r} in {H200_DIR}")
    return pd.read_csv(path)


def heads(model: str, tp) -> tuple[np.ndarray, np.ndarray]:
    """(query heads, KV heads) per GPU of ``model`` at tensor-parallel degree ``tp``."""
    spec = MODELS[model]
    tp = np.asarray(tp)
    return spec.num_heads // tp, np.maximum(1, spec.num_kv_heads // tp)


def _with_heads(df: pd.DataFrame) -> pd.DataFrame:
    hq, hkv = zip(*(heads(m, int(t)) for m, t in zip(df.model, df.tp)))
    return df.assign(hq=np.array(hq, dtype=float), hkv=np.array(hkv, dtype=float))


def _fit_rel(design: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares on relative errors (small kernels count as much as big ones)."""
    return linalg.lstsq(design / y[:, None], np.ones_like(y))


# ----------------------------------------------------------------------------- linear ops


@functools.lru_cache(maxsize=None)
def compute_frame() -> pd.DataFrame:
    """The linear profile in the A100 table's columns (ms per layer; element-wise = act + 2 norms
    + 2 residual adds, no rope)."""
    d = load("linear")
    return pd.DataFrame({"model": d.model, "tp": d.tp, "num_tokens": d.num_tokens,
                         "qkv": d.attn_pre_proj, "out": d.attn_post_proj, "up": d.mlp_up_proj,
                         "down": d.mlp_down_proj,
                         "elementwise": d.mlp_act + 2 * d.input_layernorm + 2 * d["add"]})


def measured_linear(model: str, tp: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, measured per-layer linear seconds without rope) for a profiled model."""
    df = compute_frame()
    df = df[(df.model == model) & (df.tp == tp)].sort_values("num_tokens")
    per_layer = df[["qkv", "out", "up", "down", "elementwise"]].sum(axis=1).to_numpy() * 1e-3
    return df.num_tokens.to_numpy(), per_layer


def _linear_errors_for(coef: dict, frame: pd.DataFrame) -> np.ndarray:
    gpu = GPUS[GPU_NAME]
    errs = []
    for (model, tp), g in frame.groupby(["model", "tp"]):
        n = g.num_tokens.to_numpy()
        meas = g[["qkv", "out", "up", "down", "elementwise"]].sum(axis=1).to_numpy() * 1e-3
        pred = predict_linear(coef, MODELS[model], int(tp), gpu, n, rope=False)
        errs.append(np.abs(pred - meas) / meas)
    return np.concatenate(errs)


def fit_linear(exclude: str | None = None) -> dict:
    """Efficiency curve, element-wise coefficients and per-GEMM constant fitted on the H200 data."""
    frame = compute_frame()
    frame = frame[frame.model != exclude]
    best = None
    for g0 in GEMM_CONST_GRID:
        coef = cal.fit_linear(frame=frame, gpu_name=GPU_NAME, rope=False, gemm_const=float(g0))
        if min(coef["eff"]) <= 0:
            continue
        err = float(np.mean(_linear_errors_for(coef, frame)))
        if best is None or err < best[0]:
            best = (err, coef)
    return best[1]


def predict_linear(coef: dict, spec: ModelSpec, tp: int, gpu, tokens,
                   rope: bool | None = None) -> np.ndarray:
    """Per-layer linear seconds from the H200 fit (rope included unless ``rope=False``)."""
    out = cal.predict_linear({**coef, "gemm_const": 0.0}, spec, tp, gpu, tokens)
    if rope is False and spec.rope:
        bw_ratio = GPUS[coef["gpu"]].mem_bandwidth / gpu.mem_bandwidth
        n = np.maximum(np.asarray(tokens, dtype=float), 1.0)
        rope_bytes = cal.elementwise_bytes(spec, tp, n) - cal.elementwise_bytes(spec, tp, n, False)
        out = out - rope_bytes * coef["elt_per_byte"] * bw_ratio
    return out + 4 * coef.get("gemm_const", 0.0)


# ----------------------------------------------------------------------------- attention


def prefill_design(n, hq, head_dim: int = 128) -> np.ndarray:
    """Columns of the prefill-attention model: 1, n, n x hq, causal FLOPs."""
    n, hq = np.asarray(n, dtype=float), np.asarray(hq, dtype=float)
    return np.column_stack([np.ones_like(n), n, n * hq, 2.0 * n * n * head_dim * hq])


def fit_prefill_attention(exclude: str | None = None) -> dict:
    """``c0 + c_tok n + c_tok_head n hq + s_flop FLOPs`` (seconds) on the causal profile."""
    df = _with_heads(load("attn_prefill"))
    df = df[df.model != exclude]
    coef = _fit_rel(prefill_design(df.num_tokens, df.hq), df.prefill_attention_ms.to_numpy() * 1e-3)
    c0, c_tok, c_th, s_flop = (float(max(v, 0.0)) for v in coef)
    return {"c0": c0, "c_tok": c_tok, "c_tok_head": c_th, "s_flop": s_flop, "gpu": GPU_NAME}


def predict_prefill_attention(coef: dict, n, hq, head_dim: int = 128) -> np.ndarray:
    """Seconds of one layer's causal prefill attention of ``n`` tokens over ``hq`` query heads."""
    c = np.array([coef["c0"], coef["c_tok"], coef["c_tok_head"], coef["s_flop"]])
    return (prefill_design(n, hq, head_dim) * c).sum(axis=1)


def decode_bytes(batch, context, hkv, head_dim: int = 128, bytes_per_param: int = 2):
    """KV bytes one layer's decode attention reads: K and V of every cached token."""
    return np.asarray(batch, dtype=float) * np.asarray(context, dtype=float) \
        * np.asarray(hkv, dtype=float) * head_dim * 2 * bytes_per_param


def _decode_design(nbytes: np.ndarray, l2: float) -> np.ndarray:
    return np.column_stack([np.ones_like(nbytes), np.minimum(nbytes, l2),
                            np.maximum(nbytes - l2, 0.0)])


def fit_decode_attention(exclude: str | None = None) -> dict:
    """``a0 + s_l2 min(bytes, l2) + s_hbm max(bytes - l2, 0)``; ``l2_bytes`` chosen on a grid."""
    df = _with_heads(load("attn_decode"))
    df = df[df.model != exclude]
    nbytes = decode_bytes(df.batch, df.context, df.hkv)
    y = df.decode_attention_ms.to_numpy() * 1e-3
    best = None
    for l2 in L2_GRID:
        design = _decode_design(nbytes, float(l2))
        coef = _fit_rel(design, y)
        # Row sums of design x coef (not a BLAS product): the grid choice is the same everywhere.
        err = float(np.mean(np.abs((design * coef).sum(axis=1) - y) / y))
        if best is None or err < best[0]:
            best = (err, float(l2), coef)
    _, l2, (a0, s_l2, s_hbm) = best
    return {"a0": float(a0), "s_l2": float(max(s_l2, 0.0)), "s_hbm": float(s_hbm),
            "l2_bytes": l2, "gpu": GPU_NAME}


def predict_decode_attention(coef: dict, nbytes, l2: bool = True) -> np.ndarray:
    """Seconds of one layer's decode attention reading ``nbytes``; ``l2=False`` for serving."""
    nbytes = np.asarray(nbytes, dtype=float)
    if not l2:
        return coef["a0"] + coef["s_hbm"] * nbytes
    return (_decode_design(np.atleast_1d(nbytes), coef["l2_bytes"]) * np.array(
        [coef["a0"], coef["s_l2"], coef["s_hbm"]])).sum(axis=1)


# ----------------------------------------------------------------------------- together


@functools.lru_cache(maxsize=None)
def _fit_all_cached() -> dict:
    return {"linear": fit_linear(), "prefill_attention": fit_prefill_attention(),
            "decode_attention": fit_decode_attention()}


def fit_all() -> dict:
    """Every H200 coefficient (plain floats and lists), fitted once per process."""
    return _fit_all_cached()
