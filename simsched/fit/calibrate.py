"""Fit the deployment terms to measured runs: regularised Gauss-Newton on simulated metrics.

The six terms of :mod:`simsched.cost.deployment` (GEMM, attention and communication scales, host
time per step and per sequence, output delay) start at the shipped model. Each measured run is
replayed (:mod:`simsched.fit.replay`) and its log metrics compared with the measured ones; a
run's errors are correlated, as large as the shipped model's workload-to-workload misfit and
heavy-tailed (:mod:`simsched.fit.errors`: a multivariate Student t per run), so each run's
residuals are whitened by that covariance. The fit maximises the t likelihood times the prior:
Gauss-Newton on the whitened residuals, each run's rows reweighted by its t weight at the current
terms (iteratively reweighted least squares: a run far off counts less), with a Levenberg
damping; the Jacobian by forward differences (one simulation per
term and run, a step of a quarter prior sigma, the same seeds: common random numbers), reused
while the terms move less than one prior sigma and recomputed once beyond. Everything is
seeded: the same runs give the same profile.

**The prior is a mixture of two normals** at the shipped values (:data:`COMPONENTS`):

* ``validated``: the deployment is like those the shipped model was checked on, each term's
  sigma its :data:`PRIOR_SCALE` share of :data:`PRIOR_SIGMA`;
* ``other``: another GPU, driver, engine build or network: :data:`PRIOR_SIGMA` itself.

The validated sigmas and the components' weights are empirical Bayes over the bundled vLLM 0.15
runs, each (model, GPU) a deployment (``python -m experiments.calibrate_prior``, on the shipped
model's linearisation), integrated over their posterior rather than at its mode: each term's
sigma the root mean square of its posterior (a term those few deployments cannot tell from
fixed keeps the sigma they cannot rule out), the ``other`` weight the posterior mean of the
share of unlike deployments (all of them were validated: about Laplace's rule of succession,
one in eight). Each component is fitted, its evidence (Laplace, with the metrics' errors
re-estimated from its own residuals) weighs it, and the profile is the mixture's mean and covariance
(components' covariances plus their spread). So one run whose errors are the size the
shipped model makes workload to workload moves the terms little (what it measures is mostly its
own workload's misfit, which the next workload does not share), and one run far off (a GPU whose
kernels the shipped model extrapolates) moves them most of the way.

The posterior of each component is the Laplace approximation at its fit: covariance
``(J'WJ + P)^-1`` with ``W`` the t's expected information (the whitened metrics' precision
times (nu + d) / (nu + d + 2) on the t's scale; a run reproduced exactly says no more than
another) with each metric's error
re-estimated from the residuals (shrunk toward :data:`~simsched.fit.errors.METRIC_SIGMA` with
two pseudo-runs, so one run keeps the defaults and ten runs are their own), and
``discrepancy``: those per-metric relative errors, what the terms do not explain.
"""

from __future__ import annotations

import math

import numpy as np

from simsched.cost import deployment, vllm_v1
from simsched.cost.deployment import SPACES, TERMS
from simsched.fit import replay
from simsched.fit.errors import METRIC_SIGMA, log_det, t_log_likelihood, whiten

# The wide prior's standard deviations in the fit's coordinates (log scale, or seconds).
PRIOR_SIGMA = {"gemm_scale": 0.2, "attention_scale": 0.3, "comm_scale": 0.4,
               "step_time": 1.5e-3, "seq_time": 20e-6, "output_delay": 10e-3}
# Empirical Bayes over the bundled runs (experiments.calibrate_prior; see the module docstring),
# integrated over the hyperparameters' posterior: the validated component's sigmas as shares of
# PRIOR_SIGMA, each term its own (root mean square over its posterior), and its weight (one
# minus the posterior mean share of deployments unlike the validated ones). Rounded.
PRIOR_SCALE = {"gemm_scale": 0.17, "attention_scale": 0.18, "comm_scale": 0.34,
               "step_time": 0.14, "seq_time": 0.18, "output_delay": 0.45}
PRIOR_WEIGHT = 0.87
# (name, prior sigma as a share of PRIOR_SIGMA: one or per term, prior weight)
COMPONENTS = (("validated", PRIOR_SCALE, PRIOR_WEIGHT), ("other", 1.0, 1.0 - PRIOR_WEIGHT))
PSEUDO_RUNS = 2.0           # weight of METRIC_SIGMA when re-estimating the errors
STEP = 0.25                 # finite-difference step, in (wide) prior sigmas
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
        self.metrics = [m for _, m in self.rows]
        self.blocks = [[k for k, (i, _) in enumerate(self.rows) if i == run]
                       for run in range(len(self.scenarios))]
        self.y = np.array([math.log(self.scenarios[i].measured[m]) for i, m in self.rows])
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

    def whitened(self, z, jac=None, sigma: dict | None = None, weights: str = "irls"):
        """(residuals, Jacobian) at ``z``, each run's rows whitened by its error covariance and
        weighted for the Student t (:func:`simsched.fit.errors.whiten`): ``irls`` for the
        fit's steps, ``fisher`` for its information."""
        return whiten(self.blocks, self.logs(z) - self.y, jac, self.metrics,
                      sigma or self.sigma, weights)

    def log_likelihood(self, z, sigma: dict | None = None) -> float:
        """The runs' Student-t log likelihood at ``z`` (:mod:`simsched.fit.errors`)."""
        sigma = sigma or self.sigma
        diff = self.logs(z) - self.y
        return (t_log_likelihood(self.blocks, diff, self.metrics, sigma)
                - 0.5 * log_det(self.blocks, diff, self.metrics, sigma))


def _objective(fit: Fit, z, precision) -> float:
    return float(-2 * fit.log_likelihood(z) + z @ (precision * z))


