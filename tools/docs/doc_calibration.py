"""The generated blocks of docs/calibration.md (see tools.docs.check_docs), all from
``python -m experiments.calibrate_loo`` (leave one run out, single runs, round trips)."""

from __future__ import annotations

from tools.docs.doc_format import claim, md_table, num


def _tables(runs) -> dict:
    return runs.get("calibrate_loo")


def calibration_loo(runs) -> str:
    """Leave one run out: the headline figures and the per-run errors."""
    t = _tables(runs)
    summ, loo = t["loo_summary"], t["loo"]
    claim(summ.calibrated.notna().all(), "every leave-one-out figure is computed")
    head = summ.rename(columns={"figure": "figure", "shipped": "shipped model",
                                "calibrated": "calibrated (left out)", "target": "target"})
    wide = loo[loo.metric.isin(["e2el_mean", "ttft_mean"])].pivot_table(
        index=["run", "calibrated_on", "num_runs"], columns="metric",
        values=["shipped_error", "error"], aggfunc="first")
    wide.columns = [f"{m} {'shipped' if k == 'shipped_error' else 'calibrated'} (%)"
                    for k, m in wide.columns]
    wide = wide.reset_index()
    cover = loo.groupby("metric").covered.mean().mul(100)
    order = ["run", "calibrated_on", "num_runs", "e2el_mean shipped (%)",
             "e2el_mean calibrated (%)", "ttft_mean shipped (%)", "ttft_mean calibrated (%)"]
    text = (md_table(head, 3) + "\n\nCoverage of the 90 % intervals by metric: "
            + ", ".join(f"{m} {num(v, 3)} %" for m, v in cover.items())
            + f" ({len(loo)} (run, metric) cases).\n\n" + md_table(wide[order], 3))
    return text


def calibration_single(runs) -> str:
    """One run calibrates; the same model's other runs are predicted."""
    s = _tables(runs)["single"]
    agg = s.groupby("metric").agg(
        cases=("better", "size"), calibrated_no_worse=("better", "sum"),
        shipped_mean_abs_error=("shipped_error", lambda e: e.abs().mean()),
        calibrated_mean_abs_error=("calibrated_error", lambda e: e.abs().mean())).reset_index()
    return md_table(agg, 3)


def calibration_round_trip(runs) -> str:
    """Simulated runs exported and calibrated on: the terms recovered."""
    r = _tables(runs)["round_trip"]
    claim(len(r) > 0, "the round trips ran")
    return (md_table(r, 3) + f"\n\n{int(r.covered.sum())} of {len(r)} true terms lie in "
            "their 90 % intervals.")


def calibration_terms(runs) -> str:
    """The profile fitted to all 17 runs: terms with intervals, and the simulation count."""
    t = _tables(runs)
    terms, timing = t["terms_all_runs"], t["timing"]
    sims = {w: s for w, s in zip(timing.what, timing.simulations) if s == s}
    note = "; ".join(f"{w}: {int(s)} simulations" for w, s in sims.items())
    return md_table(terms, 3) + f"\n\n{note}."



def calibration_prior(runs) -> str:
    """The error model and the prior's empirical Bayes (experiments.calibrate_prior)."""
    t = runs.get("calibrate_prior")
    within, prior = t["within"], t["prior"]
    claim(len(within) == 4, "the spread of all four metrics is estimated")
    from simsched.fit.errors import TAIL_DOF

    kurt = within.set_index("metric")["kurtosis"]["ttft_mean"]
    claim(kurt > 3 and abs(4 + 6 / (kurt - 3) - TAIL_DOF) < 1,
          "the error model's t has the tails of the TTFT deviations (kurtosis 3 + 6 / (nu - 4))")
    p = prior.set_index("term")
    shares = p.drop(index="log_likelihood")
    claim(((shares.simsched - shares.posterior).abs() < 0.011).all(),
          "simsched's prior is the posterior one, rounded to two decimals")
    claim(abs(p.simsched["log_likelihood"] - p.posterior["log_likelihood"]) < 0.1,
          "the rounding costs the prior less than 0.1 of log likelihood")
    return md_table(within, 3) + "\n\n" + md_table(prior, 3)
