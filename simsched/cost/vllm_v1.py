"""The ``vllm_v1`` engine profile: what a current vLLM V1 deployment adds around the GPU kernels.

A decode-sized step of vLLM V1 replays a CUDA graph; the scheduler plans step k + 1 while step k
runs (async scheduling, modelled by the engine: :mod:`simsched.engine.replica`), and sampled tokens
reach the client after output processing and the HTTP stream. With G the kernel time of the
operator profiles (:class:`simsched.cost.kernels.KernelTables`, all-reduces replaced as below),
``s`` sequences, ``L`` layers, ``V`` the vocabulary and ``cpu(s)`` the CPU steps of the
``overlapped`` choice (hidden behind the GPU unless longer), an iteration takes

    max(G + L x kernel_per_layer + s x V x sampler_per_logit, cpu(s)) + step_gap

and a token reaches the client ``output_delay`` after its step ends. The terms:

* **custom all-reduce** (inside G): vLLM's own all-reduce over NVLink for messages below
  :data:`CUSTOM_AR_MAX_BYTES` (8 MiB, vLLM's default limit), NCCL (the A100 profile scaled by link
  bandwidth, as the other choices) beyond. One-shot (every rank reads all peers' buffers: ``(TP - 1)
  x bytes`` over the link) at TP 2, below 512 KiB at TP <= 4 and below 256 KiB at TP <= 8; two-shot
  (reduce-scatter + all-gather: ``2 (TP - 1) / TP x bytes``, two synchronisations) otherwise, as
  vLLM's ``custom_all_reduce.cuh`` chooses. Link: half the GPU's NVLink total (one direction).
  ``allreduce_latency`` (fitted) is the time per call and peer: a call costs ``latency x (TP - 1)``
  per synchronisation plus bytes / link bandwidth. A step has ``2 L + 1`` calls (after attention
  and after the MLP in every layer, and the vocabulary-parallel embedding).
* **step_gap** (measured, not fitted): what a CUDA-graph step costs on the host beyond its GPU
  time (replay, copy of the sampled ids, synchronise): the H200 whole-step profile's median round
  trip minus GPU time (``h200/iteration.csv``; the ``overlapped`` gap). It replaces the eager
  engines' launch cost per kernel.
* **kernel_per_layer** (fitted): the small per-layer kernels the operator profiles do not time
  (KV-cache write, the fused residual/norm variants, rotary beyond the element-wise estimate),
  a constant per layer and step.
* **sampler_per_logit** (fitted): sampling (logit processing, softmax, top-k/top-p, penalties)
  per sequence and vocabulary entry.
* **output_delay** (fitted): from a step's end to the client seeing its token: output processing
  (detokenising), the HTTP stream and the client; with random arrivals it also absorbs the
  request's input path (HTTP, tokenising), which only shifts which step an arrival joins.

The four fitted terms come from the 13 dense vLLM 0.15.1 H100 runs bundled in ``data/vllm_v1/``
(:func:`fit_terms`): a mean-value model of each stage's steady decode (its batch by Little's law,
1 + rate x E2E, with E2E from the modelled step: solved together with the terms) is fitted to the
engine's measured time per generated token (least squares on relative errors, terms kept >= 0),
and ``output_delay`` is the median over runs of measured TTFT minus the async pipeline's 2.5
steps (rest of the step in flight, the step already planned, the request's own step). No
simulation runs in the fit; ``experiments.validate_vllm`` checks the result end to end, leaving
one run out. The coefficients ship as ``data/fits/engine-vllm-v1.json``.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pandas as pd

from simsched.cost import aiconfigurator as aic
from simsched.cost import calibration as cal
from simsched.cost import fits, linalg, overhead
from simsched.cost.hardware import GPUS, MODELS, all_reduce_tables
from simsched.cost.kernels import KernelTables

DATA_DIR = cal.DATA_DIR / "vllm_v1"
CUSTOM_AR_MAX_BYTES = 8 * 2**20
# The runs' GPU names in simsched's catalog; the models' names are the catalog's already.
GPU_NAMES = {"h100": "h100-sxm"}
# Base models with the Llama-2 tokenizer: their random prompts re-tokenise longer (the data
# README's measured lengths), and they emit end-of-sequence tokens under ignore_eos, which the
# load generator's re-count of output tokens drops (their published itl_mean is per re-counted
# token).
LLAMA2_FAMILY = ("llama-2-7b", "llama-2-70b", "codellama-34b")
RETOKENISED = {547: 575, 566: 592, 750: 786, 1034: 1082}
FREE_TERMS = ("allreduce_latency", "kernel_per_layer", "sampler_per_logit")
TERMS = FREE_TERMS + ("output_delay", "step_gap")
TERM_UNITS = {"allreduce_latency": ("us per call and peer", 1e6),
              "kernel_per_layer": ("us per layer and step", 1e6),
              "sampler_per_logit": ("ps per sequence and vocabulary entry", 1e12),
              "output_delay": ("ms", 1e3), "step_gap": ("ms per step", 1e3)}
# Steps between an arrival and its first token's step end with async scheduling at a steady
# load: half the step in flight (on average), the step already planned, and its own.
PIPELINE_STEPS = 2.5
MAX_NUM_SEQS = 128          # the runs' server setting: the most sequences a step batches
_MS = 1e-3


# ----------------------------------------------------------------------------- the runs


def parse_stages(text: str) -> list[tuple[float, float]]:
    """``'8x600/20x600'`` -> ``[(8.0, 600.0), (20.0, 600.0)]`` (requests/s, seconds)."""
    out = []
    for part in str(text).split("/"):
        try:
            rate, seconds = (float(v) for v in part.split("x"))
        except ValueError:
            raise ValueError(f"stages_rate_x_seconds: {text!r} is not RATExSECONDS[/...]") \
                from None
        if not (rate > 0 and seconds > 0):
            raise ValueError(f"stages_rate_x_seconds: {text!r} needs positive rates and seconds")
        out.append((rate, seconds))
    return out


def prompt_tokens(model: str, system: int, question: int) -> tuple[int, int]:
    """(system-prompt tokens, whole prompt tokens) as the server tokenised them."""
    nominal = int(system) + int(question)
    if model not in LLAMA2_FAMILY:
        return int(system), nominal
    total = RETOKENISED.get(nominal, round(nominal * 1.05))
    return round(int(system) * total / nominal), total


@functools.lru_cache(maxsize=None)
def load_runs(include_moe: bool = False, data_dir=None) -> pd.DataFrame:
    """The bundled runs, one row each: settings, stages, tokenised prompt lengths and the
    measured metrics in seconds (``ttft_mean`` ... ``itl_mean``) plus ``engine_itl``, the measured
    time per generated token ((E2E - TTFT) / (output - 1), which the published ``itl_mean`` is
    only outside the Llama-2 family). MoE runs are dropped unless ``include_moe``.
    ``data_dir``: another folder of runs in the same two files (default: the bundled one)."""
    folder = DATA_DIR if data_dir is None else Path(data_dir)
    for name in ("runs.csv", "measured.csv"):
        if not (folder / name).is_file():
            raise ValueError(f"data_dir: {folder / name} not found")
    runs = pd.read_csv(folder / "runs.csv")
    meas = pd.read_csv(folder / "measured.csv")
    bad = set(meas.experiment) - set(runs.experiment)
    if bad:
        raise ValueError(f"{folder / 'measured.csv'}: experiments not in runs.csv: "
                         f"{sorted(bad)}")
    wide = meas.pivot(index="experiment", columns="metric", values="measured_ms") * _MS
    moe = runs.model.str.contains("moe", case=False, regex=False) \
        | runs.model.str.contains("scout", case=False, regex=False)
    if not include_moe:
        runs = runs[~moe]
        unknown = set(runs.model) - set(MODELS)
        if unknown:
            raise ValueError(f"{folder / 'runs.csv'}: models not in the catalog: "
                             f"{sorted(unknown)}")
    runs = runs.join(wide, on="experiment").reset_index(drop=True)
    runs["gpu"] = runs.gpu.map(lambda g: GPU_NAMES.get(g, g))
    shapes = [prompt_tokens(m, s, q) for m, s, q in
              zip(runs.model, runs.system_tokens, runs.question_tokens)]
    runs["system_prompt_tokens"] = [s for s, _ in shapes]
    runs["prompt_tokens"] = [p for _, p in shapes]
    runs["stages"] = [parse_stages(s) for s in runs.stages_rate_x_seconds]
    runs["engine_itl"] = (runs.e2e_mean - runs.ttft_mean) / (runs.output_tokens - 1)
    return runs


# ----------------------------------------------------------------------------- all-reduce


def custom_all_reduce(tp: int, nbytes, link_bandwidth: float, latency: float) -> np.ndarray:
    """Seconds of one vLLM custom all-reduce of ``nbytes`` over ``tp`` GPUs (one-shot or
    two-shot as vLLM picks; 0 at TP 1). ``link_bandwidth``: bytes/s one GPU reads over NVLink."""
    nbytes = np.asarray(nbytes, dtype=float)
    if tp == 1:
        return np.zeros_like(nbytes)
    if tp == 2:
        one_shot = np.ones(nbytes.shape, dtype=bool)
    else:
        one_shot = nbytes < (512 if tp <= 4 else 256) * 2**10
    sync = latency * (tp - 1)
    return np.where(one_shot, sync + (tp - 1) * nbytes / link_bandwidth,
                    2 * sync + 2 * (tp - 1) / tp * nbytes / link_bandwidth)


def num_collectives(k: KernelTables) -> int:
    """All-reduces per step: two per layer and the vocabulary-parallel embedding's (TP > 1)."""
    return 2 * k.spec.num_layers + 1 if k.tp > 1 else 0


