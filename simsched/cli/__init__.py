"""The ``simsched`` command: ``run`` one config, ``sweep`` a grid, find ``capacity``, or
``plan`` a deployment.

A config comes from a TOML file (sections ``[scheduler]``, ``[cache]``, ``[hardware]``,
``[workload]``, ``[cluster]``, ``[run]`` and ``[slo]``, or flat field names at the top level; see
the files in ``examples/``), or from the ``config.json`` a run wrote, and/or flags; flags win. Every bad value ends with one line ``simsched: error: ...`` on stderr and
exit status 2; a run in which no request finished exits with status 1. Warnings print as one line
each, ``simsched: warning: ...``.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Sequence

import pandas as pd

from simsched.cli.configs import (FLAG_FIELDS, SECTIONS, build_config, config_from_args,
                                  load_toml, parse_pairs, parse_set_value, parse_value,
                                  read_toml, split_values)
from simsched.config.presets import PRESETS
from simsched.cost.factory import COST_MODELS
from simsched.policies import QUEUE_POLICIES, VICTIM_POLICIES
from simsched.workloads.workload import WORKLOADS

__all__ = ["FLAG_FIELDS", "SECTIONS", "build_config", "config_from_args", "load_toml", "main",
           "make_parser", "parse_value"]

DESCRIPTION = ("Simulate an LLM serving engine's scheduler: run one config, sweep a grid of "
               "configs, find the largest rate that meets latency targets, or plan the "
               "cheapest deployment.")

SUMMARY_COLUMNS = ("num_finished", "num_rejected", "num_unfinished", "num_not_arrived",
                   "ttft_p50", "ttft_p99", "tpot_p99", "itl_p99", "e2el_p99",
                   "request_throughput", "goodput", "slo_attainment", "num_preemptions",
                   "kv_usage_mean", "saturation", "prefix_hit_rate", "num_evicted_blocks",
                   "num_kv_transfers", "kv_transfer_gb", "kv_transfer_time_mean",
                   "kv_transfer_time_p99", "kv_wait_time_mean")


def _version() -> str:
    """The installed package's version (the CLI sits below ``simsched/__init__``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("simsched")
    except PackageNotFoundError:
        return "unknown (not installed)"


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and exit status 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        raise SystemExit(_fail(message))


def _fail(message: str) -> int:
    print(f"simsched: error: {message}", file=sys.stderr)
    return 2


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def _percentile_list(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(p) for p in text.split(",") if p.strip())
    except ValueError:
        values = ()
    if not values or not all(0 < p < 100 for p in values):
        raise argparse.ArgumentTypeError(f"must be comma-separated numbers in (0, 100), "
                                         f"got {text!r}")
    return values


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="config file: TOML (sections " + ", ".join(
        f"[{name}]" for name in (*SECTIONS, "run", "slo")) + ", or flat keys; see examples/) "
        "or the config.json a run wrote")
    g = p.add_argument_group("engine")
    g.add_argument("--preset", choices=sorted(PRESETS),
                   help="engine preset: vllm_v1 schedules as vLLM V1 does (docs/parity.md); "
                        "other flags and settings apply on top")
    g.add_argument("--model", help="model name from the catalog (default llama-2-7b)")
    g.add_argument("--gpu", help="GPU name from the catalog (default a100-80gb)")
    g.add_argument("--tp", type=int, help="tensor-parallel degree")
    g.add_argument("--cost-model", choices=sorted(COST_MODELS),
                   help="iteration cost model (default calibrated)")
    g.add_argument("--policy", choices=sorted(QUEUE_POLICIES), metavar="POLICY",
                   help="waiting-queue order: " + ", ".join(sorted(QUEUE_POLICIES)))
    g.add_argument("--victim-policy", choices=sorted(VICTIM_POLICIES), metavar="POLICY",
                   help="whom to preempt: " + ", ".join(sorted(VICTIM_POLICIES)))
    g.add_argument("--preemption", action=argparse.BooleanOptionalAction, default=None,
                   help="preempt lower-ranked running requests to admit a better waiting one")
    g.add_argument("--max-num-batched-tokens", type=int, help="token budget per iteration")
    g.add_argument("--max-num-seqs", type=int, help="most sequences in a batch")
    g.add_argument("--num-blocks", type=int, help="KV cache blocks (default: derived from GPU)")
    g = p.add_argument_group("workload")
    g.add_argument("--workload", metavar="NAME", help="workload preset: " + ", ".join(WORKLOADS))
    g.add_argument("--rate", type=float, help="mean arrival rate, requests/s")
    g.add_argument("--num-requests", type=int, help="number of requests")
    g.add_argument("--duration", type=float, help="arrival window, seconds")
    g = p.add_argument_group("run")
    g.add_argument("--seed", type=int, help="random seed of the run")
    g.add_argument("--max-sim-time", type=float, help="stop the simulation at this time (s)")
    g.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="any other config field, e.g. --set cache.watermark=0.02 (repeatable); "
                   "tuple and mapping fields as JSON, e.g. --set prompt_range=[10,100] or "
                   "--set replicas='[{\"gpu\":\"h100-sxm\",\"count\":2}]'")
    g.add_argument("--slo-ttft", type=float, help="TTFT SLO for goodput, seconds")
    g.add_argument("--slo-tpot", type=float, help="TPOT SLO for goodput, seconds")
    g.add_argument("--slo-e2el", type=float, help="E2E latency SLO for goodput, seconds")
    g.add_argument("--out", help="output directory (default out/COMMAND)")


