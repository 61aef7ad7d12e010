"""Inter-token gaps of a run: held as (step gap, count) pairs plus irregular gaps, and their
pooled percentiles (the 'lower' rule), without one Python object or array entry per token."""

from __future__ import annotations

import math

import numpy as np


def weighted_percentiles(values: np.ndarray, weights: np.ndarray, qs) -> list[float]:
    """Percentiles (0-100) of ``values`` repeated ``weights`` times, without materialising them.

    Uses the 'lower' rule on the expanded sample (the smallest value whose cumulative count
    reaches the rank), which matches ``numpy.percentile(..., method="inverted_cdf")``.
    """
    mask = weights > 0
    if not mask.all():
        values, weights = values[mask], weights[mask]
    del mask
    if not len(values):
        return [math.nan for _ in qs]
    order = np.argsort(values, kind="stable")
    values = values[order]
    cum = weights[order]
    del order, weights
    np.cumsum(cum, out=cum)
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
        gaps, counts, other = self.step_gaps, self.step_counts, self.other
        small = len(gaps) + len(other) < BISECT_ABOVE
        if small or not (len(gaps) or len(other)) or not (
                np.isfinite(gaps).all() and np.isfinite(other).all()
                and not np.signbit(gaps).any() and not np.signbit(other).any()):
            values = np.concatenate([gaps, other])
            weights = np.concatenate([counts, np.ones(len(other), dtype=np.int64)])
            return weighted_percentiles(values, weights, qs)
        # A big run: the same 'lower' rule (the smallest gap whose count of gaps <= it reaches
        # the rank) by bisection over the values' bit patterns (ordered as the values are, for
        # finite values >= 0), so nothing the size of the samples is joined or sorted.
        total = int(counts.sum()) + len(other)
        if not total:
            return [math.nan for _ in qs]

        def count_at_most(bits: int) -> int:
            v = np.int64(bits).view(np.float64)
            return int(np.sum(counts, where=gaps <= v)) + int(np.count_nonzero(other <= v))

        top = max(gaps.max() if len(gaps) else 0.0, other.max() if len(other) else 0.0)
        lo_all, hi_all = 0, int(np.float64(top).view(np.int64))
        out = []
        for q in qs:
            rank = max(1, math.ceil(q / 100 * total))
            lo, hi = lo_all, hi_all              # smallest bits whose count reaches rank
            while lo < hi:
                mid = (lo + hi) // 2
                if count_at_most(mid) >= rank:
                    hi = mid
                else:
                    lo = mid + 1
            out.append(float(np.int64(lo).view(np.float64)))
        return out


# ITL samples above this many values get percentiles by bisection (no joined, sorted copy).
BISECT_ABOVE = 1_000_000
