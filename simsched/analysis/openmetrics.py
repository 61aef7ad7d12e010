"""The Prometheus metrics a vLLM server would have exported during a simulated run, as OpenMetrics.

Each replica is one vLLM server (labels ``model_name``, ``engine="0"`` as vLLM sets them, plus
``instance="replica-R"`` and ``job`` as a scrape would add them), scraped every ``interval``
seconds of simulated time; sample timestamps are ``epoch`` + simulated time. Names, types and
histogram buckets are vLLM 0.33's (``vllm/v1/metrics/loggers.py`` and ``buckets.py``):

- gauges ``vllm:num_requests_running``, ``vllm:num_requests_waiting`` (requests admitted and
  not finished, and arrived and not yet admitted), ``vllm:kv_cache_usage_perc`` (KV blocks
  in use over the replica's blocks, 0 to 1, as of its last iteration);
- counters ``vllm:prompt_tokens_total`` (a request's prompt counted when its first token is
  produced), ``vllm:generation_tokens_total`` (every token, at the end of the step that made
  it), ``vllm:request_success_total{finished_reason="stop"}``, ``vllm:num_preemptions_total``
  and, with prefix caching, ``vllm:prefix_cache_queries_total`` / ``_hits_total`` (tokens);
- histograms ``vllm:time_to_first_token_seconds`` (observed at the first token),
  ``vllm:inter_token_latency_seconds`` (each gap at the step that ended it; gaps that do not end
  at a decode step, such as the first after a preemption, at the request's finish),
  ``vllm:e2e_request_latency_seconds``, ``vllm:request_queue_time_seconds``,
  ``vllm:request_prefill_time_seconds``, ``vllm:request_decode_time_seconds``,
  ``vllm:request_inference_time_seconds``, ``vllm:request_prompt_tokens`` and
  ``vllm:request_generation_tokens`` (observed when the request finishes, as vLLM records its
  finished-request stats), and ``vllm:iteration_tokens_total`` (each iteration's tokens).

The text ends with ``# EOF`` and loads into Prometheus with ``promtool tsdb
create-blocks-from openmetrics FILE DIR``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

DEFAULT_EPOCH = 1_767_225_600.0     # 2026-01-01T00:00:00Z: a run's t = 0 as a wall-clock time

REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TIME_TO_FIRST_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                               1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
INTER_TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def request_tokens_buckets(max_model_len: int) -> tuple:
    """vLLM's 1-2-5 series of token-count buckets up to ``max_model_len``."""
    out, exponent = [], 0
    while True:
        for m in (1, 2, 5):
            value = m * 10 ** exponent
            if value > max_model_len:
                return tuple(out)
            out.append(value)
        exponent += 1


def _fmt(v: float) -> str:
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


class _Series:
    """Cumulative values of one replica's metrics at the scrape times."""

    def __init__(self, scrapes: np.ndarray) -> None:
        self.scrapes = scrapes

    def cumulative(self, at: np.ndarray, weights=None) -> np.ndarray:
        """How many (or how much of ``weights``) of the events ``at`` happened by each scrape."""
        at = np.asarray(at, dtype=float)
        keep = np.isfinite(at)
        at = at[keep]
        order = np.argsort(at, kind="stable")
        at = at[order]
        if weights is None:
            return np.searchsorted(at, self.scrapes, side="right")
        w = np.asarray(weights, dtype=float)[keep][order]
        total = np.concatenate(([0.0], np.cumsum(w)))
        return total[np.searchsorted(at, self.scrapes, side="right")]

    def histogram(self, at, values, buckets) -> dict:
        """Bucket counts (cumulative over ``le``), count and sum by each scrape."""
        at = np.asarray(at, dtype=float)
        values = np.asarray(values, dtype=float)
        keep = np.isfinite(at) & np.isfinite(values)
        at, values = at[keep], values[keep]
        out = {"buckets": [(le, self.cumulative(at[values <= le])) for le in buckets]}
        out["buckets"].append((math.inf, self.cumulative(at)))
        out["count"] = out["buckets"][-1][1]
        out["sum"] = self.cumulative(at, values)
        return out


def _itl_by_replica(res, replica_of_row: np.ndarray, num_replicas: int):
    """(times, gaps, weights) of every inter-token gap, per replica: regular gaps at the end of
    the decode step that ended them, irregular ones at their request's finish."""
    from simsched.engine.log import decode_step_ends

    itl = res._itl
    ends = decode_step_ends(res.iterations, num_replicas)
    sizes = [len(e) for e in ends]
    starts = np.cumsum([0] + sizes[:-1])
    times = np.concatenate(ends) if ends else np.zeros(0)
    out = []
    finished = res.requests["finished_at"].to_numpy()
    for r in range(num_replicas):
        lo, hi = starts[r], starts[r] + sizes[r]
        hi = min(hi, len(itl.step_gaps))
        t = times[lo:hi] if len(times) >= hi else np.full(hi - lo, np.nan)
        g, w = itl.step_gaps[lo:hi], itl.step_counts[lo:hi]
        parts_t, parts_g, parts_w = [t], [g], [w]
        if itl.other_owner is not None and len(itl.other):
            mine = replica_of_row[itl.other_owner] == r
            parts_t.append(finished[itl.other_owner[mine]])
            parts_g.append(itl.other[mine])
            parts_w.append(np.ones(int(mine.sum())))
        out.append((np.concatenate(parts_t), np.concatenate(parts_g),
                    np.concatenate(parts_w).astype(float)))
    return out


