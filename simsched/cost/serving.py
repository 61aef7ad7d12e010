"""Whole-iteration engine terms fitted on real serving runs (DGX-A100, DGX-H100), and the replay
of those runs through the cost model.

The bundled runs (``data/real_serving/``, SplitwiseSim's ``perf_model.csv``, MIT) time a 2023
serving engine on Llama-2-70B (TP 2/4/8) and BLOOM-176B (TP 8): B prompts of P tokens submitted
together, then decoded together for T tokens; ``prompt_time`` until every prompt is prefilled,
``token_time`` the mean decode iteration. Replaying a run (:func:`iterations`) assumes the engine
of that era (vLLM 0.2): prompts are never split and go first, batched whole into iterations of at
most :data:`PROMPT_TOKEN_BUDGET` tokens; then every sequence decodes together.

An iteration of the ``eager_2023`` engine takes ``max(G + X, F) + C``, with G the GPU kernel time
(:class:`simsched.cost.kernels.KernelTables`) and, per measured system:

* ``comm_scale``: G's all-reduces (the A100 NCCL profile, scaled by link bandwidth on other GPUs)
  times this ratio: how much slower the engine's collectives ran than that profile;
* ``X = collectives x (TP - 1) x sync_per_collective + large_iteration_time_per_byte x bus bytes
  of the tokens beyond 2,048``: every all-reduce waits for the slowest rank (in an eager engine
  the ranks' host threads drift apart, and the wait grows with the ring's TP - 1 hops), and
  iterations over 2,048 tokens take longer per extra token than their kernels, in proportion to
  the all-reduce bytes those tokens add (so more at higher TP and for wider models). The data
  shows where that excess appears; that it sits in the collectives is an assumption;
* ``F = layers x floor_per_layer``, or ``layers x floor_per_layer_prefill`` in iterations that
  prefill: the host launches every kernel from Python, one layer at a time, so the GPU can run
  no faster than the host issues layers (decode at TP 4 and 8 is launch-bound; a prompt
  iteration launches more, slower host work per layer);
* ``C = serial_per_seq x sequences``: CPU work per sequence that does not overlap the GPU
  (block tables, sampling, output processing). A fixed per-iteration CPU cost cannot be told
  apart from the collective wait at TP >= 2 (the only runs there are) and fits to zero.

The terms are fitted per system on its own GPU's Llama-2-70B runs (least squares on relative
errors of prompt and token times). BLOOM-176B is predicted, not fitted. Runs at TP 2 with 64
prompts are left out (:data:`ANOMALY`).
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from simsched.cost import linalg
from simsched.cost.base import Batch
from simsched.cost.calibration import DATA_DIR
from simsched.cost import fits
from simsched.cost.hardware import GPUS, MODELS
from simsched.cost.kernels import KernelTables

REAL_DIR = DATA_DIR / "real_serving"
MODEL_NAMES = {"llama2-70b": "llama-2-70b", "bloom-176b": "bloom-176b"}
GPU_NAMES = {"a100-80gb": "a100-80gb", "h100-80gb": "h100-sxm", "h100-80gb-pcap": "h100-sxm-pcap"}
# Each measured system's terms are fitted on its own GPU's Llama-2-70B runs.
FIT_GPUS = {"dgx-a100": "a100-80gb", "dgx-h100": "h100-sxm", "dgx-h100-pcap": "h100-sxm-pcap"}
FIT_MODEL = "llama-2-70b"
# vLLM 0.2 batches whole prompts up to max_num_batched_tokens, which defaults to the model length;
# the runs' 8,192-token prompts need at least that.
PROMPT_TOKEN_BUDGET = 8192
DECODE_POINTS = 9
ANOMALY = ("TP 2 with 64 prompts: 64 x 640 tokens do not fit the KV cache left beside 69 GB of "
           "weights per GPU (about 40,000 tokens), and the prompt time below the 4-prompt run's "
           "and decode faster than with 32 prompts show the engine did not run all 64 together")
TERMS = ("comm_scale", "sync_per_collective", "large_iteration_time_per_byte",
         "floor_per_layer_prefill", "serial_per_seq", "floor_per_layer")
# Scale of each term for the fit (seconds; comm_scale is a ratio, the large-iteration term s/byte).
_START = np.array([1.0, 20e-6, 1e-11, 0.6e-3, 0.1e-3, 0.4e-3])
TERM_UNITS = {"comm_scale": ("x", 1.0), "sync_per_collective": ("us", 1e6),
              "large_iteration_time_per_byte": ("ps/B", 1e12),
              "floor_per_layer_prefill": ("ms", 1e3), "serial_per_seq": ("ms", 1e3),
              "floor_per_layer": ("ms", 1e3)}
# Tokens of an iteration beyond this many pay the large-iteration term.
LARGE_ITERATION_TOKENS = 2048


@functools.lru_cache(maxsize=None)
def load() -> pd.DataFrame:
    """Every bundled run (all repetitions), with simsched's model and GPU names; times in s."""
    df = pd.read_csv(REAL_DIR / "splitwise.csv")
    bad = set(df.model) - set(MODEL_NAMES) | set(df.hardware) - set(GPU_NAMES)
    if bad:
        raise ValueError(f"{REAL_DIR / 'splitwise.csv'}: unknown model/hardware {sorted(bad)}")
    return pd.DataFrame({
        "model": df.model.map(MODEL_NAMES), "gpu": df.hardware.map(GPU_NAMES),
        "tp": df.tensor_parallel.astype(int), "prompt_size": df.prompt_size.astype(int),
        "batch_size": df.batch_size.astype(int), "token_size": df.token_size.astype(int),
        "prompt_time": df.prompt_time * 1e-3, "token_time": df.token_time * 1e-3})