def solve(fit: Fit, precision=None, z0=None) -> tuple[np.ndarray, np.ndarray]:
    """The regularised Gauss-Newton fit under a normal prior of diagonal ``precision`` (in the
    wide prior's standard units; default 1): (z, Jacobian at the last linearisation)."""
    p = np.ones(len(TERMS)) if precision is None else np.asarray(precision, float)
    z = np.zeros(len(TERMS)) if z0 is None else np.asarray(z0, float)
    at, jac = z.copy(), fit.jacobian(z)
    lam, phi = 1e-3, _objective(fit, z, p)
    relinearised = False
    for _ in range(MAX_ITERATIONS):
        r, jw = fit.whitened(z, jac)
        a = jw.T @ jw + np.diag(p)
        g = jw.T @ r + p * z
        step = np.linalg.solve(a + lam * np.diag(np.diag(a)), -g)
        new = z + step
        new_phi = _objective(fit, new, p)
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


def log_evidence(fit: Fit, z, jac, precision) -> float:
    """The Laplace approximation of log p(measured | component) at its fit ``z`` (up to a
    constant shared by the components), with the metrics' errors the component's own
    re-estimated ones (:func:`discrepancy`): the runs' noise level is not known in advance,
    and a component that reproduces them far better than the validated runs' misfit earns
    that."""
    sigma = discrepancy(fit, z)
    _, jw = fit.whitened(z, jac, sigma, "fisher")
    a = jw.T @ jw + np.diag(precision)
    return float(fit.log_likelihood(z, sigma) - 0.5 * z @ (precision * z)
                 - 0.5 * np.linalg.slogdet(a)[1] + 0.5 * np.log(precision).sum())


def discrepancy(fit: Fit, z) -> dict:
    """Each metric's relative error at ``z``, re-estimated from the residuals (shrunk toward
    the prior's with :data:`PSEUDO_RUNS`)."""
    resid = fit.logs(z) - fit.y
    out = {}
    for m in dict.fromkeys(fit.metrics):
        r = np.array([resid[k] for k, mm in enumerate(fit.metrics) if mm == m])
        r = r[np.isfinite(r)]
        out[m] = math.sqrt((float(r @ r) + PSEUDO_RUNS * fit.sigma[m] ** 2)
                           / (len(r) + PSEUDO_RUNS))
    return out


def posterior(fit: Fit, components) -> tuple[np.ndarray, np.ndarray, list]:
    """The mixture posterior over ``components`` (name, z, Jacobian, precision, prior weight):
    (mean and covariance in standard units, [(name, weight, z)] per component). Each
    component's covariance is its Laplace one with the re-estimated errors; the weights are
    the prior weights times the evidence."""
    logw = np.array([math.log(w) + log_evidence(fit, z, jac, p)
                     for _, z, jac, p, w in components])
    weights = np.exp(logw - logw.max())
    weights /= weights.sum()
    zs, covs = [], []
    for _, z, jac, p, _ in components:
        _, jw = fit.whitened(z, jac, discrepancy(fit, z), "fisher")
        covs.append(np.linalg.inv(jw.T @ jw + np.diag(p)))
        zs.append(z)
    mean = sum(w * z for w, z in zip(weights, zs))
    cov = sum(w * (c + np.outer(z - mean, z - mean)) for w, z, c in zip(weights, zs, covs))
    return mean, (cov + cov.T) / 2, [(c[0], float(w), z) for c, w, z in
                                     zip(components, weights, zs)]


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
                  cache: dict | None = None, components=COMPONENTS) -> dict:
    """Fit the terms to ``scenarios``: the fitted terms, center, covariance, discrepancy, the
    measured, shipped and fitted metrics of every run, each prior component's weight and fit,
    and the number of simulations. ``components``: (name, sigma share, weight) of the prior's
    components (default :data:`COMPONENTS`)."""
    fit = Fit([replay.scenario(s) for s in scenarios], prior, sigma, cache)
    names = [sc.name for sc in fit.scenarios]
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"calibrate: two runs are named {twice!r}")
    fitted = []
    for name, share, weight in components:
        share = np.array([share[t] for t in TERMS]) if isinstance(share, dict) else share
        precision = np.full(len(TERMS), 1.0) / np.asarray(share, float) ** 2
        z, jac = solve(fit, precision)
        fitted.append((name, z, jac, precision, weight))
    mean, cov_z, parts = posterior(fit, fitted)
    cov = cov_z * np.outer(fit.scale, fit.scale)
    center = fit.u0 + fit.scale * mean
    resid = fit.logs(mean) - fit.y
    before = fit.logs(np.zeros(len(TERMS)))
    rows = [{"run": fit.scenarios[i].name, "metric": m,
             "measured": float(math.exp(fit.y[k])),
             "shipped": float(math.exp(before[k])) if np.isfinite(before[k]) else math.nan,
             "calibrated": float(math.exp(fit.y[k] + resid[k]))
             if np.isfinite(resid[k]) else math.nan}
            for k, (i, m) in enumerate(fit.rows)]
    return {"terms": deployment.from_coordinates(center), "center": center.tolist(),
            "covariance": cov.tolist(), "discrepancy": discrepancy(fit, mean),
            "residuals": rows,
            "prior": {"center": fit.u0.tolist(), "sigma": fit.scale.tolist(),
                      "components": [{"name": n, "sigma_share": sh, "weight": w}
                                     for n, sh, w in components]},
            "components": [{"name": n, "weight": w,
                            "terms": deployment.from_coordinates(fit.u0 + fit.scale * z)}
                           for n, w, z in parts],
            "num_simulations": fit.num_simulations, "fit": fit}
