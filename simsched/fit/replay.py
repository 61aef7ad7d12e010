"""Measured runs as simulations: the workload and server of each :class:`Measured` run rebuilt.

A :class:`Scenario` is one measured run made reproducible: a config, a request table, which
requests are scored and the measured metrics to compare with. :func:`scenario` builds one from

* a run of the two-file format of ``real-serving/vllm-0.15/`` (``runs.csv`` + ``measured.csv``,
  :func:`~simsched.analysis.measurements.read_run_tables`): the load generator's stages
  (``stages_rate_x_seconds``), 10 shared system prompts x 10 questions cycled, outputs of exactly
  ``output_tokens``, the server of the bundled validation (:func:`run_config`);
* a ``vllm bench serve`` result (:func:`~simsched.analysis.measurements.read_vllm_bench`) with
  the server's settings merged into ``settings`` (model, gpu, tensor_parallel_size, ...): the
  per-request lengths where the file has them (``--save-detailed``), else the mean lengths, sent
  by simsched's ``vllm bench serve`` client at the file's ``request_rate``, ``burstiness`` and
  ``max_concurrency``.

Runs are kept short so a calibration can simulate each many times: each stage of a run table is
cut to ``window`` = max(:data:`MIN_WINDOW`, :data:`WINDOW_E2E` x its measured E2E mean) seconds and
only requests arriving after one E2E and before the last E2E of the window are scored (the
steady state the long measured stages mostly are); a bench run sends at most ``max_requests``
requests (the first ones, in the file's order), scored after the first 10 %.
"""

from __future__ import annotations

import dataclasses
import gc
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from simsched.analysis.measurements import Measured
from simsched.analysis.runner import simulate
from simsched.config import ClientConfig, SimConfig
from simsched.cost import factory, vllm_v1
from simsched.cost.overhead import DEFAULT_ENGINE_OVERHEAD
from simsched.cost.hardware import GPUS, MODELS

NUM_PROMPTS, NUM_GROUPS = 100, 10      # the vllm-0.15 load generator's prompt pool
STAGE_DELAY = 1.0                      # first arrival after a stage starts (s)
STAGE_GAP = 120.0                      # idle time between simulated stages (s)
MIN_WINDOW, WINDOW_E2E = 40.0, 5.0
MAX_REQUESTS = 400
# vLLM's --quantization names in runs.csv's precision column -> simsched weight dtypes.
PRECISIONS = {"fp8-dynamic": "fp8", "fp8": "fp8", "bf16/fp16": "auto", "auto": "auto"}
METRICS = ("ttft_mean", "ttft_p90", "ttft_p99", "e2el_mean", "e2el_p90", "e2el_p99",
           "tpot_mean", "itl_mean")


@dataclass
class Scenario:
    """One measured run as a simulation: ``config`` and ``requests`` (request ids in row order),
    ``scored`` (a boolean per request: scored or warm-up), ``measured`` (metric -> seconds) and
    the ``metrics`` a fit compares (measured and simulated alike)."""

    name: str
    config: SimConfig
    requests: pd.DataFrame
    scored: np.ndarray
    measured: dict
    metrics: tuple
    source: Measured | None = None
    notes: list = field(default_factory=list)

    @property
    def hardware(self):
        return self.config.hardware

    def simulate(self, terms: dict | None = None) -> dict:
        """The simulated metrics (seconds) under deployment ``terms`` (None: shipped)."""
        cost = None if terms is None else factory.adjusted_cost_model(self.hardware, terms)
        res = simulate(self.config, requests=self.requests, cost_model=cost)
        out = metrics_of(res.requests, self.scored)
        # A run leaves reference cycles (its processes and engine) that the collector's oldest
        # generation reaches rarely; a fit runs hundreds of them: collect each at once (about
        # 10 ms) rather than let them pile up to gigabytes.
        del res
        gc.collect()
        return out


