"""Fit the deployment terms to measured runs: regularised Gauss-Newton on simulated metrics.

The six terms of :mod:`simsched.cost.deployment` (GEMM, attention and communication scales, host
time per step and per sequence, output delay) start at the shipped model and get a normal prior
there (:data:`PRIOR_SIGMA`, in the fit's coordinates: log for the scales, seconds for the
times). Each measured run is replayed (:mod:`simsched.fit.replay`) and its log metrics compared
with the measured ones, each divided by the metric's expected relative error
(:data:`METRIC_SIGMA`). The fit minimises the sum of squares of those residuals plus the
standardised distance from the prior, by Gauss-Newton with a Levenberg damping: the Jacobian by
forward differences (one simulation per term and run, a step of a quarter prior sigma, the
same seeds: common random numbers), reused while the terms move less than one prior sigma and
recomputed once beyond. Everything is seeded: the same runs give the same profile.

The posterior is the Laplace approximation there: covariance ``(J'WJ + P)^-1`` with ``W`` the
metrics' error variances re-estimated from the residuals (shrunk toward :data:`METRIC_SIGMA`
with two pseudo-runs, so one run keeps the defaults and ten runs are their own), and
``discrepancy``: those per-metric relative errors, what the terms do not explain. One run moves
the terms it informs (the step time a run's E2E fixes) and leaves the rest at the prior.
"""

from __future__ import annotations

import math

import numpy as np

from simsched.cost import deployment, vllm_v1
from simsched.cost.deployment import SPACES, TERMS
from simsched.fit import replay

# Prior standard deviations in the fit's coordinates (log scale, or seconds).
PRIOR_SIGMA = {"gemm_scale": 0.2, "attention_scale": 0.3, "comm_scale": 0.4,
               "step_time": 1.5e-3, "seq_time": 20e-6, "output_delay": 10e-3}
# Expected relative (log) error of each metric, run to run, before the data say otherwise: about
# what the shipped model leaves unexplained on the 17 bundled vLLM 0.15 runs once the terms are
# fitted to all of them (TTFT 15-20 %, E2E 5-7 %; experiments.calibrate_loo's all-runs fit).
METRIC_SIGMA = {"ttft_mean": 0.15, "ttft_p90": 0.18, "ttft_p99": 0.25, "e2el_mean": 0.05,
                "e2el_p90": 0.06, "e2el_p99": 0.1, "tpot_mean": 0.05, "itl_mean": 0.05}
PSEUDO_RUNS = 2.0           # weight of METRIC_SIGMA when re-estimating the errors
STEP = 0.25                 # finite-difference step, in prior sigmas
MAX_ITERATIONS = 8


class Fit:
    """The state of one fit: the scenarios, the prior, a cache of simulations."""

    def __init__(self, scenarios, prior: dict | None = None, sigma: dict | None = None,
                 cache: dict | None = None) -> None:
        self.scenarios = list(scenarios)
        if not self.scenarios:
            raise ValueError("calibrate: give at least one measured run")
        self.u0 = deployment.to_coordinates(
            prior or deployment.neutral_terms(vllm_v1.terms()["output_delay"]))
        self.scale = np.array([PRIOR_SIGMA[t] for t in TERMS])
        self.sigma = dict(METRIC_SIGMA, **(sigma or {}))
        self.rows = [(i, m) for i, sc in enumerate(self.scenarios) for m in sc.metrics]
        self.y = np.array([math.log(self.scenarios[i].measured[m]) for i, m in self.rows])
        self.w = np.array([1.0 / self.sigma[m] for _, m in self.rows])
        # (run name, standardised terms) -> simulated metrics; a caller fitting several subsets
        # of the same runs (leave one out) passes one cache to all.
        self.cache: dict = {} if cache is None else cache
        self.num_simulations = 0

    def terms(self, z) -> dict:
        return deployment.from_coordinates(self.u0 + self.scale * np.asarray(z, float))

    def simulated(self, i: int, z) -> dict:
        key = (self.scenarios[i].name, tuple(np.round(np.asarray(z, float), 12)))
        if key not in self.cache:
            self.cache[key] = self.scenarios[i].simulate(self.terms(z))
            self.num_simulations += 1
        return self.cache[key]

    def logs(self, z, runs=None) -> np.ndarray:
        """Simulated log metrics (rows of :attr:`rows`; ``runs``: only those runs' rows)."""
        out = np.full(len(self.rows), np.nan)
        for k, (i, m) in enumerate(self.rows):
            if runs is None or i in runs:
                v = self.simulated(i, z)[m]
                out[k] = math.log(v) if v > 0 else np.nan
        return out

    def jacobian(self, z) -> np.ndarray:
        """d(simulated log metric)/dz by forward differences (one simulation per term)."""
        z = np.asarray(z, float)
        base = self.logs(z)
        cols = []
        for j in range(len(TERMS)):
            dz = z.copy()
            dz[j] += STEP
            cols.append((self.logs(dz) - base) / STEP)
        return np.column_stack(cols)


