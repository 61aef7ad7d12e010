"""Results of a run: tidy DataFrames built once from buffered rows, and their summaries.

Metric definitions follow ``vllm bench serve``: TTFT = first token - arrival; E2EL = finish -
arrival; TPOT = (E2EL - TTFT) / (output tokens - 1); ITL = every gap between consecutive output
tokens, pooled over all tokens of all requests for percentiles. Every percentile uses numpy's
default rule (linear interpolation, ``np.percentile``), as vLLM's benchmark does.

The request frame itself is built by :mod:`simsched.analysis.frames`, the replicas frame by
:mod:`simsched.analysis.replicas`.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from simsched.analysis.itl import ItlSamples
from simsched.analysis.replicas import build_replicas_frame, cluster_summary
from simsched.analysis.speculative import SUMMARY_KEYS as SPEC_SUMMARY_KEYS, spec_counters
from simsched.request import Status

PERCENTILES = (50, 90, 95, 99)
__all__ = ["PERCENTILES", "Results", "build_replicas_frame", "cluster_summary",
           "rejection_note"]


class _Masked:
    """Columns of ``df`` at the rows of a boolean ``mask``, taken one at a time, as arrays."""

    def __init__(self, df: pd.DataFrame, mask: np.ndarray) -> None:
        self.df, self.mask, self.n = df, mask, int(mask.sum())

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, name: str) -> np.ndarray:
        return self.df[name].to_numpy()[self.mask]


class Results:
    """What a run produced: per-request, per-iteration and per-replica frames, ITL samples and a
    summary.

    ``requests`` (one row per request), ``iterations`` (one row per GPU iteration),
    ``preemptions`` (one row per preemption) and ``replicas`` (one row per replica) are
    DataFrames; ``config`` is the run's :class:`~simsched.config.SimConfig`; ``info`` holds what
    the run derived (``num_blocks``) and its end state. ``steps`` (one row per request per
    scheduling step, :mod:`simsched.engine.steps`) is None unless the run recorded steps
    (``simulate(..., record_steps=True)``). ``fleet`` is an autoscaled run's
    :class:`~simsched.analysis.fleet_metrics.FleetResults` (replicas, cost, timeline), else None.
    """

    def __init__(self, requests: pd.DataFrame, iterations: pd.DataFrame, itl: ItlSamples,
                 preemptions: pd.DataFrame, config=None, sim_time: float = math.nan,
                 info: dict | None = None, replicas: pd.DataFrame | None = None,
                 steps: pd.DataFrame | None = None) -> None:
        self.requests = requests
        self.replicas = replicas
        self.steps = steps
        self.iterations = iterations
        self.preemptions = preemptions
        self.config = config
        self.sim_time = sim_time
        self.info = info or {}
        self.fleet = None   # an autoscaled run's FleetResults (simsched.analysis.fleet_metrics)
        # One row per attempt where clients time out, cancel or retry (simsched.analysis.attempts).
        self.attempts = None
        # One row per replica failure (simsched.cluster.failures), where replicas fail.
        self.failures = None
        # Degraded links (simsched.cluster.links): one row per degraded interval of a link,
        # one per KV transfer attempt.
        self.links = None
        self.transfers = None
        self._itl = itl

    def __repr__(self) -> str:
        status = self.requests["status"].value_counts()
        closed = ("finished", "rejected", "aborted")
        counts = ", ".join(f"{int(status.get(s, 0))} {s}"
                           for s in closed if status.get(s, 0)) or "none"
        pending = int(status.get(Status.PENDING.value, 0))
        unfinished = len(self.requests) - sum(int(status.get(s, 0)) for s in closed) - pending
        if unfinished:
            counts += f", {unfinished} unfinished"
        if pending:
            counts += f", {pending} not arrived"
        return (f"<Results: {len(self.requests)} requests ({counts}), "
                f"{len(self.iterations)} iterations, {len(self.preemptions)} preemptions, "
                f"{self.sim_time:.4g} s simulated>")

    def itl_samples(self) -> np.ndarray:
        """Every inter-token gap of every request, as a float array (seconds)."""
        return self._itl.array()

    @property
    def num_itl_samples(self) -> int:
        """How many inter-token gaps there are, without materialising them."""
        return len(self._itl)

    def summary(self) -> dict:
        """Counts, latency statistics (seconds), throughputs and KV use, as plain Python numbers.

        Keys follow one scheme: ``<metric>_mean``, ``<metric>_p50``, ``_p90``, ``_p95``, ``_p99``
        for ``ttft``, ``tpot``, ``itl``, ``e2el`` and ``queue_time``; percentiles are
        ``np.percentile``'s (linear interpolation), e.g. ``itl_p99 ==
        np.percentile(self.itl_samples(), 99)``. Which requests each
        figure covers (its *population*) matters when a run ends at ``max_sim_time`` with
        requests in flight:

        * ``ttft_*``: every request that received its first token, finished or not;
        * ``queue_time_*``: every request that was scheduled at least once, finished or not;
        * ``itl_*``: every gap between consecutive tokens emitted by any request, finished or
          not (pooled), and ``itl_max`` the largest;
        * ``tpot_*``: finished requests with more than one output token;
        * ``e2el_*``: finished requests;
        * ``request_throughput``, ``output_throughput``, ``total_token_throughput``: finished
          requests (and their prompt + output tokens) per second over ``duration``, from the
          first arrival to the last finish;
        * ``kv_usage_mean``: share of KV blocks in use, weighted by iteration time.

        When every request finished (no ``max_sim_time`` cut) all latency figures cover the
        same requests. Rejected requests appear only in ``num_rejected``. ``num_unfinished``
        counts requests that arrived but had not finished when the run ended (waiting, running
        or swapped out); ``num_not_arrived`` those whose arrival lay after it (``num_finished +
        num_rejected + num_unfinished + num_not_arrived == num_requests``, plus
        ``num_aborted`` where an autoscaled fleet aborts a removed replica's requests: the
        summary has that key, and ``num_migrations``, only where removed replicas abort or
        migrate). Aborted requests count like unfinished ones everywhere else: in TTFT and
        queue time if they got that far, never in E2EL, TPOT, throughput or goodput. With client
        timeouts, retries or replica failures (``Results.attempts``) the rows are user requests
        and ``num_timed_out``, ``num_cancelled`` and ``num_failed`` join the sum (their last
        attempt was given up), with ``num_attempts`` and the wasted tokens.
        """
        df = self.requests
        finished = (df["status"] == Status.FINISHED.value).to_numpy(dtype=bool)
        # Finished requests' columns, one at a time (a big run's memory): no sub-frame copies.
        done = _Masked(df, finished)
        out: dict = {"num_requests": len(df), "num_finished": len(done),
                     "num_rejected": int((df["status"] == Status.REJECTED.value).sum()),
                     "num_unfinished": int(df["status"].isin(
                         [Status.WAITING.value, Status.RUNNING.value,
                          Status.SWAPPED.value]).sum()),
                     # Arrival after the run ended (max_sim_time): neither served nor unserved.
                     "num_not_arrived": int((df["status"] == Status.PENDING.value).sum())}
        if self.attempts is not None:
            # Client timeouts, cancellations, retries or replica failures: the user requests
            # given up (after their last attempt), and the attempts' totals.
            for status in (Status.TIMED_OUT, Status.CANCELLED, Status.FAILED):
                out[f"num_{status.value}"] = int((df["status"] == status.value).sum())
            out["num_attempts"] = len(self.attempts)
            for name in ("num_wasted_prefill_tokens", "num_wasted_decode_tokens"):
                out[name] = int(df[name].sum())
        elif self.failures is not None:
            # Replica failures in a disaggregated pool (no client attempts): requests lost.
            out["num_failed"] = int((df["status"] == Status.FAILED.value).sum())
        for name in ("ttft", "tpot", "e2el", "queue_time"):
            column = df[name].to_numpy()
            keep = ~np.isnan(column)
            if name not in ("ttft", "queue_time"):
                keep &= finished
            values = column[keep]           # one copy of the rows (a big run's peak memory)
            del column, keep
            out[f"{name}_mean"] = float(values.mean()) if len(values) else math.nan
            for q, v in zip(PERCENTILES, _percentiles(values, overwrite=True)):
                out[f"{name}_p{q}"] = v
        del values
        out["itl_mean"] = self._itl.mean()
        for q, v in zip(PERCENTILES, self._itl.percentiles(PERCENTILES)):
            out[f"itl_p{q}"] = v
        out["itl_max"] = float(df["itl_max"].max()) if len(df) else math.nan
        span = (done["finished_at"].max() - df["arrival_at"].min()) if len(done) else math.nan
        out["duration"] = float(span)
        ok = bool(span and span > 0)
        out["request_throughput"] = len(done) / span if ok else math.nan
        out["output_throughput"] = float(done["num_output_tokens"].sum()) / span if ok \
            else math.nan
        out["total_token_throughput"] = (float(done["num_prompt_tokens"].sum()
                                               + done["num_output_tokens"].sum()) / span
                                         if ok else math.nan)
        out["num_preemptions"] = int(df["num_preemptions"].sum())
        out["num_recomputed_tokens"] = int(df["num_recomputed_tokens"].sum())
        out["num_swaps"] = int(df["num_swaps"].sum())
        out["swapped_bytes"] = float(df["swapped_bytes"].sum())
        out["swap_time"] = (float(self.iterations["swap_time"].sum())
                            if "swap_time" in self.iterations else 0.0)
        it = self.iterations
        out["num_iterations"] = len(it)
        blocks = self.info.get("replica_num_blocks") or [self.info.get("num_blocks")]
        if len(it) and blocks[0]:
            busy = it["duration"].to_numpy()

            def mean_share(column):
                if len(blocks) == 1:
                    return float((it[column].to_numpy() * busy).sum() / busy.sum() / blocks[0])
                # Each iteration's use is a share of its own replica's blocks.
                capacity = np.asarray(blocks, dtype=float)[it["replica"].to_numpy()]
                return float((it[column].to_numpy() / capacity * busy).sum() / busy.sum())

            out["kv_usage_mean"] = mean_share("kv_blocks_used")
            if "kv_blocks_cached" in it:
                out["kv_cached_usage_mean"] = mean_share("kv_blocks_cached")
        # Prefix cache: prompt tokens served from the cache at first admission / prompt tokens,
        # over every request admitted at least once (finished or still in flight).
        if "num_cached_tokens" in df:
            admitted = df["first_scheduled_at"].notna().to_numpy()
            prompt = float(df["num_prompt_tokens"].to_numpy()[admitted].sum())
            out["prefix_hit_rate"] = (float(df["num_cached_tokens"].to_numpy()[admitted].sum())
                                      / prompt if prompt else math.nan)
            for key, value in self.info.get("kv_tiers", {}).items():   # tiered KV cache
                out[key] = value
                if key.endswith("_hit_tokens"):
                    out[key[:-len("tokens")] + "rate"] = value / prompt if prompt else math.nan
                elif key == "kv_request_load_time":     # TTFT = queue time + this + compute
                    firsts = int(df["ttft"].notna().sum())
                    out["ttft_loading_mean"] = value / firsts if firsts else math.nan
        if "num_evicted_blocks" in it:
            out["num_evicted_blocks"] = int(it["num_evicted_blocks"].sum())
        out.update(cluster_summary(self.replicas, self.info))
        spec = self.info.get("speculative")
        if spec is not None:        # speculative decoding: simsched.analysis.speculative
            counters = spec_counters(spec)
            out.update((key, counters[key]) for key in SPEC_SUMMARY_KEYS)
        return {k: (v.item() if isinstance(v, np.generic) else v) for k, v in out.items()}

    def summary_frame(self) -> pd.DataFrame:
        """The summary as a one-row DataFrame."""
        return pd.DataFrame([self.summary()])

    def frames(self) -> dict[str, pd.DataFrame]:
        """``requests``, ``iterations``, ``preemptions`` and (if known) ``replicas``, ``steps``
        and an autoscaled fleet's ``fleet_units`` and ``fleet_timeline`` by name."""
        out = {"requests": self.requests, "iterations": self.iterations,
               "preemptions": self.preemptions}
        if self.replicas is not None:
            out["replicas"] = self.replicas
        if self.steps is not None:
            out["steps"] = self.steps
        if self.fleet is not None:
            out.update(fleet_units=self.fleet.units, fleet_timeline=self.fleet.timeline)
        if self.attempts is not None:
            out["attempts"] = self.attempts
        if self.failures is not None:
            out["failures"] = self.failures
        if self.links is not None:      # degraded links: timelines, KV transfer attempts
            out.update(links=self.links, transfers=self.transfers)
        return out

    def resolved_config(self) -> dict:
        """The run's config as JSON data, with ``derived`` values (e.g. ``num_blocks``)."""
        from simsched.analysis.export import resolved_config

        if self.config is None:
            return {}
        return resolved_config(self.config, self.info)

    def _write(self, directory, prefix: str, fmt: str) -> list:
        from simsched.analysis.export import write_frames, write_json

        written = write_frames(self.frames(), directory, fmt, prefix)
        if self.config is not None:
            written.append(write_json(self.resolved_config(),
                                      Path(directory) / f"{prefix}config.json"))
        return written

    def to_csv(self, directory, prefix: str = "") -> list:
        """Write the frames as CSV files and the resolved config as ``config.json`` into
        ``directory``; return the paths. Read them back with
        :func:`simsched.analysis.export.read_frames`."""
        return self._write(directory, prefix, "csv")

    def to_parquet(self, directory, prefix: str = "") -> list:
        """As :meth:`to_csv`, as Parquet files (needs pyarrow)."""
        return self._write(directory, prefix, "parquet")

    def to_perfetto(self, path, **window) -> Path:
        """Write the run as a Chrome/Perfetto trace (JSON) to ``path``: a track per replica with
        its iterations and KV counters, a track per request with its phases and preemptions,
        router decisions as instant events (:mod:`simsched.analysis.perfetto`; ``start_at``,
        ``end_at``, ``max_num_requests`` and ``max_num_iterations`` bound big runs)."""
        from simsched.analysis.perfetto import write_chrome_trace

        return write_chrome_trace(self, path, **window)

    def to_openmetrics(self, path, interval: float = 1.0, **options) -> Path:
        """Write the Prometheus metrics a vLLM server per replica would have exported during the
        run, scraped every ``interval`` simulated seconds, as OpenMetrics text to ``path``
        (:mod:`simsched.analysis.openmetrics`; backfill with ``promtool tsdb
        create-blocks-from openmetrics``)."""
        from simsched.analysis.openmetrics import write_openmetrics

        return write_openmetrics(self, path, interval=interval, **options)

    def energy(self, power_cap_watts: float | None = None, carbon_intensity=None):
        """Energy and power of the run from the GPU power model (computed on demand; see
        :mod:`simsched.analysis.energy`): per-iteration power, per-replica joules and peaks,
        J per request and per output token, and grams of CO2 given a carbon intensity."""
        from simsched.analysis.energy import energy

        return energy(self, power_cap_watts, carbon_intensity)

    def to_report(self, path, title: str = "simsched run", intervals=None) -> Path:
        """Write a one-page, self-contained HTML report of the run (config, summary, timeline,
        latency CDFs, replicas; :mod:`simsched.analysis.report`) to ``path``."""
        from simsched.analysis.report import write_report

        return write_report(self, path, title, intervals)

    def to_vllm_bench(self, path=None, percentiles=(99,), percentile_metrics=None, slo=None,
                      label: str | None = None) -> dict:
        """The run as ``vllm bench serve --save-result`` would save it (keys ``completed``,
        ``mean_ttft_ms``, ``p99_itl_ms``, ...; see
        :func:`simsched.analysis.export.vllm_bench_result`); written as JSON to ``path`` if
        given."""
        from simsched.analysis.export import (VLLM_PERCENTILE_METRICS, vllm_bench_result,
                                              write_json)

        result = vllm_bench_result(self, percentiles,
                                   percentile_metrics or VLLM_PERCENTILE_METRICS, slo, label)
        if path is not None:
            write_json(result, path)
        return result


