"""Results of a run: tidy DataFrames built once from buffered rows, and their summaries.

Metric definitions follow ``vllm bench serve``: TTFT = first token - arrival; E2EL = finish -
arrival; TPOT = (E2EL - TTFT) / (output tokens - 1); ITL = every gap between consecutive output
tokens, pooled over all tokens of all requests for percentiles.

Per-token gaps are never stored one Python object per token: a decode run of a request emits one
token per decode step, so its gaps are differences of the step end times, rebuilt here with numpy.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from simsched.request import Status

PERCENTILES = (50, 90, 95, 99)
ITERATION_COLUMNS = ("started_at", "duration", "num_prefill_tokens", "num_decode_tokens",
                     "num_seqs", "num_waiting", "kv_blocks_used", "num_preempted", "swap_time")


def weighted_percentiles(values: np.ndarray, weights: np.ndarray, qs) -> list[float]:
    """Percentiles (0-100) of ``values`` repeated ``weights`` times, without materialising them.

    Uses the 'lower' rule on the expanded sample (the smallest value whose cumulative count
    reaches the rank), which matches ``numpy.percentile(..., method="inverted_cdf")``.
    """
    mask = weights > 0
    values, weights = values[mask], weights[mask]
    if not len(values):
        return [math.nan for _ in qs]
    order = np.argsort(values, kind="stable")
    values, cum = values[order], np.cumsum(weights[order])
    total = cum[-1]
    out = []
    for q in qs:
        rank = max(1, math.ceil(q / 100 * total))
        out.append(float(values[np.searchsorted(cum, rank)]))
    return out


class ItlSamples:
    """All inter-token gaps of a run, held as (step gap, count) pairs plus irregular gaps."""

    def __init__(self, step_gaps: np.ndarray, step_counts: np.ndarray, other: np.ndarray) -> None:
        self.step_gaps = step_gaps
        self.step_counts = step_counts
        self.other = other

    def __len__(self) -> int:
        return int(self.step_counts.sum()) + len(self.other)

    def array(self) -> np.ndarray:
        """Every gap as one float array (order: regular gaps by step, then irregular gaps)."""
        return np.concatenate([np.repeat(self.step_gaps, self.step_counts), self.other])

    def mean(self) -> float:
        """Mean gap."""
        n = len(self)
        if not n:
            return math.nan
        return float((self.step_gaps @ self.step_counts + self.other.sum()) / n)

    def percentiles(self, qs) -> list[float]:
        """Pooled percentiles of every gap."""
        values = np.concatenate([self.step_gaps, self.other])
        weights = np.concatenate([self.step_counts, np.ones(len(self.other), dtype=np.int64)])
        return weighted_percentiles(values, weights, qs)


def build_requests_frame(requests, step_end_at: np.ndarray) -> tuple[pd.DataFrame, ItlSamples,
                                                                     pd.DataFrame]:
    """One row per request, the pooled ITL samples and one row per preemption cause."""
    n_steps = len(step_end_at)
    step_gap = np.zeros(n_steps)
    if n_steps > 2:
        step_gap[2:] = np.diff(step_end_at[1:])
    delta = np.zeros(n_steps + 1, dtype=np.int64)
    other: list[float] = []
    cols: dict[str, list] = {k: [] for k in (
        "request_id", "arrival_at", "first_scheduled_at", "first_token_at", "finished_at",
        "num_prompt_tokens", "num_output_tokens", "num_generated_tokens", "priority", "tenant",
        "itl_max", "num_preemptions", "num_recomputed_tokens", "num_swaps", "status",
        "reject_reason")}
    causes: list[tuple] = []
    for req in requests:
        itl_max = -math.inf
        for prev_at, a, b in req.runs:
            first_gap = step_end_at[a] - prev_at
            other.append(first_gap)
            itl_max = max(itl_max, first_gap)
            if b > a:
                delta[a + 1] += 1
                delta[b + 1] -= 1
                itl_max = max(itl_max, step_gap[a + 1:b + 1].max())
        if req.gaps:
            other.extend(req.gaps)
            itl_max = max(itl_max, max(req.gaps))
        for c in req.causes:
            causes.append((c.request_id, c.at, c.reason, c.preempted_by, c.num_lost_tokens, c.mode))
        c = cols
        c["request_id"].append(req.id)
        c["arrival_at"].append(req.arrival_at)
        c["first_scheduled_at"].append(req.first_scheduled_at)
        c["first_token_at"].append(req.first_token_at)
        c["finished_at"].append(req.finished_at)
        c["num_prompt_tokens"].append(req.num_prompt_tokens)
        c["num_output_tokens"].append(req.num_output_tokens)
        c["num_generated_tokens"].append(req.num_generated)
        c["priority"].append(req.priority)
        c["tenant"].append(req.tenant)
        c["itl_max"].append(itl_max if itl_max > -math.inf else math.nan)
        c["num_preemptions"].append(req.num_preemptions)
        c["num_recomputed_tokens"].append(req.num_recomputed_tokens)
        c["num_swaps"].append(req.num_swaps)
        c["status"].append(req.status.value)
        c["reject_reason"].append(req.reject_reason)
    df = pd.DataFrame(cols)
    df["ttft"] = df["first_token_at"] - df["arrival_at"]
    df["e2el"] = df["finished_at"] - df["arrival_at"]
    df["queue_time"] = df["first_scheduled_at"] - df["arrival_at"]
    multi = df["num_output_tokens"] > 1
    df["tpot"] = np.where(multi, (df["e2el"] - df["ttft"]) / (df["num_output_tokens"] - 1).clip(1),
                          np.nan)
    df["itl_mean"] = df["tpot"]
    counts = np.cumsum(delta)[:n_steps]
    itl = ItlSamples(step_gap, counts, np.asarray(other, dtype=float))
    cause_df = pd.DataFrame(causes, columns=["request_id", "at", "reason", "preempted_by",
                                             "num_lost_tokens", "mode"])
    return df, itl, cause_df


class Results:
    """What a run produced: per-request and per-iteration frames, ITL samples and a summary."""

    def __init__(self, requests: pd.DataFrame, iterations: pd.DataFrame, itl: ItlSamples,
                 preemptions: pd.DataFrame, config=None, sim_time: float = math.nan,
                 info: dict | None = None) -> None:
        self.requests = requests
        self.iterations = iterations
        self.preemptions = preemptions
        self.config = config
        self.sim_time = sim_time
        self.info = info or {}
        self._itl = itl

    def itl_samples(self) -> np.ndarray:
        """Every inter-token gap of every request, as a float array (seconds)."""
        return self._itl.array()

    def summary(self) -> dict:
        """Mean, median, p90, p95, p99 of TTFT, TPOT, ITL and E2EL; throughput; counts."""
        df = self.requests
        done = df[df["status"] == Status.FINISHED.value]
        out: dict = {"num_requests": len(df), "num_finished": len(done),
                     "num_rejected": int((df["status"] == Status.REJECTED.value).sum()),
                     "num_unfinished": int(df["status"].isin(
                         [Status.WAITING.value, Status.RUNNING.value, Status.SWAPPED.value,
                          Status.PENDING.value]).sum())}
        for name in ("ttft", "tpot", "e2el", "queue_time"):
            values = (df[name] if name in ("ttft", "queue_time") else done[name]).dropna()
            values = values.to_numpy()
            out[f"{name}_mean"] = float(values.mean()) if len(values) else math.nan
            for q, v in zip(PERCENTILES, _percentiles(values)):
                out[f"{name}_p{q}" if q != 50 else f"{name}_median"] = v
        out["itl_mean"] = self._itl.mean()
        for q, v in zip(PERCENTILES, self._itl.percentiles(PERCENTILES)):
            out[f"itl_p{q}" if q != 50 else "itl_median"] = v
        out["itl_max"] = float(df["itl_max"].max()) if len(df) else math.nan
        span = (done["finished_at"].max() - df["arrival_at"].min()) if len(done) else math.nan
        out["duration"] = float(span)
        out["request_throughput"] = len(done) / span if span and span > 0 else math.nan
        out["output_throughput"] = (float(done["num_output_tokens"].sum()) / span
                                    if span and span > 0 else math.nan)
        out["num_preemptions"] = int(df["num_preemptions"].sum())
        out["num_recomputed_tokens"] = int(df["num_recomputed_tokens"].sum())
        it = self.iterations
        out["num_iterations"] = len(it)
        if len(it) and self.info.get("num_blocks"):
            busy = it["duration"].to_numpy()
            out["kv_usage_mean"] = float((it["kv_blocks_used"].to_numpy() * busy).sum()
                                         / busy.sum() / self.info["num_blocks"])
        return out

    def summary_frame(self) -> pd.DataFrame:
        """The summary as a one-row DataFrame."""
        return pd.DataFrame([self.summary()])

    def to_csv(self, directory, prefix: str = "") -> None:
        """Write requests, iterations and preemptions frames as CSV files into ``directory``."""
        from pathlib import Path

        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        self.requests.to_csv(path / f"{prefix}requests.csv", index=False)
        self.iterations.to_csv(path / f"{prefix}iterations.csv", index=False)
        self.preemptions.to_csv(path / f"{prefix}preemptions.csv", index=False)


def _percentiles(values: np.ndarray) -> list[float]:
    if not len(values):
        return [math.nan] * len(PERCENTILES)
    return [float(v) for v in np.percentile(values, PERCENTILES)]


def build_iterations_frame(rows: list[tuple]) -> pd.DataFrame:
    """One row per GPU iteration."""
    df = pd.DataFrame.from_records(rows, columns=list(ITERATION_COLUMNS))
    if not len(df):
        df = df.astype({c: float for c in ITERATION_COLUMNS})
    return df
