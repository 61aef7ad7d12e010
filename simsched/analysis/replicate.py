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

from simsched.analysis.stats import (prediction_intervals, t_cdf,  # noqa: F401
                                     t_quantile)  # (re-exported)


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