def metrics_of(df: pd.DataFrame, scored: np.ndarray | None = None) -> dict:
    """:data:`METRICS` over the finished, scored requests of a request frame (``itl_mean``: the
    token-weighted mean gap, as vllm bench pools every gap)."""
    if scored is not None:
        df = df[scored[df["request_id"].to_numpy()]]
    done = df[df["status"] == "finished"]
    if not len(done):
        return {m: math.nan for m in METRICS}
    ttft, e2el = done["ttft"].to_numpy(float), done["e2el"].to_numpy(float)
    out = {"ttft_mean": ttft.mean(), "e2el_mean": e2el.mean()}
    for q in (90, 99):
        out[f"ttft_p{q}"] = float(np.percentile(ttft, q))
        out[f"e2el_p{q}"] = float(np.percentile(e2el, q))
    many = done[done["num_output_tokens"] > 1]
    gaps = (many["e2el"] - many["ttft"]).to_numpy(float)
    steps = (many["num_output_tokens"] - 1).to_numpy(float)
    out["tpot_mean"] = float((gaps / steps).mean()) if len(many) else math.nan
    out["itl_mean"] = float(gaps.sum() / steps.sum()) if len(many) else math.nan
    return {m: float(out[m]) for m in METRICS}


# ----------------------------------------------------------------------------- run tables


