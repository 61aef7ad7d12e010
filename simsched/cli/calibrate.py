"""``simsched calibrate``: fit a calibrated profile to measured runs; ``run --ensemble N``.

    simsched calibrate --runs runs.csv --measured measured.csv [--experiment NAME ...] -o p.json
    simsched calibrate --bench result.json [--scrape metrics.txt] --gpu h100-sxm
                       (--serve "vllm serve MODEL ..." | --settings server.toml) [--model NAME]
                       -o p.json

Each ``--bench`` file is one run; a ``--scrape`` given after it (a Prometheus ``/metrics`` text
or OpenMetrics file of the same run: the last scrape, minus the first when there are several)
adds its histograms' means (queue, prefill and decode time; TTFT, ITL and E2E where the bench
file has none); not their quantiles, which are only as fine as the buckets.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def add_calibrate_parser(sub) -> None:
    """The ``calibrate`` sub-command's arguments."""
    c = sub.add_parser("calibrate", help="fit a calibrated profile (hardware.profile) to "
                       "measured runs")
    c.add_argument("--runs", metavar="RUNS_CSV", help="runs.csv of the two-file run tables")
    c.add_argument("--measured", metavar="MEASURED_CSV", help="measured.csv (with --runs)")
    c.add_argument("--experiment", action="append", default=[], metavar="NAME",
                   help="only these experiments of --runs (repeatable)")
    c.add_argument("--bench", action="append", default=[], metavar="FILE",
                   help="a vllm bench serve --save-result JSON file (repeatable)")
    c.add_argument("--scrape", action="append", default=[], metavar="FILE",
                   help="Prometheus /metrics text of the --bench run of the same position")
    c.add_argument("--serve", metavar="COMMAND", help="the vllm serve command line of the "
                   "--bench runs' server")
    c.add_argument("--settings", metavar="TOML", help="the server's settings as TOML")
    c.add_argument("--gpu", help="the --bench runs' GPU (catalog name)")
    c.add_argument("--model", help="the catalog model name, if the server's differs")
    c.add_argument("--seed", type=int, default=0, help="seed of the replayed workloads")
    c.add_argument("-o", "--out", default="calibrated-profile.json",
                   help="where to write the profile (default calibrated-profile.json)")


def _bench_runs(args) -> list:
    from simsched.analysis import prometheus_text as pt
    from simsched.analysis.measurements import (Measured, read_serve_command,
                                                read_settings_toml, read_vllm_bench)

    if len(args.scrape) > len(args.bench):
        raise ValueError("--scrape: one per --bench file at most (same order)")
    server = {}
    if args.serve and args.settings:
        raise ValueError("give --serve or --settings, not both")
    if args.serve:
        server = read_serve_command(args.serve)
        server.pop("other", None)
    elif args.settings:
        server = read_settings_toml(args.settings)
    if args.gpu:
        server["gpu"] = args.gpu
    if args.model:
        server["model"] = args.model
    out = []
    for k, path in enumerate(args.bench):
        run = read_vllm_bench(path)
        metrics = dict(run.metrics)
        if k < len(args.scrape):
            scrapes = pt.scrapes(pt.read(args.scrape[k]))
            before = scrapes[0] if len(scrapes) > 1 else None
            # Means only: a histogram's quantiles are as coarse as its buckets.
            for key, value in pt.run_metrics(scrapes[-1], before).items():
                if key.endswith("_mean"):
                    metrics.setdefault(key, value)
        out.append(Measured(run.source, metrics, {**run.settings, **server}, run.requests))
    return out


def cmd_calibrate(args) -> int:
    """``simsched calibrate``: read the runs, fit, write the profile, print the report."""
    from simsched.analysis.measurements import read_run_tables
    from simsched.fit.profile import calibrate

    runs = []
    if args.runs or args.measured:
        if not (args.runs and args.measured):
            raise ValueError("--runs and --measured go together (runs.csv and measured.csv)")
        table = read_run_tables(args.runs, args.measured)
        if args.experiment:
            known = {r.settings["experiment"] for r in table}
            missing = sorted(set(args.experiment) - known)
            if missing:
                raise ValueError(f"--experiment {missing[0]!r} is not in {args.runs}")
            table = [r for r in table if r.settings["experiment"] in args.experiment]
        runs += table
    runs += _bench_runs(args)
    if not runs:
        raise ValueError("no runs: give --runs/--measured or --bench files")
    cal = calibrate(runs, path=args.out, seed=args.seed)
    with pd.option_context("display.width", 200, "display.float_format", "{:.4g}".format):
        print("fitted terms (90 % intervals):")
        print(cal.terms.to_string(index=False))
        print("\nmeasured vs simulated (s), signed error %:")
        cols = ["run", "metric", "measured", "shipped", "calibrated", "shipped_error",
                "calibrated_error"]
        print(cal.report[cols].to_string(index=False))
    print(f"\n{len(runs)} run(s), {cal.document['num_simulations']} simulations, "
          f"{cal.wall_time:.1f} s; wrote {cal.path} (hardware.profile / --profile)")
    return 0


def run_ensemble(args, config) -> int:
    """``simsched run --profile P --ensemble N``: N drawn coefficient sets, intervals."""
    from simsched.analysis.runner import simulate

    ens = simulate(config, ensemble=args.ensemble)
    keys = ("ttft_mean", "ttft_p99", "tpot_mean", "itl_mean", "e2el_mean", "e2el_p99",
            "request_throughput", "output_throughput")
    table = ens.intervals[ens.intervals["metric"].isin(keys)]
    with pd.option_context("display.float_format", "{:.4g}".format):
        print(table.drop(columns="confidence").to_string(index=False))
    path = Path(args.out or "out/run")
    path.mkdir(parents=True, exist_ok=True)
    ens.runs.to_csv(path / "ensemble.csv", index=False)
    ens.intervals.to_csv(path / "intervals.csv", index=False)
    print(f"wrote {path}/: ensemble.csv, intervals.csv ({args.ensemble} draws, "
          f"{ens.confidence:.0%} prediction intervals)")
    return 0


__all__ = ["add_calibrate_parser", "cmd_calibrate", "run_ensemble"]
