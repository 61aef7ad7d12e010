"""Inter-token gaps of a run: held as (step gap, count) pairs plus irregular gaps, and their
pooled percentiles (numpy's default linear interpolation, as ``np.percentile`` and vLLM use),
without one Python object or array entry per token."""

from __future__ import annotations

import math

import numpy as np


def _linear_ranks(q: float, total: int) -> tuple[int, int, float]:
    """The two 0-based order statistics ``np.percentile(x, q)`` interpolates between for a sample
    of ``total`` values, and the weight of the second, computed as numpy computes them."""
    virtual = (total - 1) * (q / 100)
    lo = min(max(math.floor(virtual), 0), total - 1)
    return lo, min(lo + 1, total - 1), virtual - lo


def _lerp(a: float, b: float, t: float) -> float:
    """``a + (b - a) * t`` rounded as numpy's percentile rounds it (from ``b`` when ``t >= 0.5``)."""
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


def weighted_percentiles(values: np.ndarray, weights: np.ndarray, qs) -> list[float]:
    """Percentiles (0-100) of ``values`` repeated ``weights`` times, without materialising them.

    Uses numpy's default rule (linear interpolation between the two nearest order statistics of
    the expanded sample): equal to ``numpy.percentile(numpy.repeat(values, weights), qs)``.
    """
    mask = weights > 0
    if not mask.all():
        values, weights = values[mask], weights[mask]
    del mask
    if not len(values):
        return [math.nan for _ in qs]
    order = np.argsort(values, kind="stable")
    values = values[order]
    cum = weights[order].astype(np.int64, copy=False)    # counts may be int32: no overflow
    del order, weights
    np.cumsum(cum, out=cum)
    total = int(cum[-1])
    out = []
    for q in qs:
        lo, hi, t = _linear_ranks(q, total)
        # The k-th (0-based) value is the first whose cumulative count exceeds k.
        a, b = (float(values[np.searchsorted(cum, k + 1)]) for k in (lo, hi))
        out.append(_lerp(a, b, t))
    return out


class ItlSamples:
    """All inter-token gaps of a run, held as (step gap, count) pairs plus irregular gaps."""

    def __init__(self, step_gaps: np.ndarray, step_counts: np.ndarray, other: np.ndarray,
                 other_owner: np.ndarray | None = None) -> None:
        self.step_gaps = step_gaps
        self.step_counts = step_counts
        self.other = other
        # The request (row of the request frame) each irregular gap belongs to, where known:
        # exporters that place gaps in time (simsched.analysis.openmetrics) read it.
        self.other_owner = other_owner

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
        gaps, counts, other = self.step_gaps, self.step_counts, self.other
        small = len(gaps) + len(other) < BISECT_ABOVE
        if small or not (len(gaps) or len(other)) or not (
                np.isfinite(gaps).all() and np.isfinite(other).all()
                and not np.signbit(gaps).any() and not np.signbit(other).any()):
            values = np.concatenate([gaps, other])
            weights = np.concatenate([counts, np.ones(len(other), dtype=np.int64)])
            return weighted_percentiles(values, weights, qs)
        # A big run: the same rule, each order statistic found by bisection over the values' bit
        # patterns (ordered as the values are, for finite values >= 0), so nothing the size of
        # the samples is joined or sorted.
        total = int(counts.sum()) + len(other)
        if not total:
            return [math.nan for _ in qs]

        def count_at_most(bits: int) -> int:
            v = np.int64(bits).view(np.float64)
            return int(np.sum(counts, where=gaps <= v)) + int(np.count_nonzero(other <= v))

        top = max(gaps.max() if len(gaps) else 0.0, other.max() if len(other) else 0.0)
        lo_all, hi_all = 0, int(np.float64(top).view(np.int64))

        def kth(k: int) -> tuple[float, int]:
            """The k-th (0-based) gap and how many gaps are <= it."""
            lo, hi = lo_all, hi_all              # smallest bits whose count exceeds k
            while lo < hi:
                mid = (lo + hi) // 2
                if count_at_most(mid) > k:
                    hi = mid
                else:
                    lo = mid + 1
            return float(np.int64(lo).view(np.float64)), count_at_most(lo)

        def next_above(v: float) -> float:
            """The smallest gap above ``v`` (the next order statistic after a run of ``v``)."""
            return float(min(np.min(gaps, where=(gaps > v) & (counts > 0), initial=np.inf),
                             np.min(other, where=other > v, initial=np.inf)))

        out = []
        for q in qs:
            lo, hi, t = _linear_ranks(q, total)
            a, upto = kth(lo)
            b = a if hi < upto else next_above(a)
            out.append(_lerp(a, b, t))
        return out


# ITL samples above this many values get percentiles by bisection (no joined, sorted copy).
BISECT_ABOVE = 1_000_000