def stage_arrivals(rate: float, seconds: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival offsets of one stage from its start: rate x seconds exponential gaps scaled to
    sum to the stage's duration, the first :data:`STAGE_DELAY` after the start."""
    n = max(1, int(round(rate * seconds)))
    gaps = rng.exponential(size=n)
    return STAGE_DELAY + np.concatenate([[0.0], np.cumsum(gaps[:-1])]) * seconds / gaps.sum()


def staged_requests(stages, system: int, prompt: int, output: int, starts, seed: int = 0
                    ) -> pd.DataFrame:
    """The load generator's requests (``arrival_at``, tokens, ``hash_ids``, ``stage``): stage k
    of ``stages`` (rate, seconds) from ``starts[k]``; 10 groups x 10 prompts shuffled once, the
    n-th request of a stage sending prompt n % 100 (prompt identities in blocks of the system
    prompt's length: the group's id, then the prompt's own)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(NUM_PROMPTS)
    blocks = -(-prompt // system)
    ids = [[int(p // (NUM_PROMPTS // NUM_GROUPS))]
           + [NUM_GROUPS + int(p) * blocks + j for j in range(blocks - 1)] for p in order]
    frames = []
    for k, ((rate, length), start) in enumerate(zip(stages, starts)):
        at = start + stage_arrivals(rate, length, rng)
        n = np.arange(len(at))
        frames.append(pd.DataFrame({
            "arrival_at": at, "num_prompt_tokens": prompt, "num_output_tokens": int(output),
            "hash_ids": [ids[i % NUM_PROMPTS] for i in n], "stage": k}))
    df = pd.concat(frames, ignore_index=True)
    df.attrs["hash_block_size"] = system
    return df


def run_config(model: str, gpu: str, tp: int, max_num_batched_tokens: int,
               gpu_memory_utilization: float = 0.9, num_blocks=None, model_spec=None,
               seed: int = 0) -> SimConfig:
    """The vllm-0.15 runs' server: max_num_seqs 128, block size 16, max_model_len 4096, prefix
    caching, chunked prefill, no watermark; the default engine profile's timing
    (``vllm_silicon``: ``vllm_v1`` with the fitted silicon terms) with the classic decisions
    (as ``experiments.validate_vllm``)."""
    return SimConfig.preset("classic").replace(
        model=model, gpu=gpu, tensor_parallel_size=int(tp), max_model_len=4096,
        gpu_memory_utilization=float(gpu_memory_utilization), model_spec=model_spec,
        engine_overhead=DEFAULT_ENGINE_OVERHEAD, max_num_seqs=128,
        max_num_batched_tokens=int(max_num_batched_tokens), enable_chunked_prefill=True,
        block_size=16, enable_prefix_caching=True, watermark=0.0, seed=seed,
        num_blocks=None if num_blocks is None or pd.isna(num_blocks) else int(num_blocks))


def _table_model(row: dict, where: str):
    """(simsched model name, model_spec or None) of a runs.csv row (MoE rows: the catalog's
    first word of ``model`` in the row's ``precision``)."""
    base = str(row["model"]).split()[0].lower()
    if base not in MODELS:
        raise ValueError(f"{where}: model {row['model']!r} is not in the catalog")
    precision = row.get("precision") or "auto"
    if precision not in PRECISIONS:
        raise ValueError(f"{where}: precision {precision!r}; known: {sorted(PRECISIONS)}")
    dtype = PRECISIONS[precision]
    if dtype == "auto":
        return base, None
    return f"{base}-{dtype}", dataclasses.replace(MODELS[base], weight_dtype=dtype)


def from_run_table(run: Measured, seed: int = 0, window: float | None = None) -> Scenario:
    """A run of the ``runs.csv`` + ``measured.csv`` format as a :class:`Scenario` (stages cut to
    ``window`` seconds; default from the measured E2E, see the module docstring)."""
    s, where = run.settings, run.source
    for key in ("stages_rate_x_seconds", "system_tokens", "question_tokens", "output_tokens",
                "max_num_batched_tokens"):
        if s.get(key) is None:
            raise ValueError(f"{where}: runs.csv column {key!r} is empty or missing")
    if "e2el_mean" not in run.metrics or "ttft_mean" not in run.metrics:
        raise ValueError(f"{where}: measured.csv needs e2e_mean and ttft_mean")
    model, spec = _table_model(s, where)
    gpu = vllm_v1.GPU_NAMES.get(s["gpu"], s["gpu"])
    if gpu not in GPUS:
        raise ValueError(f"{where}: gpu {s['gpu']!r} is not in the catalog")
    system, prompt = vllm_v1.prompt_tokens(str(s["model"]).split()[0].lower(),
                                           s["system_tokens"], s["question_tokens"])
    e2e = run.metrics["e2el_mean"]
    win = window if window is not None else max(MIN_WINDOW, WINDOW_E2E * e2e)
    stages = [(rate, min(length, win)) for rate, length in
              vllm_v1.parse_stages(s["stages_rate_x_seconds"])]
    starts = list(np.concatenate([[0.0], np.cumsum([w + STAGE_GAP for _, w in stages[:-1]])]))
    reqs = staged_requests(stages, system, prompt, int(s["output_tokens"]), starts, seed)
    reqs = reqs.sort_values("arrival_at", kind="stable", ignore_index=True)
    offset = reqs["arrival_at"].to_numpy() - np.asarray(starts)[reqs["stage"].to_numpy()]
    length = np.asarray([w for _, w in stages])[reqs["stage"].to_numpy()]
    # Steady state: after one E2E of ramp-up, before the last E2E's drain (when the stage is
    # long enough to have both).
    lead = np.minimum(e2e, length / 4)
    scored = (offset >= lead) & (offset <= length - lead)
    cfg = run_config(model, gpu, int(s["tp"]), int(s["max_num_batched_tokens"]),
                     float(s.get("gpu_memory_utilization") or 0.9),
                     s.get("kv_blocks_from_log"), spec, seed)
    wanted = ("ttft_mean", "ttft_p90", "e2el_mean", "e2el_p90")
    name = str(s.get("experiment", where))
    notes = [f"stages cut to {win:.0f} s; {int(scored.sum())} of {len(reqs)} requests scored"]
    return Scenario(name, cfg, reqs.drop(columns="stage"), scored,
                    {m: run.metrics[m] for m in wanted if m in run.metrics},
                    tuple(m for m in wanted if m in run.metrics), run, notes)


# ----------------------------------------------------------------------------- vllm bench


def _setting(run: Measured, key: str, kind=None):
    value = run.settings.get(key)
    if value is None:
        raise ValueError(f"{run.source}: the server setting {key!r} is needed (give the vllm "
                         "serve command line or a settings TOML with it)")
    return kind(value) if kind else value


def from_vllm_bench(run: Measured, seed: int = 0, max_requests: int = MAX_REQUESTS) -> Scenario:
    """A ``vllm bench serve`` result (with the server's settings in ``run.settings``) as a
    :class:`Scenario`: its per-request lengths (or mean lengths) sent by simsched's vllm bench
    client; at most ``max_requests`` requests, scored after the first 10 %."""
    where = run.source
    model = run.settings.get("model") or run.settings.get("model_id")
    if not model:
        raise ValueError(f"{where}: no model (the vllm serve command or model_id)")
    gpu = _setting(run, "gpu", str)
    n_done = int(run.metrics.get("num_finished", 0))
    notes = []
    if run.requests is not None:
        lens = run.requests[["num_prompt_tokens", "num_output_tokens"]].astype(int)
    else:
        for key in ("total_input_tokens", "total_output_tokens"):
            if key not in run.metrics:
                raise ValueError(f"{where}: missing key {key!r} (needed for the mean lengths "
                                 "without --save-detailed)")
        if n_done < 1:
            raise ValueError(f"{where}: completed must be at least 1")
        n = int(run.settings.get("num_prompts") or n_done)
        lens = pd.DataFrame({
            "num_prompt_tokens": [max(1, round(run.metrics["total_input_tokens"] / n_done))] * n,
            "num_output_tokens": [max(1, round(run.metrics["total_output_tokens"] / n_done))] * n})
        notes.append("no per-request lengths (--save-detailed): mean lengths")
    if len(lens) > max_requests:
        notes.append(f"first {max_requests} of {len(lens)} requests simulated")
        lens = lens.head(max_requests)
    rate = run.settings.get("request_rate", math.inf)
    rate = math.inf if rate in (None, "inf") else float(rate)
    burst = float(run.settings.get("burstiness") or 1.0)
    conc = run.settings.get("max_concurrency")
    client = ClientConfig(client_type="concurrency", request_rate=rate, burstiness=burst,
                          max_concurrency=None if conc is None else int(conc),
                          num_prompts=len(lens), ready_check=False)
    server = {k: run.settings[k] for k in ("max_num_seqs", "max_num_batched_tokens",
                                           "max_model_len", "block_size", "num_blocks",
                                           "gpu_memory_utilization", "enable_prefix_caching")
              if run.settings.get(k) is not None}
    cfg = SimConfig().replace(model=str(model), gpu=gpu, tensor_parallel_size=int(
        run.settings.get("tensor_parallel_size") or 1), seed=seed, client=client, **server)
    reqs = lens.assign(arrival_at=0.0)[["arrival_at", "num_prompt_tokens", "num_output_tokens"]]
    scored = np.arange(len(reqs)) >= len(reqs) // 10
    measured = dict(run.metrics)
    if run.requests is not None and notes and "first" in notes[-1]:
        # The simulated requests' own measured figures (the file's summary covers them all).
        sub = run.requests.head(len(reqs))[scored]
        measured["ttft_mean"] = float(sub["ttft"].mean())
    fit = tuple(m for m in ("ttft_mean", "ttft_p90", "e2el_mean", "e2el_p90", "tpot_mean",
                            "itl_mean") if m in measured)
    if not fit:
        raise ValueError(f"{where}: no metric to fit (mean_ttft_ms, mean_e2el_ms, ...)")
    return Scenario(str(where), cfg, reqs, scored, {m: measured[m] for m in fit}, fit, run, notes)


def scenario(run, seed: int = 0) -> Scenario:
    """The :class:`Scenario` of a measured run (a run table's row or a vllm bench result)."""
    if isinstance(run, Scenario):
        return run
    if not isinstance(run, Measured):
        raise ValueError(f"expected a measured run (simsched.analysis.measurements.Measured), "
                         f"got {type(run).__name__}")
    if "stages_rate_x_seconds" in run.settings:
        return from_run_table(run, seed)
    return from_vllm_bench(run, seed)
