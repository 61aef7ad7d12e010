"""Calibrating to a deployment, validated: leave one run out, single runs, round trips.

    python -m experiments.calibrate_loo [--quick] [--draws N] [--data DIR] [--out DIR] [--quiet]

On the 17 real vLLM 0.15 H100 runs bundled in ``simsched/cost/data/vllm_v1/`` (the same files as
``real-serving/vllm-0.15/``; ``--data`` another folder of the format) with
:func:`simsched.calibrate` (docs/calibration.md):

1. **leave one run out**: each run is predicted by a profile calibrated on the other runs of
   its (model, GPU), or on every other run where it has none, under a prior estimated without
   it (``experiments.calibrate_prior`` on the other 16 runs); the prediction is the left-out
   run simulated with the fitted terms, its 90 % interval the ensemble of ``--draws``
   coefficient sets (and workload seeds) drawn from the profile, widened by the profile's
   unexplained scatter and centred on the prediction. Reported: the median over runs of the
   E2E-mean and TTFT-mean errors (targets 5 % and 10 %) next to the shipped model's, and the
   share of (run, metric) cases (TTFT and E2E mean and p90) whose measured value the interval
   covers (target 80-95 %);
2. **single runs**: every run of a (model, GPU) with several runs calibrates a profile alone,
   which predicts that model's other runs; reported per (calibration run, predicted run) with
   the shipped model's error;
3. **round trips**: simulated runs with known terms are exported as ``vllm bench serve`` JSON
   and as a Prometheus ``/metrics`` scrape (OpenMetrics), read back with the measurement
   readers and calibrated on; reported: each term's truth, fit and 90 % interval.

Written to ``--out``: ``loo.csv``, ``loo_summary.csv``, ``single.csv``, ``round_trip.csv``,
``timing.csv``. ``--quick``: the Llama-2-7B and Qwen2.5-7B runs only, 3 draws, one round trip.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

from simsched import SimConfig, calibrate, simulate
from simsched.analysis import prometheus_text
from simsched.analysis.measurements import Measured, read_run_tables, read_vllm_bench
from simsched.analysis.replicate import prediction_intervals
from simsched.cost import calibration as cal
from simsched.cost import deployment, factory, vllm_v1
from simsched.fit import calibrate as core
from simsched.fit import replay
from simsched.workloads.workload import WorkloadConfig
from experiments._common import parser as make_parser
from experiments._common import print_table, write_frames

METRICS = ("ttft_mean", "ttft_p90", "e2el_mean", "e2el_p90")
HEADLINE = ("e2el_mean", "ttft_mean")
QUICK_MODELS = ("llama-2-7b", "qwen2.5-7b")
LEVEL = 0.9
# The terms the round trips simulate with (the "unknown" deployment).
TRUTH = dict(deployment.neutral_terms(vllm_v1.terms()["output_delay"]), gemm_scale=1.15,
             attention_scale=0.9, step_time=0.8e-3, seq_time=5e-6, output_delay=0.015)


def group_of(run: Measured) -> tuple:
    """(model, GPU) of a run-table run."""
    return str(run.settings["model"]).split()[0].lower(), str(run.settings["gpu"])


def load(data=None, quick: bool = False) -> list[Measured]:
    folder = Path(data) if data else cal.DATA_DIR / "vllm_v1"
    runs = read_run_tables(folder / "runs.csv", folder / "measured.csv")
    if quick:
        runs = [r for r in runs if group_of(r)[0] in QUICK_MODELS]
    return runs


def predict(profile: deployment.DeploymentProfile, run: Measured, draws: int,
            cache: dict) -> dict:
    """metric -> (prediction, low, high) of ``run`` under ``profile``."""
    point = _simulated(replay.scenario(run, 0), profile.terms, cache)
    rows = []
    for k, terms in enumerate(profile.draw(draws, seed=0)):
        rows.append(_simulated(replay.scenario(run, k + 1), terms, cache))
    table = prediction_intervals(pd.DataFrame(rows)[list(METRICS)], LEVEL,
                                 {m: profile.discrepancy.get(m, 0.0) for m in METRICS})
    out = {}
    for r in table.itertuples():
        # The ensemble's interval, centred on the point prediction (the fitted terms).
        out[r.metric] = (point[r.metric], point[r.metric] - (r.mean - r.low),
                         point[r.metric] + (r.high - r.mean))
    return out


def _simulated(sc: replay.Scenario, terms: dict | None, cache: dict) -> dict:
    key = ("predict", sc.name, sc.config.seed, None if terms is None else
           tuple(sorted(terms.items())))
    if key not in cache:
        cache[key] = sc.simulate(terms)
    return cache[key]


def held_out_priors(runs, cache: dict) -> dict:
    """run name -> the prior's components (the validated shares and the components' weights)
    estimated without that run (``experiments.calibrate_prior`` on the other runs), so no
    left-out run informs its prior."""
    from experiments import calibrate_prior

    errors, jac = calibrate_prior.linearisation(runs, cache)
    out = {}
    for name in errors.run.unique():
        keep = (errors.run != name).to_numpy()
        kept, kept_jac = errors[keep].reset_index(drop=True), jac[keep]
        groups = calibrate_prior.group_errors(kept, kept_jac)
        shares = calibrate_prior.posterior_shares(
            groups, calibrate_prior.estimate(kept, kept_jac)[0])
        weight = 1.0 - calibrate_prior.other_weight(groups, shares)
        out[name] = (("validated", {t: float(v) for t, v in zip(deployment.TERMS, shares)},
                      weight), ("other", 1.0, 1.0 - weight))
    return out


def leave_one_out(runs, draws: int, cache: dict) -> pd.DataFrame:
    rows = []
    priors = held_out_priors(runs, cache)
    for run in runs:
        same = [r for r in runs if r is not run and group_of(r) == group_of(run)]
        basis = same or [r for r in runs if r is not run]
        prior = priors[replay.scenario(run, 0).name]
        prof = calibrate(basis, cache=cache, components=prior).profile
        pred = predict(prof, run, draws, cache)
        shipped = _simulated(replay.scenario(run, 0), None, cache)
        for m in METRICS:
            meas = run.metrics[m]
            p, lo, hi = pred[m]
            rows.append({"run": run.settings["experiment"], "model": group_of(run)[0],
                         "calibrated_on": "same model" if same else "all other runs",
                         "num_runs": len(basis), "metric": m, "measured": meas,
                         "shipped": shipped[m], "predicted": p, "low": lo, "high": hi,
                         "shipped_error": (shipped[m] / meas - 1) * 100,
                         "error": (p / meas - 1) * 100, "covered": lo <= meas <= hi})
    return pd.DataFrame(rows)


def loo_summary(table: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for m in HEADLINE:
        t = table[table.metric == m]
        rows.append({"figure": f"median abs. error {m} (%)", "shipped": t.shipped_error.abs()
                     .median(), "calibrated": t.error.abs().median(),
                     "target": 5.0 if m == "e2el_mean" else 10.0})
    rows.append({"figure": "90% interval coverage (%)", "shipped": math.nan,
                 "calibrated": table.covered.mean() * 100, "target": 90.0})
    return pd.DataFrame(rows)


def single_runs(runs, cache: dict) -> pd.DataFrame:
    rows = []
    for run in runs:
        others = [r for r in runs if r is not run and group_of(r) == group_of(run)]
        if not others:
            continue
        prof = calibrate([run], cache=cache).profile
        for target in others:
            shipped = _simulated(replay.scenario(target, 0), None, cache)
            fitted = _simulated(replay.scenario(target, 0), prof.terms, cache)
            for m in HEADLINE:
                meas = target.metrics[m]
                rows.append({"calibrated_on": run.settings["experiment"],
                             "predicted": target.settings["experiment"], "metric": m,
                             "shipped_error": (shipped[m] / meas - 1) * 100,
                             "calibrated_error": (fitted[m] / meas - 1) * 100})
    df = pd.DataFrame(rows)
    if len(df):
        df["better"] = df.calibrated_error.abs() <= df.shipped_error.abs()
    return df


def round_trip_runs(out: Path, rate: float, n: int, seed: int, model="llama-3.1-70b", tp=4):
    """A simulated run under :data:`TRUTH` written as bench JSON and a scrape, read back: (the
    bench run, the scrape's run) as Measured runs."""
    cfg = SimConfig().replace(model=model, gpu="h100-sxm", tensor_parallel_size=tp, seed=seed,
                              workload=WorkloadConfig(num_requests=n, rate=rate,
                                                      arrival="poisson", lengths="fixed",
                                                      prompt_len=800, output_len=200))
    res = simulate(cfg, cost_model=factory.adjusted_cost_model(cfg.hardware, TRUTH))
    out.mkdir(parents=True, exist_ok=True)
    res.to_vllm_bench(out / f"bench-{rate:g}.json", percentiles=(90, 99))
    res.to_openmetrics(out / f"metrics-{rate:g}.txt")
    server = {"model": model, "gpu": "h100-sxm", "tensor_parallel_size": tp}
    bench = read_vllm_bench(out / f"bench-{rate:g}.json")
    bench = Measured(bench.source, bench.metrics, {**bench.settings, **server})
    scrapes = prometheus_text.scrapes(prometheus_text.read(out / f"metrics-{rate:g}.txt"))
    means = {k: v for k, v in prometheus_text.run_metrics(scrapes[-1]).items()
             if k.endswith("_mean")}
    scrape = Measured(str(out / f"metrics-{rate:g}.txt"),
                      dict(means, num_finished=bench.metrics["num_finished"],
                           total_input_tokens=bench.metrics["total_input_tokens"],
                           total_output_tokens=bench.metrics["total_output_tokens"]),
                      dict(bench.settings))
    return bench, scrape


def round_trips(out: Path, quick: bool) -> pd.DataFrame:
    rates = (2.0, 6.0) if quick else (2.0, 6.0, 12.0)
    n = 150 if quick else 300
    pairs = [round_trip_runs(out, r, n, k) for k, r in enumerate(rates)]
    rows = []
    for kind, runs in (("vllm bench JSON", [b for b, _ in pairs]),
                       ("/metrics scrape", [s for _, s in pairs])):
        if quick and kind != "vllm bench JSON":
            continue
        fit = calibrate(runs)
        for t in fit.terms.itertuples():
            truth = TRUTH[t.term] * deployment.UNITS[t.term][1]
            rows.append({"input": kind, "term": t.term, "unit": t.unit, "truth": truth,
                         "fitted": t.fitted, "low_90": t.low_90, "high_90": t.high_90,
                         "covered": t.low_90 <= truth <= t.high_90})
    return pd.DataFrame(rows)


def run(quick: bool = False, out="out/calibrate_loo", draws: int | None = None, data=None,
        quiet: bool = False) -> dict[str, pd.DataFrame]:
    """Every table of the experiment (see the module docstring)."""
    out = Path(out)
    draws = draws or (3 if quick else 8)
    runs = load(data, quick)
    cache: dict = {}
    t0 = time.perf_counter()
    one = calibrate(runs[:1], cache={})
    timing = [{"what": "one calibration, one run", "seconds": one.wall_time,
               "simulations": one.document["num_simulations"]}]
    t1 = time.perf_counter()
    all_runs = calibrate(runs, cache=cache)
    timing.append({"what": f"one calibration, {len(runs)} runs",
                   "seconds": time.perf_counter() - t1,
                   "simulations": all_runs.document["num_simulations"]})
    loo = leave_one_out(runs, draws, cache)
    summ = loo_summary(loo)
    single = single_runs(runs, cache)
    trips = round_trips(out / "round_trip", quick)
    timing.append({"what": "whole experiment", "seconds": time.perf_counter() - t0,
                   "simulations": math.nan})
    tables = {"loo": loo, "loo_summary": summ, "single": single, "round_trip": trips,
              "timing": pd.DataFrame(timing), "terms_all_runs": all_runs.terms,
              "report_all_runs": all_runs.report}
    write_frames(out, **tables)
    if not quiet:
        print("leave one run out (errors %):")
        print_table(summ)
        print("\nper run:")
        print_table(loo[["run", "metric", "calibrated_on", "shipped_error", "error",
                         "covered"]].assign(run=loo.run.str.slice(0, 34)))
        if len(single):
            print("\nsingle-run calibration vs shipped on the model's other runs "
                  f"(calibrated no worse in {single.better.sum()} of {len(single)} cases):")
            print_table(single.groupby("metric")[["shipped_error", "calibrated_error"]]
                        .agg(lambda e: e.abs().mean()), index=True)
        print("\nround trips (terms in their units):")
        print_table(trips)
        print("\ntiming:")
        print_table(pd.DataFrame(timing), out)
    return tables


def main(argv=None) -> dict:
    p = make_parser("calibrate_loo", __doc__, "Llama-2-7B and Qwen2.5-7B runs, 3 draws")
    p.add_argument("--draws", type=int, default=None, help="ensemble draws per prediction")
    p.add_argument("--data", default=None, help="another folder of runs.csv + measured.csv")
    args = p.parse_args(argv)
    return run(args.quick, args.out, args.draws, args.data, args.quiet)


if __name__ == "__main__":
    main()
