"""Student's t distribution without SciPy: its CDF (regularised incomplete beta function by
continued fraction) and quantiles (by bisection), for intervals over seeds; prediction
intervals of one more draw (ensembles of calibrated coefficient sets)."""

from __future__ import annotations

import math

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


def prediction_intervals(runs: pd.DataFrame, confidence: float = 0.9,
                         relative_sd: dict | None = None, skip=("seed", "draw")) -> pd.DataFrame:
    """Where one more draw of each numeric column of ``runs`` would fall: the mean and the
    Student-t prediction interval ``mean +- t sqrt(s^2 (1 + 1/n) + (r mean)^2)``, with ``r`` a
    column's relative scatter not in the draws (``relative_sd``: column -> r, e.g. what a
    calibration leaves unexplained; 0 for the others). One row per column: ``metric``,
    ``mean``, ``std``, ``low``, ``high``, ``num_draws``, ``confidence``."""
    relative_sd = relative_sd or {}
    rows = []
    for col in runs.columns:
        if col in skip or not pd.api.types.is_numeric_dtype(runs[col]) \
                or pd.api.types.is_bool_dtype(runs[col]):
            continue
        values = runs[col].to_numpy(dtype=float)
        values = values[np.isfinite(values)]
        n = len(values)
        mean = float(values.mean()) if n else math.nan
        std = float(values.std(ddof=1)) if n > 1 else 0.0
        extra = relative_sd.get(col, 0.0) * abs(mean) if n else math.nan
        spread = math.sqrt(std * std * (1 + 1 / n) + extra * extra) if n else math.nan
        half = t_quantile(0.5 + confidence / 2, max(n - 1, 1)) * spread if n else math.nan
        rows.append({"metric": col, "mean": mean, "std": std, "low": mean - half,
                     "high": mean + half, "num_draws": n, "confidence": confidence})
    return pd.DataFrame(rows)
