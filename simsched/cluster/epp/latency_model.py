"""The online latency model behind llm-d's ``predicted-latency-producer``.

llm-d trains gradient-boosted trees (XGBoost) in a sidecar on the run's own observations; simsched
fits a ridge regression instead, on the same features, refitted from the latest observations as
they arrive. It is deterministic (no random draws), so a run's predictions follow from its
observations alone. Parameters (the router option ``latency_model``): ``refit_every`` (refit after
this many new observations, 50), ``min_samples`` (no predictions before this many, 50; the
plugins then behave as llm-d's without a model), ``window`` (fit on the latest this many, 5,000)
and ``ridge`` (the L2 penalty on the standardised coefficients, 1.0).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

# The predictor's features (llm-d's PredictionRequest / TrainingEntry), in this order.
FEATURES = ("kv_cache_percentage", "input_token_length", "num_request_waiting",
            "num_request_running", "num_tokens_generated", "prefix_cache_score",
            "prefill_tokens_in_flight")
DEFAULTS = {"refit_every": 50, "min_samples": 50, "window": 5000, "ridge": 1.0}


def model_options(options: Mapping | None) -> dict:
    """The ``latency_model`` router option with its defaults; bad values are refused naming
    them."""
    out = dict(DEFAULTS)
    if options is None:
        return out
    if not isinstance(options, Mapping):
        raise ValueError(f"latency_model must be a mapping of {sorted(DEFAULTS)}, got "
                         f"{options!r}")
    for k, v in options.items():
        if k not in DEFAULTS:
            raise ValueError(f"latency_model: unknown option {k!r}; known: {sorted(DEFAULTS)}")
        if k == "ridge":
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1e300:
                raise ValueError(f"latency_model.ridge must be a number >= 0, got {v!r}")
            out[k] = float(v)
        else:
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"latency_model.{k} must be an integer >= 1, got {v!r}")
            out[k] = v
    return out


class LatencyModel:
    """Ridge regression of one latency (ms) on :data:`FEATURES`, refitted online."""

    def __init__(self, refit_every: int = 50, min_samples: int = 50, window: int = 5000,
                 ridge: float = 1.0) -> None:
        self.refit_every, self.min_samples = refit_every, min_samples
        self.window, self.ridge = window, ridge
        self.xs: list[tuple] = []
        self.ys: list[float] = []
        self.num_observations = 0
        self.num_fits = 0
        self._since = 0
        self.coef = None            # (mean, scale, weights, intercept) once fitted

    def add(self, x: tuple, y: float) -> None:
        """One observation: features ``x`` and the latency ``y`` in ms."""
        self.xs.append(x)
        self.ys.append(y)
        if len(self.xs) >= 2 * self.window:
            # Keep the latest window, trimming a window's worth at once (amortised O(1)).
            del self.xs[:-self.window], self.ys[:-self.window]
        self.num_observations += 1
        self._since += 1
        if min(len(self.xs), self.window) >= self.min_samples and (self.coef is None
                                                  or self._since >= self.refit_every):
            self.fit()

    def fit(self) -> None:
        """Refit on the kept observations: standardised features, intercept unpenalised."""
        x = np.asarray(self.xs[-self.window:], dtype=float)
        y = np.asarray(self.ys[-self.window:], dtype=float)
        mean = x.mean(axis=0)
        scale = x.std(axis=0)
        scale[scale == 0.0] = 1.0         # a constant feature carries no weight
        z = (x - mean) / scale
        y0 = y.mean()
        gram = z.T @ z + self.ridge * np.eye(z.shape[1])
        w = np.linalg.solve(gram, z.T @ (y - y0))
        self.coef = (mean, scale, w, y0)
        self.num_fits += 1
        self._since = 0

    @property
    def ready(self) -> bool:
        """Whether the model predicts (it has been fitted)."""
        return self.coef is not None

    def predict(self, rows) -> list[float]:
        """Predicted latencies (ms, at least 0) of feature ``rows``."""
        mean, scale, w, y0 = self.coef
        z = (np.asarray(rows, dtype=float) - mean) / scale
        return np.maximum(z @ w + y0, 0.0).tolist()