def comm_table(k: KernelTables, latency: float) -> np.ndarray:
    """All-reduce seconds of a step by token count: custom all-reduce for messages below 8 MiB,
    the kernel tables' NCCL estimate per call from there. The custom all-reduce is
    :func:`custom_all_reduce` with the fitted ``latency``, or, on a GPU marked
    ``all_reduce="measured"`` (``hardware.all_reduce``), AIConfigurator's measured all-reduce
    of that message on this GPU and GPU count (:func:`simsched.cost.aiconfigurator.all_reduce`)."""
    if k.tp == 1:
        return np.zeros_like(k.comm)
    if getattr(k, "all_reduce_per_call", None) is not None:
        # Measured on this GPU (vLLM's custom all-reduce, NCCL beyond): no fitted latency term.
        comm = num_collectives(k) * np.maximum.accumulate(k.all_reduce_per_call)
        comm[0] = 0.0
        return comm
    n = np.arange(len(k.comm), dtype=float)
    msg = n * k.spec.hidden_size * k.spec.bytes_per_param
    if k.gpu.all_reduce == "measured":
        custom = aic.all_reduce(all_reduce_tables(k.gpu.name), k.tp, msg)
    else:
        custom = custom_all_reduce(k.tp, msg, k.gpu.interconnect_bandwidth / 2, latency)
    nccl = k.comm / k.num_collectives
    per_call = np.where(msg < CUSTOM_AR_MAX_BYTES, custom, nccl)
    comm = num_collectives(k) * per_call
    comm[0] = 0.0
    return comm