@functools.lru_cache(maxsize=None)
def scenarios() -> pd.DataFrame:
    """One row per measured configuration: mean and spread over its repetitions, and whether it
    is an anomaly (left out of fits and targets)."""
    keys = ["model", "gpu", "tp", "prompt_size", "batch_size", "token_size"]
    g = load().groupby(keys, sort=False)
    out = g[["prompt_time", "token_time"]].mean()
    out["prompt_std"] = g.prompt_time.std()
    out["token_std"] = g.token_time.std()
    out["reps"] = g.size()
    out = out.reset_index()
    out["anomaly"] = (out.tp == 2) & (out.batch_size == 64)
    return out


def iterations(prompt_size: int, batch_size: int, token_size: int,
               budget: int = PROMPT_TOKEN_BUDGET) -> tuple[list[Batch], list[Batch], np.ndarray]:
    """(prefill batches, decode batches, decode weights) of one run as the 2023 engine runs it.

    Prompts go whole into iterations of at most ``budget`` tokens (at least one prompt each);
    the decode batches sample the T - 1 decode steps (context P + 1 ... P + T - 1) at
    :data:`DECODE_POINTS` evenly spaced steps, weighted so their mean is the trapezoidal mean.
    """
    per_it = max(1, budget // prompt_size)
    prefill, left = [], batch_size
    while left > 0:
        k = min(per_it, left)
        prefill.append(Batch([prompt_size] * k, [0] * k))
        left -= k
    steps = np.linspace(1, max(1, token_size - 1), DECODE_POINTS).round().astype(int)
    weights = np.ones(len(steps))
    weights[[0, -1]] = 0.5
    decode = [Batch([], [], batch_size, batch_size * (prompt_size + int(s))) for s in steps]
    return prefill, decode, weights / weights.sum()


def gpu_parts(k: KernelTables, batch: Batch) -> tuple[float, float]:
    """(kernel seconds without the all-reduces, all-reduce seconds) of one iteration."""
    tokens, seqs = batch.num_tokens, batch.num_seqs
    t = k.linear[tokens] + k.emb[tokens] + k.lm_head[seqs]
    for c, cached_tokens in zip(batch.prefill_new_tokens, batch.prefill_cached_tokens):
        t += k.pre_t0[c] + c * cached_tokens * k.pre_slope[c]
    if batch.num_decode_seqs:
        n, ctx = batch.num_decode_seqs, batch.decode_context_sum
        t += max(k.dec_a[n] + k.dec_s[n] * ctx, k.sat_a + k.sat_s * ctx)
    return float(t), float(k.comm[tokens])


def large_iteration_bytes(k: KernelTables, tokens) -> np.ndarray:
    """Bus bytes per iteration that the large-iteration term charges: the all-reduce bytes of the
    tokens beyond :data:`LARGE_ITERATION_TOKENS`, times the ring's 2 (TP - 1) / TP."""
    extra = np.maximum(np.asarray(tokens, dtype=float) - LARGE_ITERATION_TOKENS, 0.0)
    return k.num_collectives * extra * k.spec.hidden_size * k.spec.bytes_per_param \
        * 2.0 * (k.tp - 1) / k.tp


class Features:
    """Per-iteration inputs of the whole-iteration model for a set of runs (numpy arrays)."""

    NAMES = ("gpu", "comm", "sync", "big", "floor", "seqs", "layers")

    def __init__(self, runs: pd.DataFrame, budget: int = PROMPT_TOKEN_BUDGET) -> None:
        cols = {phase: {c: [] for c in self.NAMES} for phase in ("pre", "dec")}
        idx = {"pre": [], "dec": []}
        dec_w = []
        models: dict = {}
        for i, r in enumerate(runs.itertuples()):
            key = (r.model, r.gpu, r.tp)
            if key not in models:
                models[key] = KernelTables(MODELS[r.model], GPUS[r.gpu], int(r.tp), r.model,
                                           table_tokens=max(budget, int(r.prompt_size)))
            k = models[key]
            pre, dec, w = iterations(r.prompt_size, r.batch_size, r.token_size, budget)
            for phase, batches in (("pre", pre), ("dec", dec)):
                slow = k.gpu.prefill_slowdown if phase == "pre" else 1.0
                for b in batches:
                    g, c = gpu_parts(k, b)
                    g, c = g * slow, c * slow
                    values = (g, c, k.num_collectives * (k.tp - 1),
                              float(large_iteration_bytes(k, b.num_tokens)) * slow,
                              k.spec.num_layers if b.prefill_new_tokens else 0, b.num_seqs,
                              k.spec.num_layers)
                    for name, v in zip(self.NAMES, values):
                        cols[phase][name].append(v)
                idx[phase] += [i] * len(batches)
            dec_w += list(w)
        self.cols = {c: np.asarray(cols["pre"][c] + cols["dec"][c], dtype=float)
                     for c in self.NAMES}
        self.n_pre = len(idx["pre"])
        self.pre_idx, self.dec_idx = np.asarray(idx["pre"]), np.asarray(idx["dec"])
        self.dec_w = np.asarray(dec_w)
        self.num_runs = len(runs)

    def predict(self, terms: dict | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(prompt time, token time) per run in seconds under the given terms."""
        p = terms if isinstance(terms, np.ndarray) else np.array([terms[t] for t in TERMS])
        c = self.cols
        inner = c["gpu"] + p[0] * c["comm"] + p[1] * c["sync"] + p[2] * c["big"]
        floor = np.maximum(p[3] * c["floor"], p[5] * c["layers"])
        t = np.maximum(inner, floor) + p[4] * c["seqs"]
        n = self.n_pre
        prompt = np.bincount(self.pre_idx, t[:n], minlength=self.num_runs)
        token = np.bincount(self.dec_idx, t[n:] * self.dec_w, minlength=self.num_runs)
        return prompt, token


def _levenberg_marquardt(residuals, z: np.ndarray, iters: int = 60) -> np.ndarray:
    """Minimise ``sum(residuals(z)**2)`` (numerical Jacobian; no scipy dependency). Sums and
    solves go through :mod:`simsched.cost.linalg`, so the path, and the result, are the same on
    every machine (the problem is flat in some directions, where BLAS rounding moved the result
    by tens of percent)."""
    lam = 1e-2
    r = residuals(z)
    cost = linalg.dot(r, r)
    for _ in range(iters):
        jac = np.empty((len(r), len(z)))
        for i in range(len(z)):
            dz = np.zeros_like(z)
            dz[i] = 1e-6 * max(1.0, abs(z[i]))
            jac[:, i] = (residuals(z + dz) - r) / dz[i]
        jtj, jtr = linalg.gram(jac, r)
        improved = False
        for _ in range(10):
            step = linalg.solve(jtj + lam * np.diag(np.diag(jtj) + 1e-12), -jtr)
            r_new = residuals(z + step)
            cost_new = linalg.dot(r_new, r_new)
            if cost_new < cost:
                z, r, cost, lam, improved = z + step, r_new, cost_new, lam / 3, True
                break
            lam *= 4
        if not improved or np.max(np.abs(step)) < 1e-7:
            break
    return z


def fit_terms(runs: pd.DataFrame, budget: int = PROMPT_TOKEN_BUDGET,
              fixed: dict | None = None) -> dict:
    """Fit the whole-iteration terms to ``runs`` (one host's): least squares on the relative
    errors of prompt and token times. Terms stay non-negative (``comm_scale`` at least 1);
    ``fixed`` pins terms to given values."""
    feats = Features(runs, budget)
    meas = np.concatenate([runs.prompt_time.to_numpy(), runs.token_time.to_numpy()])
    fixed = fixed or {}
    free = [i for i, t in enumerate(TERMS) if t not in fixed]
    base = np.array([fixed.get(t, 0.0) for t in TERMS])

    def unpack(z):
        p = base.copy()
        p[free] = _START[free] * z * z  # unit scale; the square keeps every term >= 0
        p[0] = max(p[0], 1.0) if 0 in free else p[0]
        return p

    def residuals(z):
        return np.concatenate(feats.predict(unpack(z))) / meas - 1.0

    best = None
    for start in (1.0, 0.3, 2.0):  # a few starts; keep the best local optimum
        z = _levenberg_marquardt(residuals, np.full(len(free), start))
        r = residuals(z)
        cost = linalg.dot(r, r)
        if best is None or cost < best[0]:
            best = (cost, z)
    p = unpack(best[1])
    return {name: float(v) for name, v in zip(TERMS, p)}


def fit_engine_terms() -> dict:
    """Fit the ``eager_2023`` terms of every measured system on its own Llama-2-70B runs."""
    runs = scenarios()
    out = {}
    for host, gpu in FIT_GPUS.items():
        sel = runs[(runs.model == FIT_MODEL) & (runs.gpu == gpu) & ~runs.anomaly]
        out[host] = fit_terms(sel)
    return out


# The fit replays the runs through KernelTables, so the kernel fits' shipped files are sources.
ENGINE_FIT = fits.register(fits.ShippedFit(
    "engine-eager-2023", fit_engine_terms,
    sources=("data/real_serving/splitwise.csv", "serving.py", "kernels.py", "profiles",
             "calibration.py", "calibration_h200.py", "linalg.py", "hardware.py", "specs.py",
             "data/fits/a100-80gb.json", "data/fits/h200.json")))


def engine_terms() -> dict:
    """The fitted ``eager_2023`` terms per host (``dgx-a100``, ``dgx-h100``, ...), as shipped."""
    return fits.coefficients(ENGINE_FIT.name)
