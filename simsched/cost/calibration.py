"""Fit the cost model's parts to the bundled A100 profiles and measure how well they fit.

The measurements (``simsched/cost/data/``, reduced from the Vidur project's A100 profiles, MIT
licence) are per-layer kernel times in milliseconds; we use their *median* columns because a few
repetitions carry clock-ramp or contention outliers that pull the mean up, and the simulator wants
the typical iteration. Everything here returns seconds.

Fits (run by maintainers: :func:`fit_all` is what ``python -m experiments.calibrate --update``
ships as ``data/fits/a100-80gb.json``, :mod:`simsched.cost.fits`; runs read that file, and
``tests/test_fits.py`` checks it against a refit):

* linear ops of an unprofiled model: a per-op roofline ``max(FLOPs / peak, bytes / bandwidth)``
  divided by an efficiency that varies with the token count (median over the profiled models),
  plus element-wise ops (norms, activation, rope, residual adds) as ``const + bytes / bw_eff``;
* prefill attention: per chunk size, the causal time with no cache plus a slope per
  chunk-token x cached-token, on the 70B-shaped (64 q / 8 kv heads, TP2) attention profile;
* decode attention: ``a0 + a1 x batch + s(batch) x KV bytes read``, with a bandwidth floor;
* all-reduce: measured medians binned on log message size, plus an alpha-beta fit for scaling;
* CPU overhead: ``a + a_tp [tp > 1] + b x batch size`` over all profiled models.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pandas as pd

from simsched.cost import linalg
from simsched.cost.hardware import GPUS, MODELS, REFERENCE_GPU, GPUSpec, ModelSpec

DATA_DIR = Path(__file__).resolve().parent / "data"
PROFILED_MODELS = ("llama-2-7b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "phi-2")
# The attention profile's shape per GPU: 64 q heads / TP2 = 32 heads x 128 channels; 8 kv heads /
# TP2 = 4 kv heads x 128 x (K and V) x 2 bytes per token.
ATTN_REF_QDIM = 32 * 128
ATTN_REF_KV_BYTES = 2 * 4 * 128 * 2
# CPU-side per-iteration steps of vLLM that do not overlap the GPU work (Vidur's breakdown).
# ray_comm_time is left out: at TP > 1 it is a flat ~6 ms of Ray RPC in that vLLM version, which
# later versions removed, and it would swamp the tensor-parallel speed-up.
CPU_STEPS = ("schedule_median", "sampler_e2e_median", "prepare_inputs_e2e_median",
             "process_model_outputs_median")


@functools.lru_cache(maxsize=None)
def load(name: str) -> pd.DataFrame:
    """A bundled CSV (``compute``, ``attention_prefill``, ``attention_decode``, ``all_reduce``,
    ``cpu_overheads`` or ``profiled_shapes``) as a DataFrame."""
    path = DATA_DIR / f"{name}.csv"
    if not path.is_file():
        raise ValueError(f"name: no bundled data file {path.name!r} in {DATA_DIR}")
    return pd.read_csv(path)


# ----------------------------------------------------------------------------- linear ops


def gemm_shapes(spec: ModelSpec, tp: int) -> list[tuple[int, int]]:
    """(K, N) of each layer's four GEMMs on one GPU: QKV, output, MLP up(+gate), MLP down."""
    d, kv = spec.head_dim, max(1, spec.num_kv_heads // tp)
    up = spec.intermediate_size * (2 if spec.gated_mlp else 1) // tp
    return [(spec.hidden_size, (spec.num_heads // tp + 2 * kv) * d),
            (spec.num_heads // tp * d, spec.hidden_size),
            (spec.hidden_size, up),
            (spec.intermediate_size // tp, spec.hidden_size)]


def gemm_roofline(spec: ModelSpec, tp: int, gpu: GPUSpec, tokens: np.ndarray) -> np.ndarray:
    """Seconds per layer of the GEMMs at 100 % of peak: sum over ops of max(compute, memory)."""
    n = np.asarray(tokens, dtype=float)
    b = spec.bytes_per_param
    total = np.zeros_like(n)
    for k, m in gemm_shapes(spec, tp):
        flops = 2.0 * n * k * m
        nbytes = b * (k * m + n * k + n * m)
        total += np.maximum(flops / gpu.peak_flops, nbytes / gpu.mem_bandwidth)
    return total


def lm_head_roofline(spec: ModelSpec, tp: int, gpu: GPUSpec, seqs: np.ndarray) -> np.ndarray:
    """Seconds of the LM-head GEMM at peak for one logit row per sequence (vocab split over TP)."""
    n = np.asarray(seqs, dtype=float)
    k, m = spec.hidden_size, spec.vocab_size // tp
    nbytes = spec.bytes_per_param * (k * m + n * k + n * m)
    return np.maximum(2.0 * n * k * m / gpu.peak_flops, nbytes / gpu.mem_bandwidth)


def elementwise_bytes(spec: ModelSpec, tp: int, tokens: np.ndarray,
                      rope: bool | None = None) -> np.ndarray:
    """Bytes per layer moved by norms, rope, activation and residual adds (read + write).

    ``rope`` defaults to the model's own position encoding (``spec.rope``; ALiBi models have none);
    ``rope=False`` counts only the ops the H200 profile measured.
    """
    h, d = spec.hidden_size, spec.head_dim
    inter = spec.intermediate_size // tp
    if rope is None:
        rope = spec.rope
    rope = 2 * (spec.num_heads // tp + max(1, spec.num_kv_heads // tp)) * d if rope else 0
    act = inter * (3 if spec.gated_mlp else 2)
    per_token = 2 * (2 * h) + rope + act + 2 * (3 * h)
    return np.asarray(tokens, dtype=float) * per_token * spec.bytes_per_param


def measured_linear(model: str, tp: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens, per-layer linear seconds, embedding seconds) measured for a profiled model."""
    df = load("compute")
    df = df[(df.model == model) & (df.tp == tp)].sort_values("num_tokens")
    per_layer = df[["qkv", "out", "up", "down", "elementwise"]].sum(axis=1).to_numpy() * 1e-3
    return df.num_tokens.to_numpy(), per_layer, df.emb.to_numpy() * 1e-3


def fit_linear(exclude: str | None = None, frame: pd.DataFrame | None = None,
               gpu_name: str = REFERENCE_GPU, rope: bool = True,
               gemm_const: float = 0.0) -> dict:
    """Efficiency curve (by token count) and element-wise coefficients, fitted on A100 data.

    ``exclude`` leaves one profiled model out, for leave-one-model-out validation. ``frame``
    (columns as ``compute.csv``), ``gpu_name``, ``rope`` (whether the frame's element-wise times
    include rope) and ``gemm_const`` (a fixed time per GEMM, taken off before the efficiencies
    are fitted) let the H200 fit reuse this; the defaults are the A100 fit.
    """
    df = load("compute") if frame is None else frame
    df = df[df.model != exclude]
    gpu = GPUS[gpu_name]
    ratios, elt_x, elt_y = [], [], []
    for (model, tp), g in df.groupby(["model", "tp"]):
        spec = MODELS[model]
        n = g.num_tokens.to_numpy()
        gemm = g[["qkv", "out", "up", "down"]].sum(axis=1).to_numpy() * 1e-3
        if gemm_const:
            gemm = gemm - 4 * gemm_const
        ratios.append(pd.Series(gemm_roofline(spec, tp, gpu, n) / gemm, index=n))
        elt_x.append(elementwise_bytes(spec, tp, n, rope=None if rope else False))
        elt_y.append(g.elementwise.to_numpy() * 1e-3)
    eff = pd.concat(ratios).groupby(level=0).median()
    x, y = np.concatenate(elt_x), np.concatenate(elt_y)
    # Relative least squares: small-token kernels (microseconds) matter as much as big ones.
    design = np.c_[np.ones_like(x), x] / y[:, None]
    const, per_byte = linalg.lstsq(design, np.ones_like(y))
    out = {"eff_tokens": eff.index.astype(float).tolist(), "eff": eff.tolist(),
           "elt_const": float(max(const, 0.0)), "elt_per_byte": float(per_byte),
           "gpu": gpu_name}
    if gemm_const:
        out["gemm_const"] = float(gemm_const)
    return out


def predict_linear(coef: dict, spec: ModelSpec, tp: int, gpu: GPUSpec,
                   tokens: np.ndarray) -> np.ndarray:
    """Per-layer linear-op seconds from the roofline and the fitted efficiencies.

    On a GPU other than the one ``coef`` was fitted on (``coef["gpu"]``, the A100 by default)
    this is an extrapolation: the fitted efficiencies are assumed to carry over, scaled by the
    GPU's datasheet peak FLOP/s and bandwidth. A fitted fixed time per GEMM (``gemm_const``,
    H200) is a launch/latency floor and is not scaled.
    """
    n = np.maximum(np.asarray(tokens, dtype=float), 1.0)
    eff = np.interp(np.log(n), np.log(coef["eff_tokens"]), coef["eff"])
    bw_ratio = GPUS[coef.get("gpu", REFERENCE_GPU)].mem_bandwidth / gpu.mem_bandwidth
    elt = coef["elt_const"] + elementwise_bytes(spec, tp, n) * coef["elt_per_byte"] * bw_ratio
    out = gemm_roofline(spec, tp, gpu, n) / eff + elt
    if coef.get("gemm_const"):
        out = out + 4 * coef["gemm_const"]
    return out


def mape(pred, meas) -> float:
    """Mean absolute percentage error, in percent."""
    pred, meas = np.asarray(pred, dtype=float), np.asarray(meas, dtype=float)
    return float(np.mean(np.abs(pred - meas) / meas) * 100.0)


def fit_prefill_attention() -> dict:
    """Per chunk size: causal time with an empty cache and slope per chunk x cached token."""
    df = load("attention_prefill")
    chunks, t0, slope = [], [], []
    for chunk, g in df.groupby("chunk"):
        g = g.sort_values("kv")
        base = g[g.kv == 0].time_ms.mean() if (g.kv == 0).any() else g.time_ms.iloc[0]
        chunks.append(float(chunk))
        t0.append(float(base) * 1e-3)
        g = g[g.kv > 0]
        if len(g):
            # Least squares through the kv=0 point, relative weights.
            x = chunk * g.kv.to_numpy() / g.time_ms.to_numpy()
            y = (g.time_ms.to_numpy() - base) / g.time_ms.to_numpy()
            slope.append(float(max(linalg.dot(x, y) / linalg.dot(x, x), 0.0)) * 1e-3)
        else:
            slope.append(np.nan)
    slope_s = pd.Series(slope).ffill().bfill()
    return {"chunks": chunks, "t0": t0, "slope": slope_s.tolist()}


def predict_prefill_attention(coef: dict, chunk, kv) -> np.ndarray:
    """Seconds of one layer's prefill attention for the reference (70B-shape, TP2) head layout."""
    chunk, kv = np.asarray(chunk, dtype=float), np.asarray(kv, dtype=float)
    c, t0 = np.asarray(coef["chunks"]), np.asarray(coef["t0"])
    base = np.interp(chunk, c, t0)
    # Beyond the largest profiled chunk causal work grows quadratically.
    big = chunk > c[-1]
    base = np.where(big, t0[-1] * (chunk / c[-1]) ** 2, base)
    return base + chunk * kv * np.interp(chunk, c, coef["slope"])


def fit_decode_attention() -> dict:
    """Decode attention per layer (reference shape): ``a0 + a1 x batch + s(batch) x KV bytes``.

    The fixed part is shared by all batch sizes (so it cannot dip as the batch grows); the
    per-byte cost ``s`` is fitted per profiled batch size, since small batches cannot occupy the
    GPU and read the cache more slowly. A floor at the best bandwidth reached bounds the slope
    for batches past the profiled range.
    """
    df = load("attention_decode")
    batches = sorted(float(b) for b in df.batch.unique())
    col = {b: i for i, b in enumerate(batches)}
    x = (df.batch * df.kv * ATTN_REF_KV_BYTES).to_numpy(dtype=float)
    y = df.time_ms.to_numpy() * 1e-3
    design = np.zeros((len(df), 2 + len(batches)))
    design[:, 0] = 1.0
    design[:, 1] = df.batch
    design[np.arange(len(df)), 2 + df.batch.map(lambda b: col[float(b)]).to_numpy()] = x
    coef = linalg.lstsq(design / y[:, None], np.ones_like(y))
    a0, a1 = float(coef[0]), float(max(coef[1], 0.0))
    s = [float(max(v, 0.0)) for v in coef[2:]]
    return {"batches": batches, "a": [a0 + a1 * b for b in batches], "a0": a0, "a1": a1,
            "s": s, "sat_a": 0.0, "sat_s": min(s[len(s) // 2:])}


def predict_decode_attention(coef: dict, batch, kv_bytes) -> np.ndarray:
    """Seconds of one layer's decode attention for ``batch`` sequences reading ``kv_bytes``."""
    batch, kv_bytes = np.asarray(batch, dtype=float), np.asarray(kv_bytes, dtype=float)
    a = np.interp(batch, coef["batches"], coef["a"])
    s = np.interp(batch, coef["batches"], coef["s"])
    return np.maximum(a + s * kv_bytes, coef["sat_a"] + coef["sat_s"] * kv_bytes)


# ----------------------------------------------------------------------------- communication


def fit_all_reduce(bins_per_decade: int = 8) -> dict:
    """Per TP degree: median time on log-spaced size bins, and an alpha-beta fit (for scaling)."""
    df = load("all_reduce")
    out = {}
    for workers, g in df.groupby("num_workers"):
        logs = np.log10(g["size"].to_numpy())
        key = np.floor(logs * bins_per_decade)
        med = g.assign(key=key, logs=logs).groupby("key")[["logs", "time_ms"]].median()
        x = g["size"].to_numpy() * 2.0 * (workers - 1) / workers
        y = g.time_ms.to_numpy() * 1e-3
        alpha, beta = linalg.lstsq(np.c_[np.ones_like(x), x] / y[:, None], np.ones_like(y))
        out[str(int(workers))] = {"log_size": med.logs.tolist(),
                                  "time": (med.time_ms * 1e-3).tolist(),
                                  "alpha": float(alpha), "beta": float(beta)}
    return out


def predict_all_reduce(coef: dict, tp: int, size_bytes, link_ratio: float = 1.0) -> np.ndarray:
    """Seconds of one all-reduce of ``size_bytes`` over ``tp`` GPUs (0 when tp == 1).

    ``link_ratio`` = A100 NVLink bandwidth / target link bandwidth scales the bandwidth term of
    the alpha-beta fit (an extrapolation for non-A100 GPUs).
    """
    size = np.maximum(np.asarray(size_bytes, dtype=float), 1.0)
    if tp == 1:
        return np.zeros_like(size)
    c = coef[str(tp)]
    t = np.interp(np.log10(size), c["log_size"], c["time"])
    top = size > 10 ** c["log_size"][-1]
    wire = size * 2.0 * (tp - 1) / tp
    t = np.where(top, c["time"][-1] + c["beta"] * (wire - 10 ** c["log_size"][-1]
                                                     * 2.0 * (tp - 1) / tp), t)
    if link_ratio != 1.0:
        ab = c["alpha"] + c["beta"] * wire
        t = t * (c["alpha"] + c["beta"] * wire * link_ratio) / ab
    return t


# ----------------------------------------------------------------------------- CPU overhead


def fit_cpu_overhead() -> dict:
    """``a + a_tp [tp > 1] + b x batch`` (seconds) over every profiled model's CPU steps."""
    df = load("cpu_overheads")
    y = df[list(CPU_STEPS)].sum(axis=1).to_numpy() * 1e-3
    design = np.c_[np.ones(len(df)), (df.tp > 1).astype(float), df.batch]
    a, a_tp, b = linalg.lstsq(design / y[:, None], np.ones_like(y))
    return {"a": float(a), "a_tp": float(a_tp), "b": float(b)}


def predict_cpu_overhead(coef: dict, tp: int, batch) -> np.ndarray:
    """CPU seconds per iteration for ``batch`` sequences."""
    return coef["a"] + coef["a_tp"] * (tp > 1) + coef["b"] * np.asarray(batch, dtype=float)


# ----------------------------------------------------------------------------- all together


@functools.lru_cache(maxsize=None)
def _fit_all_cached() -> dict:
    return {"linear": fit_linear(), "prefill_attention": fit_prefill_attention(),
            "decode_attention": fit_decode_attention(), "all_reduce": fit_all_reduce(),
            "cpu": fit_cpu_overhead()}


def fit_all() -> dict:
    """Every fitted coefficient (plain floats and lists), fitted once per process."""
    return _fit_all_cached()


def component_errors() -> pd.DataFrame:
    """MAPE (%) of the attention, all-reduce and CPU fits on their own measurements."""
    coef = fit_all()
    rows = []
    pre = load("attention_prefill")
    rows.append(("prefill attention", "70B-shape tp2", len(pre), mape(
        predict_prefill_attention(coef["prefill_attention"], pre.chunk, pre.kv),
        pre.time_ms * 1e-3)))
    dec = load("attention_decode")
    rows.append(("decode attention", "70B-shape tp2", len(dec), mape(
        predict_decode_attention(coef["decode_attention"], dec.batch,
                                 dec.batch * dec.kv * ATTN_REF_KV_BYTES), dec.time_ms * 1e-3)))
    for workers, g in load("all_reduce").groupby("num_workers"):
        rows.append(("all-reduce", f"tp{workers}", len(g), mape(
            predict_all_reduce(coef["all_reduce"], int(workers), g["size"]), g.time_ms * 1e-3)))
    cpu = load("cpu_overheads")
    for (model, tp), g in cpu.groupby(["model_name", "tp"]):
        rows.append(("cpu overhead", f"{model} tp{tp}", len(g), mape(
            predict_cpu_overhead(coef["cpu"], int(tp), g.batch),
            g[list(CPU_STEPS)].sum(axis=1) * 1e-3)))
    return pd.DataFrame(rows, columns=["component", "subset", "points", "mape"])