def step_gap() -> float:
    """Host seconds of a CUDA-graph step beyond its GPU time (H200 whole-step profile; the
    ``overlapped`` choice's gap)."""
    return overhead.overlapped_gap()


# ----------------------------------------------------------------------------- the fit


class _Stage:
    """One stage of a run in the mean-value model: its decode step as a function of the number
    of sequences ``n`` (the request itself and the others in the engine, by Little's law)."""

    def __init__(self, k: KernelTables, comm: tuple, run, rate: float, seconds: float) -> None:
        self.rate, self.weight = rate, rate * seconds       # weight: the stage's requests
        self.output_tokens = int(run.output_tokens)
        self.n0 = 1.0 + rate * float(run.e2e_mean)          # start: the measured latency
        m = np.arange(MAX_NUM_SEQS + 2)
        ctx = m * (run.prompt_tokens + run.output_tokens / 2)   # mean context of the decoders
        bw, sync = comm
        attn = np.maximum(k.dec_a[m] + k.dec_s[m] * ctx, k.sat_a + k.sat_s * ctx)
        self.fixed = k.linear[m] + k.emb[m] + k.lm_head[m] + bw[m] + attn + step_gap()
        self.cols = np.column_stack([sync[m], np.full(len(m), float(k.spec.num_layers)),
                                     m * float(k.spec.vocab_size)])

    def step(self, n: float, theta: np.ndarray) -> tuple[float, np.ndarray]:
        """(fixed seconds, free-term columns) of a decode step of ``n`` (fractional) sequences,
        linearly interpolated between whole batches."""
        lo = min(max(1, int(np.floor(n))), MAX_NUM_SEQS)
        frac = min(max(n - lo, 0.0), 1.0)
        fixed = (1 - frac) * self.fixed[lo] + frac * self.fixed[lo + 1]
        return fixed, (1 - frac) * self.cols[lo] + frac * self.cols[lo + 1]

    def settle(self, theta: np.ndarray, delay: float) -> float:
        """The stage's mean batch: ``n = 1 + rate x E2E(n)`` solved by damped iteration, with
        E2E = TTFT + (output - 1) steps and TTFT = :data:`PIPELINE_STEPS` steps + ``delay``."""
        n = self.n0
        for _ in range(200):
            fixed, cols = self.step(n, theta)
            tau = fixed + linalg.dot(cols, theta)
            e2e = PIPELINE_STEPS * tau + delay + (self.output_tokens - 1) * tau
            new = min(1.0 + self.rate * e2e, float(MAX_NUM_SEQS))
            if abs(new - n) < 1e-9:
                break
            n = 0.5 * (n + new)
        return n