def _weighted_histogram(series: _Series, at, values, weights, buckets) -> dict:
    at, values, weights = (np.asarray(x, dtype=float) for x in (at, values, weights))
    keep = np.isfinite(at) & np.isfinite(values) & (weights > 0)
    at, values, weights = at[keep], values[keep], weights[keep]
    out = {"buckets": [(le, series.cumulative(at[values <= le], weights[values <= le]))
                       for le in buckets]}
    out["buckets"].append((math.inf, series.cumulative(at, weights)))
    out["count"] = out["buckets"][-1][1]
    out["sum"] = series.cumulative(at, values * weights)
    return out


def collect(res, interval: float = 1.0) -> dict:
    """Every metric family of ``res`` by name: ``(type, help, {replica: values})``, where a
    gauge's or counter's values are one number per scrape and a histogram's a dict of
    cumulative ``buckets``, ``count`` and ``sum``; plus ``scrapes`` (simulated seconds)."""
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) \
            or not math.isfinite(interval) or interval <= 0:
        raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
    end = float(res.sim_time) if math.isfinite(res.sim_time) else 0.0
    # The client sees the last tokens an output delay after the engine's clock stopped.
    done = res.requests["finished_at"].to_numpy()
    if np.isfinite(done).any():
        end = max(end, float(np.nanmax(np.where(np.isfinite(done), done, -np.inf))))
    if end / interval > 1e6:
        raise ValueError(f"interval {interval} s gives {math.ceil(end / interval):,} scrapes of "
                         f"a {end:.6g} s run; the limit is 1,000,000: choose a longer interval")
    scrapes = np.arange(1, math.floor(end / interval) + 1) * float(interval)
    if not len(scrapes) or scrapes[-1] < end:
        scrapes = np.append(scrapes, end)
    series = _Series(scrapes)
    reqs, its = res.requests, res.iterations
    replica = reqs["replica"].to_numpy()
    num_replicas = int(max(replica.max(initial=-1), its["replica"].max() if len(its) else -1)) + 1
    num_blocks = {int(r.replica): int(r.num_blocks) for r in res.replicas.itertuples()} \
        if res.replicas is not None else {}
    max_model_len = int(res.info.get("max_model_len") or res.requests["num_prompt_tokens"].max()
                        + res.requests["num_output_tokens"].max())
    token_buckets = request_tokens_buckets(max_model_len)
    preempted_replica = replica[np.searchsorted(reqs["request_id"].to_numpy(),
                                                res.preemptions["request_id"].to_numpy())] \
        if len(res.preemptions) else np.zeros(0, dtype=int)
    itl = _itl_by_replica(res, replica, num_replicas)
    families: dict = {}

    def put(name, kind, text, r, value):
        families.setdefault(name, (kind, text, {}))[2][r] = value

    for r in range(num_replicas):
        q = reqs[replica == r]
        it = its[its["replica"].to_numpy() == r] if len(its) else its
        arrival, scheduled = q["arrival_at"].to_numpy(), q["first_scheduled_at"].to_numpy()
        first, done = q["first_token_at"].to_numpy(), q["finished_at"].to_numpy()
        engine_first = q["engine_first_token_at"].to_numpy()
        engine_done = q["engine_finished_at"].to_numpy()
        started_at = it["started_at"].to_numpy()
        it_end = started_at + it["duration"].to_numpy()
        put("vllm:num_requests_running", "gauge", "Number of requests in model execution "
            "batches.", r, series.cumulative(scheduled) - series.cumulative(engine_done))
        put("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
            r, series.cumulative(arrival) - series.cumulative(scheduled)
            - series.cumulative(arrival[q["status"].to_numpy() == "rejected"]))
        last = np.searchsorted(started_at, scrapes, side="right") - 1
        used = it["kv_blocks_used"].to_numpy()
        usage = np.where(last >= 0, used[np.maximum(last, 0)] if len(used) else 0, 0)
        put("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
            r, usage / max(num_blocks.get(r, 1), 1))
        put("vllm:prompt_tokens", "counter", "Number of prefill tokens processed.", r,
            series.cumulative(first, q["num_prompt_tokens"].to_numpy()))
        put("vllm:generation_tokens", "counter", "Number of generation tokens processed.", r,
            series.cumulative(it_end, it["num_decode_tokens"].to_numpy())
            + series.cumulative(engine_first))
        put("vllm:request_success", "counter", "Count of successfully processed requests.", r,
            series.cumulative(done[q["status"].to_numpy() == "finished"]))
        put("vllm:num_preemptions", "counter", "Cumulative number of preemption from the "
            "engine.", r, series.cumulative(res.preemptions["at"].to_numpy()[preempted_replica
                                                                            == r]))
        if "num_cached_tokens" in q.columns:
            put("vllm:prefix_cache_queries", "counter", "Prefix cache queries, in terms of "
                "number of queried tokens.", r, series.cumulative(
                    scheduled, q["num_prompt_tokens"].to_numpy()))
            put("vllm:prefix_cache_hits", "counter", "Prefix cache hits, in terms of number of "
                "cached tokens.", r, series.cumulative(scheduled,
                                                       q["num_cached_tokens"].to_numpy()))
        put("vllm:time_to_first_token_seconds", "histogram", "Histogram of time to first token "
            "in seconds.", r, series.histogram(first, first - arrival,
                                               TIME_TO_FIRST_TOKEN_BUCKETS))
        t, g, w = itl[r]
        put("vllm:inter_token_latency_seconds", "histogram", "Histogram of inter-token latency "
            "in seconds.", r, _weighted_histogram(series, t, g, w, INTER_TOKEN_LATENCY_BUCKETS))
        phases = {"e2e_request_latency": done - arrival, "request_queue_time": scheduled - arrival,
                  "request_prefill_time": engine_first - scheduled,
                  "request_decode_time": engine_done - engine_first,
                  "request_inference_time": engine_done - scheduled}
        for name, values in phases.items():
            put(f"vllm:{name}_seconds", "histogram", f"Histogram of {name.replace('_', ' ')} in "
                "seconds.", r, series.histogram(done, values, REQUEST_LATENCY_BUCKETS))
        put("vllm:request_prompt_tokens", "histogram", "Number of prefill tokens processed.", r,
            series.histogram(done, q["num_prompt_tokens"].to_numpy(), token_buckets))
        put("vllm:request_generation_tokens", "histogram", "Number of generation tokens "
            "processed.", r, series.histogram(done, q["num_generated_tokens"].to_numpy(),
                                              token_buckets))
        put("vllm:iteration_tokens_total", "histogram", "Histogram of number of tokens per engine"
            "_step.", r, series.histogram(it_end, (it["num_prefill_tokens"].to_numpy()
                                                    + it["num_decode_tokens"].to_numpy()),
                                          ITERATION_TOKENS_BUCKETS))
    return {"scrapes": scrapes, "families": families}


