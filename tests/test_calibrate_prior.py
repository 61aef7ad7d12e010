"""The calibration's error model (Student t) and prior (hyperparameters integrated)."""

import math

import numpy as np
import pandas as pd
import pytest

from simsched.fit import errors
from simsched.fit.errors import METRIC_SIGMA, run_covariance

METRICS4 = ["ttft_mean", "ttft_p90", "e2el_mean", "e2el_p90"]


def _t_loglik(blocks, diff, metrics):
    return (errors.t_log_likelihood(blocks, diff, metrics, METRIC_SIGMA)
            - 0.5 * errors.log_det(blocks, diff, metrics, METRIC_SIGMA))


def test_irls_rows_give_the_t_likelihoods_gradient():
    # Two runs, a linear model diff = e + J z: the IRLS-whitened J'r is minus the gradient of
    # the t log likelihood (what the fit's Gauss-Newton steps need).
    rng = np.random.default_rng(3)
    metrics = METRICS4 * 2
    blocks = [[0, 1, 2, 3], [4, 5, 6, 7]]
    e = np.array([0.4, 0.45, -0.1, -0.12, 0.05, 0.02, 0.01, 0.03])   # run 0 far off
    jac = rng.normal(0.0, 0.2, (8, 3))
    z = np.array([0.1, -0.2, 0.3])
    r, jw = errors.whiten(blocks, e + jac @ z, jac, metrics, METRIC_SIGMA, "irls")
    grad = np.zeros(3)
    for j in range(3):
        dz = np.zeros(3)
        dz[j] = 1e-6
        grad[j] = (_t_loglik(blocks, e + jac @ (z + dz), metrics)
                   - _t_loglik(blocks, e + jac @ (z - dz), metrics)) / 2e-6
    assert jw.T @ r == pytest.approx(-grad, rel=1e-5)


def test_a_run_far_off_weighs_less_under_the_t():
    metrics = METRICS4
    near = np.array([0.05, 0.06, 0.01, 0.02])
    far = np.array([0.32, 0.23, -0.09, -0.12])     # the Qwen2.5-7B reasoning run's errors
    for diff in (near, far):
        plain, _ = errors.whiten([[0, 1, 2, 3]], diff, None, metrics, METRIC_SIGMA)
        t, _ = errors.whiten([[0, 1, 2, 3]], diff, None, metrics, METRIC_SIGMA, "irls")
        # IRLS weight (nu + d) / (nu + m2) on the t's scale (the covariance times T_SCALE).
        m2 = float(plain @ plain) / errors.T_SCALE
        assert t @ t == pytest.approx(m2 * errors.t_weight(m2, 4))
    # The far run's effective weight is below one, the near run's above.
    m2_far = float(np.linalg.solve(run_covariance(metrics, METRIC_SIGMA), far) @ far)
    assert errors.t_weight(m2_far / errors.T_SCALE, 4) < 0.6
    assert errors.t_weight(0.0, 4) > 1
    # The information (fisher) is the same for both: (nu + d) / (nu + d + 2) on the t's scale.
    jac = np.eye(4)
    _, j1 = errors.whiten([[0, 1, 2, 3]], near, jac, metrics, METRIC_SIGMA, "fisher")
    _, j2 = errors.whiten([[0, 1, 2, 3]], far, jac, metrics, METRIC_SIGMA, "fisher")
    assert np.allclose(j1, j2)
    info = np.linalg.inv(run_covariance(metrics, METRIC_SIGMA)) / errors.T_SCALE * (12 / 14)
    assert j1.T @ j1 == pytest.approx(info)
    with pytest.raises(ValueError, match="weights must be"):
        errors.whiten([[0, 1, 2, 3]], near, None, metrics, METRIC_SIGMA, "robust")


def test_the_ts_variance_is_the_error_models():
    # The t's scale is the covariance times (nu - 2) / nu: its variance is the covariance.
    nu = errors.TAIL_DOF
    assert errors.T_SCALE * nu / (nu - 2) == pytest.approx(1.0)
    # Its log likelihood tends to the normal's for a small residual (up to the constant).
    d = np.array([1e-4, 1e-4, 1e-4, 1e-4])
    t0 = _t_loglik([[0, 1, 2, 3]], np.zeros(4), METRICS4)
    t1 = _t_loglik([[0, 1, 2, 3]], d, METRICS4)
    prec = np.linalg.inv(run_covariance(METRICS4, METRIC_SIGMA) * errors.T_SCALE)
    assert t1 - t0 == pytest.approx(-0.5 * (nu + 4) / nu * d @ prec @ d, rel=1e-3)


def _groups(num_groups, share, seed):
    """Synthetic (model, GPU) groups of 3 runs: errors are the error model's noise plus a
    shared shift of every term drawn with ``share`` (per term) of the wide prior."""
    from experiments.calibrate_prior import METRICS

    rng = np.random.default_rng(seed)
    noise = np.linalg.cholesky(run_covariance(list(METRICS), METRIC_SIGMA))
    rows, jacs = [], []
    for g in range(num_groups):
        shift = np.asarray(share) * rng.standard_normal(6)
        for r in range(3):
            jac = rng.normal(0.0, 0.3, (4, 6))
            jac[:, 0] = np.abs(jac[:, 0]) + 0.2
            jacs.append(jac)
            err = jac @ shift + noise @ rng.standard_normal(4)
            rows += [{"group": f"g{g}", "run": f"g{g}r{r}", "metric": m, "log_error": e}
                     for m, e in zip(METRICS, err)]
    return pd.DataFrame(rows), np.vstack(jacs)


def test_posterior_shares_do_not_pin_what_few_groups_cannot_see():
    from experiments.calibrate_prior import SHARES, estimate, group_errors, posterior_shares

    errs, jac = _groups(6, [0.5, 0, 0, 0, 0, 0], seed=11)
    mode, _ = estimate(errs, jac)
    post = posterior_shares(group_errors(errs, jac), mode)
    # Terms pinned at the grid's floor by the mode keep a share the groups cannot rule out;
    # the term that moves stays near its mode.
    floor = [j for j in range(1, 6) if mode[j] <= SHARES[0] * 1.01]
    assert floor
    assert all(post[j] > 2 * SHARES[0] for j in floor)
    assert post[0] == pytest.approx(mode[0], rel=0.5)
    assert post[1:].max() < post[0] / 5          # what the groups do rule out stays small


def test_other_weight_is_the_posterior_share_of_unlike_deployments():
    from experiments.calibrate_prior import estimate, group_errors, other_weight

    # Every group a validated deployment, clearly: the rule of succession, 1 / (groups + 2).
    errs, jac = _groups(8, [0.05] * 6, seed=5)
    shares = np.full(6, 0.05)
    w = other_weight(group_errors(errs, jac), shares)
    assert 0.5 / 10 < w < 1.5 / 10
    # Groups whose terms move as much as the wide prior says: mostly unlike.
    errs, jac = _groups(8, [1.0] * 6, seed=5)
    assert other_weight(group_errors(errs, jac), shares) > 0.8
    assert math.isfinite(estimate(errs, jac)[1])
