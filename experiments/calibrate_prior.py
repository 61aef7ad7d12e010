"""The calibration's error model and prior, estimated from the shipped model's errors (empirical Bayes).

    python -m experiments.calibrate_prior [--data DIR] [--out DIR] [--quiet]

On the 17 real vLLM 0.15 H100 runs bundled in ``simsched/cost/data/vllm_v1/`` (``--data``
another folder of the format), at the shipped model (no term fitted):

1. **errors**: every run's log error (simulated / measured) of TTFT and E2E mean and p90, and
   its sensitivity to each term (the Jacobian :mod:`simsched.fit.calibrate` uses, in the wide
   prior's standard units);
2. **within a (model, GPU)**: the errors' spread around their (model, GPU) mean (each deviation
   scaled by sqrt(n / (n - 1))) and their correlations: what one workload's error is that the
   next workload of the same deployment does not share: the fit's noise
   (:mod:`simsched.fit.errors` rounds these);
3. **the prior**: with that noise (as :mod:`simsched.fit.errors` models it), each (model, GPU)'s
   errors are modelled as its runs' noise plus the sensitivity times shared term shifts drawn
   from a mixture of two normals: the ``validated`` component (sigmas ``share`` x the wide prior,
   weight ``weight``) and the wide prior itself. The (share, weight) making the groups' errors
   most probable, on a grid, are :data:`simsched.fit.calibrate.PRIOR_SCALE` and
   :data:`~simsched.fit.calibrate.PRIOR_WEIGHT` (rounded).

Written to ``--out``: ``errors.csv``, ``within.csv`` (spread and correlations), ``prior.csv``
(the best point and the fit's values beside it).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from simsched.fit import calibrate as core
from simsched.fit import replay
from simsched.fit.errors import METRIC_SIGMA, run_covariance
from experiments._common import parser as make_parser
from experiments._common import print_table, write_frames
from experiments.calibrate_loo import group_of, load

METRICS = ("ttft_mean", "ttft_p90", "e2el_mean", "e2el_p90")
SHARES = np.exp(np.linspace(math.log(0.02), 0.0, 61))
WEIGHTS = np.concatenate([np.linspace(0.02, 0.98, 49), [0.99, 0.995, 0.999]])


def linearisation(runs) -> tuple[pd.DataFrame, np.ndarray]:
    """(one row per run and metric: group, log error; the Jacobian rows, same order)."""
    fit = core.Fit([replay.scenario(r, 0) for r in runs])
    jac = fit.jacobian(np.zeros(len(core.TERMS)))
    err = fit.logs(np.zeros(len(core.TERMS))) - fit.y
    rows = [{"run": fit.scenarios[i].name, "group": group_of(runs[i])[0], "metric": m,
             "log_error": err[k]} for k, (i, m) in enumerate(fit.rows)]
    return pd.DataFrame(rows), jac


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
    return out.reset_index(names="metric")


def _group_loglik(e, jac, noise, share) -> float:
    cov = noise + share ** 2 * jac @ jac.T
    sign, logdet = np.linalg.slogdet(cov)
    return -0.5 * (e @ np.linalg.solve(cov, e) + logdet + len(e) * math.log(2 * math.pi))


def prior_grid(errors: pd.DataFrame, jac: np.ndarray) -> pd.DataFrame:
    """The mixture's log likelihood of every group's errors over (share, weight)."""
    groups = []
    for _, g in errors.groupby("group", sort=False):
        idx = g.index.to_numpy()
        noise = np.zeros((len(idx), len(idx)))
        for _, r in g.groupby("run", sort=False):
            k = np.searchsorted(idx, r.index.to_numpy())
            noise[np.ix_(k, k)] = run_covariance(list(r.metric), METRIC_SIGMA)
        groups.append((g.log_error.to_numpy(), jac[idx], noise))
    wide = np.array([_group_loglik(e, j, s, 1.0) for e, j, s in groups])
    rows = []
    for share in SHARES:
        tight = np.array([_group_loglik(e, j, s, share) for e, j, s in groups])
        for w in WEIGHTS:
            ll = np.logaddexp(math.log(w) + tight, math.log(1 - w) + wide).sum()
            rows.append({"share": share, "weight": w, "log_likelihood": ll})
    return pd.DataFrame(rows)


def run(out="out/calibrate_prior", data=None, quiet: bool = False) -> dict[str, pd.DataFrame]:
    """Every table of the experiment (see the module docstring)."""
    runs = load(data)
    errors, jac = linearisation(runs)
    errors = errors[errors.metric.isin(METRICS)]
    jac = jac[errors.index.to_numpy()]
    errors = errors.reset_index(drop=True)
    spread = within(errors)
    grid = prior_grid(errors, jac)
    best = grid.loc[grid.log_likelihood.idxmax()]
    used = grid.iloc[((grid.share - core.PRIOR_SCALE).abs() + (grid.weight - core.PRIOR_WEIGHT)
                      .abs()).idxmin()]
    prior = pd.DataFrame([{"what": "most probable", **best},
                          {"what": "simsched.fit.calibrate (nearest grid point)", **used}])
    tables = {"errors": errors.assign(error_percent=np.expm1(errors.log_error) * 100),
              "within": spread, "prior": prior}
    write_frames(Path(out), **tables)
    if not quiet:
        print("within a (model, GPU): spread of the shipped model's errors and correlations")
        print_table(spread)
        print("\nprior (empirical Bayes):")
        print_table(prior, out)
    return tables


def main(argv=None) -> dict:
    p = make_parser("calibrate_prior", __doc__, "the same (the experiment is short)")
    p.add_argument("--data", default=None, help="another folder of runs.csv + measured.csv")
    args = p.parse_args(argv)
    return run(args.out, args.data, args.quiet)


if __name__ == "__main__":
    main()
