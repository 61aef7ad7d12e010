"""The same config over several seeds: each summary metric's mean and Student-t interval.

Two seeds of one config can differ by more than the effect being compared, so a single run's
figure says little on its own. :func:`replicate` runs a config once per seed and returns the
per-seed summaries and, per metric, the mean, the sample standard deviation and the two-sided
t-interval of the mean at the chosen confidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularised incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((a + m2 - 1) * (a + m2)),
                    -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    ln = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x)
          + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(ln) * _betacf(a, b, x) / a
    return 1.0 - math.exp(ln) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Student's t distribution's CDF at ``t`` with ``df`` degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile (the inverse of :func:`t_cdf`), by bisection to 1e-12."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class Replicates:
    """What :func:`replicate` returns: ``runs`` (one row per seed: ``seed`` and every summary
    metric) and ``intervals`` (one row per numeric metric: ``metric``, ``mean``, ``std``,
    ``ci_low``, ``ci_high``, ``num_seeds``, ``confidence``); ``first`` is the first seed's
    :class:`~simsched.analysis.metrics.Results` (its frames, for plots and reports)."""

    runs: pd.DataFrame
    intervals: pd.DataFrame
    confidence: float
    first: object = None

    def interval(self, metric: str) -> tuple[float, float, float]:
        """(mean, low, high) of one metric."""
        rows = self.intervals[self.intervals["metric"] == metric]
        if not len(rows):
            raise KeyError(f"no metric {metric!r}; known: {sorted(self.intervals['metric'])}")
        row = rows.iloc[0]
        return float(row["mean"]), float(row["ci_low"]), float(row["ci_high"])


def intervals_of(runs: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """Mean, sample std and t-interval of the mean of each numeric column of ``runs``."""
    rows = []
    numeric = [c for c in runs.columns if c != "seed" and pd.api.types.is_numeric_dtype(runs[c])
               and not pd.api.types.is_bool_dtype(runs[c])]
    for col in numeric:
        values = runs[col].to_numpy(dtype=float)
        values = values[np.isfinite(values)]
        n = len(values)
        mean = float(values.mean()) if n else math.nan
        std = float(values.std(ddof=1)) if n > 1 else math.nan
        half = t_quantile(0.5 + confidence / 2, n - 1) * std / math.sqrt(n) if n > 1 else math.nan
        rows.append({"metric": col, "mean": mean, "std": std, "ci_low": mean - half,
                     "ci_high": mean + half, "num_seeds": n, "confidence": confidence})
    return pd.DataFrame(rows)


def replicate(config, seeds=5, confidence: float = 0.95, requests=None, **simulate_options):
    """Run ``config`` once per seed and return :class:`Replicates`.

    ``seeds`` is a count (seeds ``config.seed``, ``config.seed + 1``, ...) or a list of seeds;
    at least two are needed for an interval. ``confidence`` is the interval's two-sided level.
    Other keyword arguments go to :func:`~simsched.analysis.runner.simulate`.
    """
    from simsched.analysis.runner import simulate

    if isinstance(seeds, bool):
        raise ValueError(f"seeds must be a count or a list of seeds, got {seeds!r}")
    if isinstance(seeds, (int, np.integer)):
        if seeds < 2:
            raise ValueError(f"seeds must be at least 2 for an interval, got {seeds}")
        seeds = [config.seed + k for k in range(int(seeds))]
    seeds = list(seeds)
    if len(seeds) < 2 or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must hold at least 2 distinct seeds, got {seeds!r}")
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) \
            or not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    rows, first = [], None
    for seed in seeds:
        res = simulate(config.replace(seed=seed), requests=requests, **simulate_options)
        rows.append({"seed": seed, **res.summary()})
        first = res if first is None else first
    runs = pd.DataFrame(rows)
    return Replicates(runs, intervals_of(runs, confidence), confidence, first)