def _objective(fit: Fit, z) -> float:
    r = (fit.logs(z) - fit.y) * fit.w
    return float(np.nansum(r * r) + z @ z)


def solve(fit: Fit, z0=None) -> tuple[np.ndarray, np.ndarray]:
    """The regularised Gauss-Newton fit: (z, Jacobian at the last linearisation)."""
    z = np.zeros(len(TERMS)) if z0 is None else np.asarray(z0, float)
    at, jac = z.copy(), fit.jacobian(z)
    lam, phi = 1e-3, _objective(fit, z)
    relinearised = False
    for _ in range(MAX_ITERATIONS):
        r = (fit.logs(z) - fit.y) * fit.w
        ok = np.isfinite(r) & np.isfinite(jac).all(axis=1)
        jw = jac[ok] * fit.w[ok, None]
        a = jw.T @ jw + np.eye(len(z))
        g = jw.T @ r[ok] + z
        step = np.linalg.solve(a + lam * np.diag(np.diag(a)), -g)
        new = z + step
        new_phi = _objective(fit, new)
        if new_phi < phi:
            z, phi, lam = new, new_phi, max(lam / 10, 1e-6)
            if np.abs(step).max() < 0.02:
                if not relinearised and np.abs(z - at).max() > 1.0:
                    at, jac, relinearised = z.copy(), fit.jacobian(z), True
                    continue
                break
        else:
            lam *= 10
            if lam > 1e4:
                break
    if not relinearised and np.abs(z - at).max() > 1.0:
        jac = fit.jacobian(z)
    return z, jac


def posterior(fit: Fit, z, jac) -> tuple[np.ndarray, dict, np.ndarray]:
    """(covariance in the fit's coordinates, per-metric discrepancy, residuals) at ``z``."""
    resid = fit.logs(z) - fit.y
    disc = {}
    for m in dict.fromkeys(m for _, m in fit.rows):
        r = np.array([resid[k] for k, (_, mm) in enumerate(fit.rows) if mm == m])
        r = r[np.isfinite(r)]
        disc[m] = math.sqrt((float(r @ r) + PSEUDO_RUNS * fit.sigma[m] ** 2)
                            / (len(r) + PSEUDO_RUNS))
    w = np.array([1.0 / disc[m] for _, m in fit.rows])
    ok = np.isfinite(resid) & np.isfinite(jac).all(axis=1)
    jw = jac[ok] * w[ok, None]
    cov_z = np.linalg.inv(jw.T @ jw + np.eye(len(z)))
    cov = cov_z * np.outer(fit.scale, fit.scale)
    return (cov + cov.T) / 2, disc, resid


def interval_of(center: np.ndarray, cov: np.ndarray, j: int, level: float = 0.9):
    """The ``level`` interval of term ``j`` (normal in the fit's coordinates)."""
    half = _z_of(level) * math.sqrt(max(cov[j, j], 0.0))
    lo, hi = center[j] - half, center[j] + half
    if SPACES[TERMS[j]] == "log":
        return math.exp(lo), math.exp(hi)
    return lo, hi


def _z_of(level: float) -> float:
    """Two-sided standard-normal quantile (bisection on erf: no scipy)."""
    lo, hi = 0.0, 10.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if math.erf(mid / math.sqrt(2)) < level:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def fit_scenarios(scenarios, prior: dict | None = None, sigma: dict | None = None,
                  cache: dict | None = None) -> dict:
    """Fit the terms to ``scenarios``: the fitted terms, center, covariance, discrepancy, the
    measured, shipped and fitted metrics of every run, and the number of simulations."""
    fit = Fit([replay.scenario(s) for s in scenarios], prior, sigma, cache)
    names = [sc.name for sc in fit.scenarios]
    if len(set(names)) != len(names):
        raise ValueError(f"calibrate: two runs are named {next(n for n in names if names.count(n) > 1)!r}")
    z, jac = solve(fit)
    cov, disc, resid = posterior(fit, z, jac)
    center = fit.u0 + fit.scale * z
    before = fit.logs(np.zeros(len(TERMS)))
    rows = [{"run": fit.scenarios[i].name, "metric": m,
             "measured": float(math.exp(fit.y[k])),
             "shipped": float(math.exp(before[k])) if np.isfinite(before[k]) else math.nan,
             "calibrated": float(math.exp(fit.y[k] + resid[k]))
             if np.isfinite(resid[k]) else math.nan}
            for k, (i, m) in enumerate(fit.rows)]
    return {"terms": deployment.from_coordinates(center), "center": center.tolist(),
            "covariance": cov.tolist(), "discrepancy": disc, "residuals": rows,
            "prior": {"center": fit.u0.tolist(), "sigma": fit.scale.tolist()},
            "num_simulations": fit.num_simulations, "fit": fit}