def make_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``simsched`` command."""
    p = _Parser(prog="simsched", description=DESCRIPTION)
    p.add_argument("--version", action="version", version=f"simsched {_version()}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="simulate one config; print its summary, write its frames "
                         "and timeline plot")
    _add_common(run)
    run.add_argument("--vllm-json", metavar="FILE",
                     help="also write the run as `vllm bench serve --save-result` would (JSON)")
    run.add_argument("--metric-percentiles", type=_percentile_list, default=(99.0,),
                     metavar="P1,P2,...", help="percentiles in the --vllm-json file (default 99)")
    run.add_argument("--gantt", type=_positive_int, nargs="?", const=50, metavar="N",
                     help="also draw gantt.png: the first N requests' phases (default N=50)")
    run.add_argument("--record-steps", action="store_true",
                     help="also write steps.csv: one row per request per scheduling step "
                          "(tokens scheduled, cache hits, preemptions, completions)")
    run.add_argument("--stream", action="store_true",
                     help="stream the records to Parquet under OUT/stream as the run goes "
                          "(memory bounded by the requests in flight); print per-window sums")
    sw = sub.add_parser("sweep", help="simulate every combination of --vary values")
    _add_common(sw)
    sw.add_argument("--vary", action="append", default=[], metavar="FIELD=V1,V2,...",
                    help="a field and its values, e.g. --vary rate=1,2,4 --vary policy=fcfs,spf "
                    "(tuple fields as JSON: --vary prompt_range=[10,100],[10,500])")
    _add_parallel(sw)
    cap = sub.add_parser("capacity", help="largest rate at which latency targets hold, "
                         "per policy")
    _add_common(cap)
    cap.add_argument("--target", action="append", default=[], metavar="METRIC=LIMIT",
                     help="metric limit, e.g. --target ttft_p99=0.5 --target tpot_p99=0.1")
    cap.add_argument("--min-attainment", type=float,
                     help="least share (0-1] of requests meeting the --slo-* bounds")
    cap.add_argument("--policies", default="fcfs", help="comma-separated policies (default fcfs)")
    cap.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    cap.add_argument("--low", type=float, default=0.5, help="first rate probed (default 0.5)")
    cap.add_argument("--high", type=float, help="highest rate probed (default: 10x the highest "
                     "throughput measured; status never_violated if the target holds there)")
    cap.add_argument("--tol", type=float, default=0.05,
                     help="stop when the bracket is narrower than this share of the rate")
    _add_parallel(cap)
    _add_plan_parser(sub)
    return p


def _add_parallel(p: argparse.ArgumentParser) -> None:
    p.add_argument("--executor", choices=["local", "serial", "ray"], default="local",
                   help="local processes (default), serial, or a Ray cluster")
    p.add_argument("--workers", type=_positive_int,
                   help="local worker processes, >= 1 (default: all cores)")
    p.add_argument("--ray-address", help="address of an existing Ray cluster")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _print_table(frame: pd.DataFrame, keys: Sequence[str]) -> None:
    cols = [c for c in (*keys, *SUMMARY_COLUMNS) if c in frame.columns]
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
    if args.stream:
        return _run_streamed(args, config)
    # A bar for runs longer than a second, where it can be redrawn (not in a redirected log).
    results, summary = run_config(config, slo, progress=sys.stderr.isatty(),
                                  record_steps=args.record_steps)
    summary.update(feature_figures(results))
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
    if args.vllm_json:
        results.to_vllm_bench(args.vllm_json, percentiles=args.metric_percentiles, slo=slo)
        print(f"wrote {args.vllm_json}")
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


def _run_streamed(args, config) -> int:
    """``simsched run --stream``: records to OUT/stream/*.parquet, per-window sums printed."""
    from simsched.analysis.runner import simulate

    path = Path(args.out or "out/run")
    path.mkdir(parents=True, exist_ok=True)
    run = simulate(config, stream_to=path / "stream", progress=sys.stderr.isatty())
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
    if not factors:
        raise ValueError("sweep needs at least one --vary FIELD=V1,V2,...")
    result = sweep(config, executor=args.executor, max_workers=args.workers,
                   progress=not args.quiet, slos=slo, ray_address=args.ray_address, **factors)
    _print_table(result.runs, list(factors))
    path = Path(args.out or "out/sweep")
    result.to_csv(path)
    written = ["runs.csv", "requests.csv", "iterations.csv", "preemptions.csv", "replicas.csv",
               "config.json"]
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


class _WarningPrinter:
    """Prints each distinct warning once, as one line ``simsched: warning: ...`` on stderr."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(self, message, category, filename, lineno, file=None, line=None) -> None:
        text = " ".join(str(message).split())
        if text not in self.seen:
            self.seen.add(text)
            print(f"simsched: warning: {text}", file=sys.stderr)
def _add_plan_parser(sub) -> None:
    pl = sub.add_parser("plan", help="cheapest deployment (GPU, TP, replicas, router) meeting "
                        "latency targets, per rate")
    pl.add_argument("config", help="TOML plan file: config sections plus [plan] (rates, seeds), "
                    "[target] (metric limits, min_attainment), [slo], [prices] and "
                    "[[candidates]] (gpu, tp, router, min_replicas, max_replicas, settings)")
    pl.add_argument("--out", help="output directory (default out/plan)")
    _add_parallel(pl)


def cmd_plan(args) -> int:
    """``simsched plan``: for each candidate and rate, the fewest replicas meeting the target."""
    from simsched.analysis.plan import PLAN_SECTIONS, plan, plan_from_toml

    changes, slo = load_toml(args.config, skip=PLAN_SECTIONS)
    config = build_config(changes)
    data = read_toml(args.config)
    kwargs = plan_from_toml(data, slo)
    result = plan(config.workload, base_config=config, executor=args.executor,
                  max_workers=args.workers, progress=not args.quiet,
                  ray_address=args.ray_address, **kwargs)
    cols = ["rate", "label", "status", "num_replicas", "num_gpus", "gpu_hours_per_million",
            "cost_per_million", "ttft_p99", "tpot_p99", "num_rejected", "pareto"]
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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``simsched`` command; returns the exit status."""
    args = make_parser().parse_args(argv)
    commands = {"run": cmd_run, "sweep": cmd_sweep, "capacity": cmd_capacity, "plan": cmd_plan}
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = _WarningPrinter()
        try:
            return commands[args.command](args)
        except (ValueError, ImportError, OSError) as exc:
            text = str(exc).strip()
            return _fail(text.splitlines()[0] if text else type(exc).__name__)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
