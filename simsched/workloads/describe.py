"""Summary statistics of a request table (count, rate, burstiness, length percentiles)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from simsched.workloads import arrivals


class WorkloadDescription(dict):
    """Summary statistics of a request table; prints as a small table."""

    def __str__(self) -> str:
        head = (f"{self['num_requests']} requests over {self['duration']:.1f} s: "
                f"{self['rate']:.3f} req/s, inter-arrival CV {self['interarrival_cv']:.2f}")
        if "num_sessions" in self:
            head = (f"{self['num_requests']} requests in {self['num_sessions']} closed-loop "
                    f"sessions starting over {self['duration']:.1f} s: {self['rate']:.3f} "
                    f"sessions/s, inter-arrival CV {self['interarrival_cv']:.2f}")
        stats = ("mean", "p50", "p90", "p99", "max")
        rows = [f"{'tokens':<8}" + "".join(f"{s:>9}" for s in stats)]
        for what in ("prompt", "output"):
            rows.append(f"{what:<8}" + "".join(f"{self[f'{what}_{s}']:>9.0f}" for s in stats))
        if self.get("num_tenants", 0) > 1 or self.get("num_priorities", 1) > 1:
            rows.append(f"tenants {self['num_tenants']}, priorities {self['num_priorities']}")
        return "\n".join([head] + rows)

    def to_frame(self) -> pd.DataFrame:
        """The prompt and output length statistics as a two-row DataFrame."""
        stats = ("mean", "p50", "p90", "p99", "max")
        return pd.DataFrame({s: [self[f"prompt_{s}"], self[f"output_{s}"]] for s in stats},
                            index=["prompt", "output"])


def describe(requests: pd.DataFrame) -> WorkloadDescription:
    """Count, duration, mean rate, inter-arrival CV and length percentiles of a request table.

    ``duration`` is last minus first arrival, ``rate`` one over the mean gap, and the CV is the
    gaps' standard deviation over their mean (1 for Poisson, >1 for bursty traffic). For
    closed-loop sessions (``session_id`` and ``think_time`` columns) these describe the sessions'
    starts, and ``num_sessions`` is added.
    """
    closed = "session_id" in requests.columns and "think_time" in requests.columns
    starts = requests.drop_duplicates("session_id") if closed else requests
    times = np.sort(starts["arrival_at"].to_numpy(dtype=float))
    gaps = np.diff(times)
    out = WorkloadDescription(
        num_requests=len(requests),
        duration=float(times[-1] - times[0]) if len(times) else 0.0,
        rate=arrivals.recorded_rate(times),
        interarrival_cv=float(gaps.std() / gaps.mean()) if len(gaps) and gaps.mean() > 0
        else math.nan)
    for what in ("prompt", "output"):
        v = requests[f"num_{what}_tokens"].to_numpy(dtype=float)
        empty = len(v) == 0
        out[f"{what}_mean"] = math.nan if empty else float(v.mean())
        for q in (50, 90, 99):
            out[f"{what}_p{q}"] = math.nan if empty else float(np.percentile(v, q))
        out[f"{what}_max"] = math.nan if empty else float(v.max())
    if "tenant" in requests.columns:
        out["num_tenants"] = int(requests["tenant"].dropna().nunique())
    if "priority" in requests.columns:
        out["num_priorities"] = int(requests["priority"].nunique())
    if closed:
        out["num_sessions"] = len(starts)
    return out

