"""The ``simsched`` subcommands: ``run``, ``sweep``, ``capacity`` and ``plan``.

Each ``cmd_*`` takes the parsed arguments of :func:`simsched.cli.make_parser`, builds the config
(:mod:`simsched.cli.configs`), runs it, prints a table, writes its files under ``--out`` and
returns the exit status; a bad value raises ValueError, which :func:`simsched.cli.main` prints
as one line.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Sequence

import pandas as pd

from simsched.cli.configs import (build_config, config_from_args, load_toml, parse_pairs,
                                  parse_set_value, read_toml, split_values)

SUMMARY_COLUMNS = ("num_finished", "num_rejected", "num_unfinished", "num_not_arrived",
                   "ttft_p50", "ttft_p99", "tpot_p99", "itl_p99", "e2el_p99",
                   "request_throughput", "goodput", "slo_attainment", "num_preemptions",
                   "kv_usage_mean", "saturation", "prefix_hit_rate", "num_evicted_blocks",
                   "num_kv_transfers", "kv_transfer_gb", "kv_transfer_time_mean",
                   "kv_transfer_time_p99", "kv_wait_time_mean")



# An ensemble sweep's interval ends printed next to these metrics (runs.csv has them all).
INTERVAL_COLUMNS = ("ttft_p99", "tpot_p99", "e2el_p99")


def _print_table(frame: pd.DataFrame, keys: Sequence[str]) -> None:
    cols = [c for c in (*keys, *SUMMARY_COLUMNS) if c in frame.columns]
    cols = [x for c in cols for x in ((c, f"{c}_lo", f"{c}_hi") if c in INTERVAL_COLUMNS
                                      else (c,)) if x in frame.columns]
    with pd.option_context("display.width", 200, "display.max_columns", 40,
                           "display.float_format", "{:.4g}".format):
        print(frame[cols].to_string(index=False))


def _plot(what: str, draw) -> str | None:
    """Draw one figure; a plotting failure costs the figure, never the results already written."""
    try:
        return draw()
    except (ImportError, RuntimeError, ValueError) as exc:
        print(f"simsched: {what} skipped: {exc}", file=sys.stderr)
        return None


def cmd_run(args) -> int:
    """``simsched run``: one simulation."""
    from simsched.analysis import plots
    from simsched.analysis.executors import run_config

    config, slo = config_from_args(args)
    for flag, target in (("--trace", args.trace), ("--metrics", args.metrics)):
        _check_out_file(flag, target)
    if args.power_cap is not None and not args.power_cap > 0:
        raise ValueError(f"--power-cap must be positive watts, got {args.power_cap}")
    if not args.metrics_interval > 0:
        raise ValueError(f"--metrics-interval must be positive, got {args.metrics_interval}")
    if args.seeds and args.ensemble:
        raise ValueError("--seeds and --ensemble: give one (an ensemble varies the seeds too)")
    if args.ray is not None and not args.shards:
        raise ValueError("--ray runs the shards of a sharded run: give --shards N")
    if args.shards and (args.seeds or args.ensemble):
        raise ValueError("--shards runs one simulation: not with --seeds or --ensemble")
    sharding = {} if not args.shards else dict(
        shards=args.shards, shard_workers="process" if args.ray is None else "ray",
        ray_address=args.ray or None)
    if args.ensemble:
        from simsched.cli.calibrate import run_ensemble

        return run_ensemble(args, config)
    if args.seeds:
        return _run_seeds(args, config)
    if args.stream:
        return _run_streamed(args, config, sharding)
    # A bar for runs longer than a second, where it can be redrawn (not in a redirected log).
    results, summary = run_config(config, slo, progress=sys.stderr.isatty(),
                                  record_steps=args.record_steps, **sharding)
    summary.update(feature_figures(results))
    wants_energy = args.energy or args.power_cap is not None
    energy = results.energy(args.power_cap) if wants_energy else None
    if energy is not None:
        summary.update(energy.summary)
    if results.fleet is not None:
        summary.update(fleet_cost=results.fleet.cost,
                       fleet_replica_hours=results.fleet.replica_hours)
    if args.config and Path(args.config).suffix.lower() == ".json":
        _check_derived(args.config, results)
    row = pd.DataFrame([summary])
    _print_table(row, ())
    path = Path(args.out or "out/run")
    path.mkdir(parents=True, exist_ok=True)
    row.to_csv(path / "summary.csv", index=False)
    results.to_csv(path)
    written = ["summary.csv", "requests.csv", "iterations.csv", "preemptions.csv", "replicas.csv",
               "config.json"] + (["steps.csv"] if results.steps is not None else []) \
        + (["fleet_units.csv", "fleet_timeline.csv"] if results.fleet is not None else [])
    if energy is not None:
        energy.replicas.to_csv(path / "energy.csv", index=False)
        written.append("energy.csv")
    if args.vllm_json:
        results.to_vllm_bench(args.vllm_json, percentiles=args.metric_percentiles, slo=slo)
        print(f"wrote {args.vllm_json}")
    if args.trace:
        results.to_perfetto(args.trace)
        print(f"wrote {args.trace}")
    if args.metrics:
        results.to_openmetrics(args.metrics, interval=args.metrics_interval)
        print(f"wrote {args.metrics}")
    if _plot("timeline plot", lambda: plots.timeline(results, path=path / "timeline.png")):
        written.append("timeline.png")
    if args.gantt and _plot("gantt plot", lambda: plots.gantt(
            results, max_requests=args.gantt, path=path / "gantt.png")):
        written.append("gantt.png")
    print(f"wrote {path}/: {', '.join(written)}")
    if summary["num_finished"] == 0:
        print(f"simsched: error: no request finished ({summary['num_rejected']} rejected, "
              f"{summary['num_unfinished']} unfinished, {summary['num_not_arrived']} not "
              f"arrived of {summary['num_requests']})",
              file=sys.stderr)
        return 1
    return 0


def _run_seeds(args, config) -> int:
    """``simsched run --seeds N``: the config over N seeds, each metric with its interval."""
    from simsched.analysis.replicate import replicate

    if args.seeds < 2:
        raise ValueError(f"--seeds must be at least 2 for an interval, got {args.seeds}")
    rep = replicate(config, seeds=args.seeds)
    keys = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "itl_p99", "e2el_p50", "e2el_p99",
            "request_throughput", "output_throughput")
    table = rep.intervals[rep.intervals["metric"].isin(keys)]
    with pd.option_context("display.float_format", "{:.4g}".format):
        print(table.drop(columns="confidence").to_string(index=False))
    path = Path(args.out or "out/run")
    path.mkdir(parents=True, exist_ok=True)
    rep.runs.to_csv(path / "seeds.csv", index=False)
    rep.intervals.to_csv(path / "intervals.csv", index=False)
    # The first seed's frames too, so that `simsched report DIR` has a run to draw.
    rep.runs.iloc[[0]].drop(columns="seed").to_csv(path / "summary.csv", index=False)
    rep.first.to_csv(path)
    print(f"wrote {path}/: seeds.csv, intervals.csv, and seed {rep.runs['seed'].iloc[0]}'s "
          "summary.csv, frames and config.json")
    return 0


def cmd_report(args) -> int:
    """``simsched report DIR``: one self-contained HTML page of a run ``simsched run`` wrote."""
    from simsched.analysis.report import report_from_dir

    out = report_from_dir(args.directory, args.file)
    print(f"wrote {out}")
    return 0


def _check_out_file(flag: str, target) -> None:
    """Refuse an output file that cannot be written, before the run (not after it)."""
    if target is None:
        return
    path = Path(target)
    if path.is_dir():
        raise ValueError(f"{flag} {target}: is a directory, give a file name")
    parent = next((p for p in path.resolve().parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise ValueError(f"{flag} {target}: {parent} is a file, not a directory")


def _run_streamed(args, config, sharding: dict) -> int:
    """``simsched run --stream``: records to OUT/stream/*.parquet, per-window sums printed."""
    from simsched.analysis.runner import simulate

    path = Path(args.out or "out/run")
    path.mkdir(parents=True, exist_ok=True)
    run = simulate(config, stream_to=path / "stream", progress=sys.stderr.isatty(), **sharding)
    _print_table(run.windows, ())
    (path / "config.json").write_text(config.to_json())
    print(f"wrote {path}/: config.json, stream/ (requests/, iterations/, preemptions/ part "
          f"files, windows.parquet, info.json)")
    return 0 if run.windows["num_finished"].sum() else 1


def feature_figures(results) -> dict:
    """The run's figures of the features it used, for the printed summary: the prefix cache's
    hit rate (already in the summary) and, for a disaggregated cluster, its KV transfers
    (``num_kv_transfers``, ``kv_transfer_gb``, transfer time mean and p99, mean wait for a
    transfer to start, in seconds)."""
    import numpy as np

    df = results.requests
    if "kv_transfer_bytes" not in df.columns:
        return {}
    size = df["kv_transfer_bytes"].to_numpy(dtype=float)
    moved = size > 0
    time = df["kv_transfer_time"].to_numpy(dtype=float)[moved]
    wait = df["kv_wait_time"].to_numpy(dtype=float)[moved]
    return {"num_kv_transfers": int(moved.sum()), "kv_transfer_gb": float(size[moved].sum() / 1e9),
            "kv_transfer_time_mean": float(time.mean()) if len(time) else float("nan"),
            "kv_transfer_time_p99": float(np.percentile(time, 99)) if len(time) else float("nan"),
            "kv_wait_time_mean": float(wait.mean()) if len(wait) else float("nan")}


def _check_derived(path, results) -> None:
    """Warn when a rerun of a run's config.json derived other values than the run that wrote it
    (e.g. a different KV cache size after a change to the memory model)."""
    import json

    derived = json.loads(Path(path).read_text()).get("derived")
    if not isinstance(derived, dict):
        return
    now = results.resolved_config()["derived"]
    for key in ("num_blocks", "max_model_len"):
        if key in derived and derived[key] != now.get(key):
            warnings.warn(f"{path}: derived {key} was {derived[key]} in the run that wrote it, "
                          f"{now.get(key)} now: results will differ from that run's")


def cmd_sweep(args) -> int:
    """``simsched sweep``: the grid of --vary values."""
    from simsched.analysis.sweep import sweep

    config, slo = config_from_args(args)
    factors = {key: [parse_set_value(key, v) for v in split_values(values)]
               for key, values in parse_pairs(args.vary, "--vary")}
    if args.seeds:
        if "seed" in factors:
            raise ValueError("give seeds either as --seeds N or as --vary seed=..., not both")
        if args.seeds < 2:
            raise ValueError(f"--seeds must be at least 2 for an interval, got {args.seeds}")
        factors["seed"] = [config.seed + k for k in range(args.seeds)]
    if not factors:
        raise ValueError("sweep needs at least one --vary FIELD=V1,V2,...")
    if args.seeds and args.ensemble:
        raise ValueError("--seeds and --ensemble: give one (an ensemble varies the seeds too)")
    result = sweep(config, executor=args.executor, max_workers=args.workers,
                   progress=not args.quiet, slos=slo, ray_address=args.ray_address,
                   ensemble=args.ensemble, **factors)
    _print_table(result.runs, list(factors))
    path = Path(args.out or "out/sweep")
    result.to_csv(path)
    written = ["runs.csv"] + (["draws.csv"] if result.draws is not None else []) + [
        "requests.csv", "iterations.csv", "preemptions.csv", "replicas.csv", "config.json"]
    if "seed" in factors and len(factors["seed"]) > 1:
        intervals = result.intervals("seed")
        intervals.to_csv(path / "intervals.csv", index=False)
        written.append("intervals.csv")
    rate_key = next((k for k in factors if k.split(".")[-1] == "rate"), None)
    if rate_key is not None and len(factors[rate_key]) > 1:
        from simsched.analysis import plots

        by = [k for k in factors if k != rate_key and k != "seed"]
        if _plot("latency plot", lambda: plots.latency_vs_load(
                result.runs, x=rate_key, by=by, path=path / "latency_vs_load.png")):
            written.append("latency_vs_load.png")
        if _plot("TTFT CDF plot", lambda: plots.ttft_cdf(
                result.requests, result.runs, by=by, panel=rate_key,
                path=path / "ttft_cdf.png")):
            written.append("ttft_cdf.png")
    print(f"wrote {path}/: {', '.join(written)}")
    failed = int((result.runs["num_finished"] == 0).sum())
    if failed:
        print(f"simsched: warning: {failed} of {len(result.runs)} runs finished no request",
              file=sys.stderr)
    return 0


def cmd_capacity(args) -> int:
    """``simsched capacity``: the largest rate meeting the targets, per policy."""
    from simsched.analysis.capacity import SLOTarget, capacity_search

    config, slo = config_from_args(args)
    limits = {}
    for key, value in parse_pairs(args.target, "--target"):
        try:
            limits[key] = float(value)
        except ValueError:
            raise ValueError(f"--target {key} must be a number, got {value!r}") from None
    target = SLOTarget(limits=limits, slo=slo, min_attainment=args.min_attainment)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--seeds must be comma-separated integers, got {args.seeds!r}") from None
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    result = capacity_search(config, target, policies=policies, seeds=seeds, low=args.low,
                             high=args.high, tol=args.tol, executor=args.executor,
                             max_workers=args.workers, progress=not args.quiet,
                             ray_address=args.ray_address)
    with pd.option_context("display.width", 200, "display.float_format", "{:.4g}".format):
        print(result[["policy", "capacity", "ci_low", "ci_high", "status",
                      "max_request_throughput", "num_runs"]].to_string(index=False))
    path = Path(args.out or "out/capacity")
    path.mkdir(parents=True, exist_ok=True)
    result.to_csv(path / "capacity.csv", index=False)
    result.attrs["runs"].to_csv(path / "runs.csv", index=False)
    result.attrs["seed_capacities"].to_csv(path / "seed_capacities.csv", index=False)
    from simsched.analysis.export import resolved_config, write_json

    write_json({"base": resolved_config(config), "target": target, "policies": policies,
                "seeds": seeds, "low": args.low, "high": args.high, "tol": args.tol},
               path / "config.json")
    print(f"wrote {path}/: capacity.csv, runs.csv, seed_capacities.csv, config.json")
    return 0


def cmd_plan(args) -> int:
    """``simsched plan``: for each candidate and rate, the fewest replicas meeting the target."""
    from simsched.analysis.plan import PLAN_SECTIONS, plan, plan_from_toml

    changes, slo = load_toml(args.config, skip=PLAN_SECTIONS)
    config = build_config(changes)
    data = read_toml(args.config)
    kwargs = plan_from_toml(data, slo)
    if args.ensemble is not None:
        kwargs["ensemble"] = args.ensemble
    result = plan(config.workload, base_config=config, executor=args.executor,
                  max_workers=args.workers, progress=not args.quiet,
                  ray_address=args.ray_address, **kwargs)
    cols = ["rate", "label", "status", "num_replicas", "num_gpus", "gpu_hours_per_million",
            "cost_per_million", "ttft_p99", "ttft_p99_lo", "ttft_p99_hi", "tpot_p99",
            "tpot_p99_lo", "tpot_p99_hi", "num_rejected", "pareto"]
    with pd.option_context("display.width", 200, "display.float_format", "{:.4g}".format):
        print(result.table[[c for c in cols if c in result.table]].to_string(index=False))
    path = Path(args.out or "out/plan")
    path.mkdir(parents=True, exist_ok=True)
    result.table.to_csv(path / "plan.csv", index=False)
    result.runs.to_csv(path / "runs.csv", index=False)
    written = ["plan.csv", "runs.csv"]
    try:
        result.plot(path / "cost_vs_ttft.png")
        written.append("cost_vs_ttft.png")
    except ImportError as exc:  # plots are optional: the tables are already written
        print(f"simsched: plots skipped: {exc}", file=sys.stderr)
    print(f"wrote {path}/: {', '.join(written)}")
    return 0
