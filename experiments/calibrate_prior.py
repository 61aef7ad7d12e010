"""The calibration's error model and prior, estimated from the shipped model's errors (empirical Bayes).

    python -m experiments.calibrate_prior [--data DIR] [--out DIR] [--quiet]

On the 17 real vLLM 0.15 H100 runs bundled in ``simsched/cost/data/vllm_v1/`` (``--data``
another folder of the format), at the shipped model (no term fitted):

1. **errors**: every run's log error (simulated / measured) of TTFT and E2E mean and p90, and
   its sensitivity to each term (the Jacobian :mod:`simsched.fit.calibrate` uses, in the wide
   prior's standard units);
2. **within a (model, GPU)**: the errors' spread around their (model, GPU) mean (each deviation
   scaled by sqrt(n / (n - 1))), their kurtosis and their correlations: what one workload's
   error is that the next workload of the same deployment does not share: the fit's noise
   (:mod:`simsched.fit.errors` rounds these, and sets its t's tails from TTFT's kurtosis);
3. **the prior**: with that noise (as :mod:`simsched.fit.errors` models it), each (model, GPU)'s
   errors are modelled as its runs' noise plus the sensitivity times shared term shifts drawn
   from the ``validated`` normal (each term's sigma its own ``share`` of the wide prior's: these
   runs are all validated deployments). The shares making the groups' errors most probable
   (coordinate ascent on a grid: automatic relevance determination) are the mode; a handful of
   groups leaves several shares anywhere from zero to some bound, so each share is integrated
   over its posterior (:func:`posterior_shares`: the root mean square share), and those are
   :data:`simsched.fit.calibrate.PRIOR_SCALE` (rounded). How likely a user's deployment is to
   be unlike these (the ``other`` component's weight, 1 - ``PRIOR_WEIGHT``) is likewise the
   posterior mean of that share given each (model, GPU)'s likelihood under either component
   (:func:`other_weight`): the groups make unlike deployments rarer, they cannot rule them
   out. The errors are taken as normal here (the error model's t has the same variance).

Written to ``--out``: ``errors.csv``, ``within.csv`` (spread and correlations), ``prior.csv``
(the most probable and the posterior shares, the other component's weight, and simsched's).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from simsched.cost.deployment import TERMS
from simsched.fit import calibrate as core
from simsched.fit import replay
from simsched.fit.errors import METRIC_SIGMA, run_covariance
from experiments._common import parser as make_parser
from experiments._common import print_table, write_frames
from experiments.calibrate_loo import group_of, load

METRICS = ("ttft_mean", "ttft_p90", "e2el_mean", "e2el_p90")
SHARES = np.exp(np.linspace(math.log(0.01), 0.0, 31))
ROUNDS = 6
PI_GRID = 2000


def linearisation(runs, cache: dict | None = None) -> tuple[pd.DataFrame, np.ndarray]:
    """(one row per run and metric: group, log error; the Jacobian rows, same order), of
    :data:`METRICS` only; ``cache``: simulations shared with calibrations of the same runs."""
    fit = core.Fit([replay.scenario(r, 0) for r in runs], cache=cache)
    jac = fit.jacobian(np.zeros(len(core.TERMS)))
    err = fit.logs(np.zeros(len(core.TERMS))) - fit.y
    rows = [{"run": fit.scenarios[i].name, "group": group_of(runs[i])[0], "metric": m,
             "log_error": err[k]} for k, (i, m) in enumerate(fit.rows)]
    errors = pd.DataFrame(rows)
    keep = errors.metric.isin(METRICS).to_numpy()
    return errors[keep].reset_index(drop=True), jac[keep]


def within(errors: pd.DataFrame) -> pd.DataFrame:
    """Spread (%) and correlations of the errors around their group's mean."""
    wide = errors.pivot_table(index=["group", "run"], columns="metric", values="log_error")
    wide = wide[list(METRICS)]
    n = wide.groupby(level="group").transform("size")
    dev = (wide - wide.groupby(level="group").transform("mean")).mul(
        np.sqrt(n / (n - 1).clip(lower=1)), axis=0)
    dev = dev[n > 1]
    cov = dev.T @ dev / len(dev)
    sd = np.sqrt(np.diag(cov))
    corr = cov / np.outer(sd, sd)
    out = pd.DataFrame(corr, index=list(METRICS), columns=list(METRICS)).round(3)
    out.insert(0, "sd_percent", (sd * 100).round(2))
    out.insert(1, "model_sd_percent", [METRIC_SIGMA[m] * 100 for m in METRICS])
    out.insert(2, "num_deviations", len(dev))
    # Their tails: a normal's kurtosis is 3 (simsched.fit.errors.TAIL_DOF is set from TTFT's).
    out.insert(2, "kurtosis", ((dev ** 4).mean() / (dev ** 2).mean() ** 2).round(2).to_numpy())
    return out.reset_index(names="metric")


def _group_loglik(e, jac, noise, shares) -> float:
    cov = noise + (jac * shares ** 2) @ jac.T
    sign, logdet = np.linalg.slogdet(cov)
    return -0.5 * (e @ np.linalg.solve(cov, e) + logdet + len(e) * math.log(2 * math.pi))