# A number in a rejection reason (token and block counts, replica indices, rates such as 2.5 or
# 1e+03): what varies between reasons of one kind.
_NUMBER = r"\d+(?:\.\d+)?(?:e[+-]?\d+)?"


def rejection_note(requests: pd.DataFrame, hint: bool = False) -> str | None:
    """One line saying how many requests were rejected and the most common reason, or None.

    Reasons carry each request's own numbers; those of one kind (the same words) are counted
    together and the kind is shown with the range of each number over its requests, e.g.
    ``prompt + output = 4147 to 40166 tokens exceeds max_model_len 4096``. With ``hint`` (the
    requests came from a workload config) a context-length rejection adds how to fit such
    requests.
    """
    if "reject_reason" not in requests.columns:
        return None
    rejected = requests["status"] == Status.REJECTED.value
    num = int(rejected.sum())
    if not num:
        return None
    reasons = requests.loc[rejected, "reject_reason"].astype(str)
    kind = reasons.str.replace(_NUMBER, "\0", regex=True)
    counts = kind.value_counts()
    top, num_top = counts.index[0], int(counts.iloc[0])
    # Every reason of a kind has as many numbers as the kind has slots.
    numbers = pd.DataFrame(reasons[kind == top].str.findall(_NUMBER).tolist())
    parts = top.split("\0")
    text = parts[0]
    for slot, words in zip(numbers.columns, parts[1:]):
        texts = numbers[slot]
        values = texts.astype(float).to_numpy()
        lo, hi = texts.iloc[int(values.argmin())], texts.iloc[int(values.argmax())]
        text += (lo if values.min() == values.max() else f"{lo} to {hi}") + words
    hint = (" (set long_prompt_policy='clip' or 'drop' to fit such requests)"
            if hint and "max_model_len" in top else "")
    others = f"; {num - num_top:,} for other reasons" if num > num_top else ""
    return (f"{num:,} of {len(requests):,} requests rejected; most common reason "
            f"({num_top:,} of them): {text}{hint}{others}")


def _percentiles(values: np.ndarray, overwrite: bool = False) -> list[float]:
    """``np.percentile`` at PERCENTILES; ``overwrite``: ``values`` is a scratch copy numpy may
    reorder (the same figures, without numpy's own copy)."""
    if not len(values):
        return [math.nan] * len(PERCENTILES)
    return [float(v) for v in np.percentile(values, PERCENTILES, overwrite_input=overwrite)]