def stages(runs: pd.DataFrame) -> list[list[_Stage]]:
    """The mean-value model's stages of every run."""
    tables: dict = {}
    out = []
    for r in runs.itertuples():
        key = (r.model, r.gpu, int(r.tp))
        if key not in tables:
            k = KernelTables(MODELS[r.model], GPUS[r.gpu], int(r.tp), r.model)
            bw = comm_table(k, 0.0)
            tables[key] = (k, (bw, comm_table(k, 1.0) - bw))
        k, comm = tables[key]
        out.append([_Stage(k, comm, r, rate, seconds) for rate, seconds in r.stages])
    return out


def _design(model: list[list[_Stage]], theta: np.ndarray, delay: float
            ) -> tuple[np.ndarray, np.ndarray]:
    """(fixed seconds, free-term columns) of each run's request-weighted mean decode step, every
    stage at its settled batch under ``theta`` and ``delay``."""
    base, design = [], []
    for run in model:
        w = np.array([st.weight for st in run])
        parts = [st.step(st.settle(theta, delay), theta) for st in run]
        base.append(linalg.dot(w, [f for f, _ in parts]) / w.sum())
        design.append(np.sum([wi * c for wi, (_, c) in zip(w, parts)], axis=0) / w.sum())
    return np.array(base), np.array(design)


def predict_itl(runs: pd.DataFrame, terms: dict) -> np.ndarray:
    """Mean-value engine time per generated token of each run under ``terms`` (seconds)."""
    theta = np.array([terms[t] for t in FREE_TERMS])
    base, design = _design(stages(runs), theta, terms["output_delay"])
    return base + (design * theta).sum(axis=1)


def _nonnegative_lstsq(base: np.ndarray, design: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``theta`` minimising the relative errors of ``base + design @ theta`` against ``y`` with
    every term >= 0: a term fitted negative (or one no run informs) is pinned at 0 and the rest
    refitted."""
    cols, target = design / y[:, None], 1.0 - base / y
    free = [j for j in range(design.shape[1]) if np.abs(cols[:, j]).max() > 0]
    theta = np.zeros(design.shape[1])
    while free:
        sol = linalg.lstsq(cols[:, free], target)
        if (sol >= 0).all():
            theta[free] = sol
            break
        free.pop(int(np.argmin(sol)))
    return theta


def fit_terms(runs: pd.DataFrame | None = None, exclude: str | None = None) -> dict:
    """Fit the free terms on ``runs`` (default: the bundled dense runs), leaving out the run
    named ``exclude``: least squares on relative errors of the engine's time per token, terms
    >= 0; ``output_delay`` the median of measured TTFT minus :data:`PIPELINE_STEPS` predicted
    steps. Each stage's batch depends on the terms (Little's law): batches and terms are solved
    in turn until they agree."""
    runs = load_runs() if runs is None else runs
    if exclude is not None:
        if exclude not in set(runs.experiment):
            raise ValueError(f"exclude: no run named {exclude!r}")
        runs = runs[runs.experiment != exclude]
    model = stages(runs)
    y = runs.engine_itl.to_numpy()
    theta, delay = np.zeros(len(FREE_TERMS)), 0.0
    for _ in range(100):
        base, design = _design(model, theta, delay)
        new = _nonnegative_lstsq(base, design, y)
        itl = base + (design * new).sum(axis=1)
        new_delay = max(0.0, float(np.median(runs.ttft_mean.to_numpy() - PIPELINE_STEPS * itl)))
        done = np.allclose(new, theta, rtol=1e-12, atol=0.0) and abs(new_delay - delay) < 1e-15
        theta, delay = new, new_delay
        if done:
            break
    terms = {name: float(v) for name, v in zip(FREE_TERMS, theta)}
    terms["output_delay"] = delay
    terms["step_gap"] = step_gap()
    return terms


FIT = fits.register(fits.ShippedFit(
    "engine-vllm-v1", fit_terms,
    sources=("data/vllm_v1/runs.csv", "data/vllm_v1/measured.csv", "data/h200/iteration.csv",
             "vllm_v1.py", "overhead.py", "kernels.py", "profiles", "calibration.py", "calibration_h200.py",
             "linalg.py", "hardware.py", "specs.py", "data/fits/a100-80gb.json",
             "data/fits/h200.json")))


def terms() -> dict:
    """The shipped ``vllm_v1`` terms (seconds; see :data:`TERM_UNITS`)."""
    return fits.coefficients(FIT.name)