def openmetrics_text(res, interval: float = 1.0, epoch: float = DEFAULT_EPOCH,
                     job: str = "simsched") -> str:
    """The run's metrics (see the module docstring) as OpenMetrics text ending in ``# EOF``."""
    if isinstance(epoch, bool) or not isinstance(epoch, (int, float)) or not math.isfinite(epoch):
        raise ValueError(f"epoch must be a number of seconds since 1970, got {epoch!r}")
    data = collect(res, interval)
    stamps = [repr(round(epoch + float(t), 3)) for t in data["scrapes"]]
    model = str(res.config.hardware.model) if res.config is not None else "unknown"
    lines = []
    for name, (kind, text, per_replica) in data["families"].items():
        family = name[:-len("_total")] if kind == "counter" and name.endswith("_total") else name
        lines += [f"# TYPE {family} {kind}", f"# HELP {family} {text}"]
        for r, values in per_replica.items():
            labels = f'engine="0",instance="replica-{r}",job="{job}",model_name="{model}"'
            if family == "vllm:request_success":
                labels += ',finished_reason="stop"'
            if kind == "histogram":
                for le, counts in values["buckets"]:
                    lines += [f'{family}_bucket{{{labels},le="{_fmt(float(le))}"}} '
                              f'{_fmt(int(c))} {s}' for c, s in zip(counts, stamps)]
                lines += [f"{family}_count{{{labels}}} {_fmt(int(c))} {s}"
                          for c, s in zip(values["count"], stamps)]
                lines += [f"{family}_sum{{{labels}}} {_fmt(float(v))} {s}"
                          for v, s in zip(values["sum"], stamps)]
            else:
                suffix = "_total" if kind == "counter" else ""
                lines += [f"{family}{suffix}{{{labels}}} {_fmt(float(v))} {s}"
                          for v, s in zip(values, stamps)]
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def write_openmetrics(res, path, **options) -> Path:
    """Write :func:`openmetrics_text` of ``res`` to ``path``; return the path."""
    if not isinstance(path, (str, Path)):
        raise TypeError(f"metrics path must be a file path, got {type(path).__name__} {path!r}")
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"metrics path {path} is a directory: give a file name")
    if path.parent.exists() and not path.parent.is_dir():
        raise ValueError(f"metrics path {path}: {path.parent} is a file, not a directory")
    text = openmetrics_text(res, **options)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