def group_errors(errors: pd.DataFrame, jac: np.ndarray) -> list:
    """Per (model, GPU): (its errors, their Jacobian rows, its runs' noise covariance)."""
    groups = []
    for _, g in errors.groupby("group", sort=False):
        idx = g.index.to_numpy()
        noise = np.zeros((len(idx), len(idx)))
        for _, r in g.groupby("run", sort=False):
            k = np.searchsorted(idx, r.index.to_numpy())
            noise[np.ix_(k, k)] = run_covariance(list(r.metric), METRIC_SIGMA)
        groups.append((g.log_error.to_numpy(), jac[idx], noise))
    return groups


def log_likelihood(groups, shares) -> float:
    """The validated prior's log likelihood of every group's errors."""
    return float(sum(_group_loglik(e, j, s, np.asarray(shares)) for e, j, s in groups))


def estimate(errors: pd.DataFrame, jac: np.ndarray) -> tuple:
    """The most probable validated prior: (per-term sigma shares, log likelihood), by
    coordinate ascent over :data:`SHARES` per term from 0.14 (automatic relevance
    determination: each term's own prior scale)."""
    groups = group_errors(errors, jac)
    shares = np.full(len(TERMS), 0.14)
    best = log_likelihood(groups, shares)
    for _ in range(ROUNDS):
        before = best
        for j in range(len(TERMS)):
            for v in SHARES:
                trial = shares.copy()
                trial[j] = v
                ll = log_likelihood(groups, trial)
                if ll > best:
                    best, shares = ll, trial
        if best - before < 1e-6:
            break
    return shares, best


def posterior_shares(groups, shares) -> np.ndarray:
    """Each term's share integrated over its posterior instead of at its mode: the root mean
    square share, each term in turn on :data:`SHARES` (log-uniform a priori) with the others at
    ``shares``. A term the groups leave free to be anywhere below some bound (the mode at the
    grid's floor, the likelihood flat up to that bound) gets a share near that bound, not the
    floor: what a few groups cannot tell from zero they have not shown to be zero."""
    shares = np.asarray(shares, float)
    out = shares.copy()
    for j in range(len(TERMS)):
        ll = []
        for v in SHARES:
            trial = shares.copy()
            trial[j] = v
            ll.append(log_likelihood(groups, trial))
        post = np.exp(np.array(ll) - max(ll))
        out[j] = math.sqrt(float((SHARES ** 2 * post).sum() / post.sum()))
    return out


def other_weight(groups, shares) -> float:
    """The prior weight of the ``other`` (wide) component: the probability that a new
    deployment is unlike the validated ones, as the groups say it (hierarchical Bayes): each
    (model, GPU) is validated (its errors drawn with ``shares``) or other (the wide prior, every
    share 1) with probability ``1 - pi`` and ``pi``, ``pi`` uniform a priori; the weight is
    ``pi``'s posterior mean (integrated over a grid of :data:`PI_GRID` points). Where every
    group is far more probable validated, that is Laplace's rule of succession,
    1 / (groups + 2): the groups cannot rule out unlike deployments, only make them rarer."""
    shares = np.asarray(shares, float)
    lv = np.array([_group_loglik(e, j, s, shares) for e, j, s in groups])
    lw = np.array([_group_loglik(e, j, s, np.ones(len(TERMS))) for e, j, s in groups])
    pis = (np.arange(PI_GRID) + 0.5) / PI_GRID
    ll = np.array([np.logaddexp(math.log1p(-p) + lv, math.log(p) + lw).sum() for p in pis])
    post = np.exp(ll - ll.max())
    return float((pis * post).sum() / post.sum())


def run(out="out/calibrate_prior", data=None, quiet: bool = False) -> dict[str, pd.DataFrame]:
    """Every table of the experiment (see the module docstring)."""
    runs = load(data)
    errors, jac = linearisation(runs)
    spread = within(errors)
    shares, ll = estimate(errors, jac)
    groups = group_errors(errors, jac)
    post = posterior_shares(groups, shares)
    used = np.array([core.PRIOR_SCALE[t] for t in TERMS])
    prior = pd.DataFrame({"term": list(TERMS) + ["log_likelihood", "other_weight"],
                          "most_probable": list(shares) + [ll, math.nan],
                          "posterior": list(post) + [log_likelihood(groups, post),
                                                     other_weight(groups, post)],
                          "simsched": list(used) + [log_likelihood(groups, used),
                                                    1 - core.PRIOR_WEIGHT]})
    tables = {"errors": errors.assign(error_percent=np.expm1(errors.log_error) * 100),
              "within": spread, "prior": prior}
    write_frames(Path(out), **tables)
    if not quiet:
        print("within a (model, GPU): spread of the shipped model's errors and correlations")
        print_table(spread)
        print("\nprior (empirical Bayes): the validated component's sigma shares")
        print_table(prior, out)
    return tables


def main(argv=None) -> dict:
    p = make_parser("calibrate_prior", __doc__, "the same (the experiment is short)")
    p.add_argument("--data", default=None, help="another folder of runs.csv + measured.csv")
    args = p.parse_args(argv)
    return run(args.out, args.data, args.quiet)


if __name__ == "__main__":
    main()
