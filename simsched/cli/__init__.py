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
from typing import Sequence

# The subcommands live in commands.py; feature_figures and SUMMARY_COLUMNS stay importable here.
from simsched.cli.client_flags import add_client_flags
from simsched.cli.calibrate import add_calibrate_parser, cmd_calibrate
from simsched.cli.fault_flags import add_fault_flags
from simsched.cli.commands import (SUMMARY_COLUMNS, cmd_capacity, cmd_plan,  # noqa: F401
                                   cmd_report, cmd_run, cmd_sweep, feature_figures)
from simsched.cli.configs import (FLAG_FIELDS, SECTIONS, build_config, config_from_args,
                                  load_toml, parse_value)
from simsched.config.presets import PRESETS
from simsched.cost.factory import COST_MODELS
from simsched.policies import QUEUE_POLICIES, VICTIM_POLICIES
from simsched.workloads.workload import WORKLOADS

__all__ = ["FLAG_FIELDS", "SECTIONS", "build_config", "config_from_args", "load_toml", "main",
           "make_parser", "parse_value"]

DESCRIPTION = ("Simulate an LLM serving engine's scheduler: run one config, sweep a grid of "
               "configs, find the largest rate that meets latency targets, or plan the "
               "cheapest deployment.")


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
                   help="engine preset: classic gives simsched's defaults before issue 40; "
                        "vllm_v1 (vLLM V1's decisions, docs/parity.md) is the default; "
                        "other flags and settings apply on top")
    g.add_argument("--engine", choices=("vllm", "sglang", "trtllm"),
                   help="whose scheduler runs, at that engine's defaults (as --preset NAME; "
                        "vllm is the default); engine options: --set engine_options='{...}'")
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
    g.add_argument("--profile", metavar="PATH",
                   help="calibrated profile (simsched calibrate) correcting the cost model")
    g = p.add_argument_group("workload")
    g.add_argument("--workload", metavar="NAME", help="workload preset: " + ", ".join(WORKLOADS))
    g.add_argument("--rate", type=float, help="mean arrival rate, requests/s")
    g.add_argument("--num-requests", type=int, help="number of requests")
    g.add_argument("--duration", type=float, help="arrival window, seconds")
    add_client_flags(p)
    add_fault_flags(p)
    g = p.add_argument_group("run")
    g.add_argument("--seed", type=int, help="random seed of the run")
    g.add_argument("--max-sim-time", type=float, help="stop the simulation at this time (s)")
    g.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="any other config field, e.g. --set cache.watermark=0.02 (repeatable); "
                   "tuple and mapping fields as JSON, e.g. --set prompt_range=[10,100] or "
                   "--set replicas='[{\"gpu\":\"h100-sxm\",\"count\":2}]'")
    g.add_argument("--router-config", metavar="FILE",
                   help="llm-d EndpointPickerConfig YAML: routes with the llm-d router "
                   "configured by FILE (sets router=llm-d and router_options.config)")
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
    run.add_argument("--seeds", type=_positive_int, metavar="N",
                     help="run N seeds (the config's seed, +1, ...) and print each metric's mean "
                          "and 95%% t-interval; writes seeds.csv and intervals.csv")
    run.add_argument("--ensemble", type=_positive_int, metavar="N",
                     help="with --profile: run N coefficient sets drawn from the profile's "
                          "posterior and print each metric's mean and 90%% prediction interval; "
                          "writes ensemble.csv and intervals.csv")
    run.add_argument("--energy", action="store_true",
                     help="add the power model's energy figures to the summary and write "
                          "energy.csv (per replica)")
    run.add_argument("--power-cap", type=float, metavar="WATTS",
                     help="each GPU's power cap for the energy figures (implies --energy)")
    run.add_argument("--trace", metavar="FILE",
                     help="also write the run as a Chrome/Perfetto trace (JSON) to FILE")
    run.add_argument("--metrics", metavar="FILE",
                     help="also write vLLM's Prometheus metrics of the run (OpenMetrics) to FILE")
    run.add_argument("--metrics-interval", type=float, default=1.0, metavar="S",
                     help="scrape interval of --metrics, simulated seconds (default 1)")
    run.add_argument("--record-steps", action="store_true",
                     help="also write steps.csv: one row per request per scheduling step "
                          "(tokens scheduled, cache hits, preemptions, completions)")
    run.add_argument("--stream", action="store_true",
                     help="stream the records to Parquet under OUT/stream as the run goes "
                          "(memory bounded by the requests in flight); print per-window sums")
    run.add_argument("--shards", type=_positive_int, metavar="N",
                     help="split the cluster's replicas across N shards run side by side "
                          "(local worker processes), synchronised at every snapshot refresh: the "
                          "same results as one process (needs refresh_interval > 0)")
    run.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                     help="with --shards: run the shards as Ray actors on the cluster at "
                          "ADDRESS (no ADDRESS: a local Ray instance)")
    sw = sub.add_parser("sweep", help="simulate every combination of --vary values")
    _add_common(sw)
    sw.add_argument("--seeds", type=_positive_int, metavar="N",
                    help="run every point with N seeds and write intervals.csv (each metric's "
                         "mean and 95%% t-interval per point; plots draw the bands)")
    sw.add_argument("--ensemble", type=_positive_int, metavar="N",
                    help="with --profile: run every point with N coefficient sets drawn from "
                         "the profile; runs.csv gets each metric's mean and 90%% prediction "
                         "interval (METRIC, METRIC_lo, METRIC_hi), draws.csv one row per draw; "
                         "plots draw the bands")
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
    add_calibrate_parser(sub)
    return p


def _add_parallel(p: argparse.ArgumentParser) -> None:
    p.add_argument("--executor", choices=["local", "serial", "ray"], default="local",
                   help="local processes (default), serial, or a Ray cluster")
    p.add_argument("--workers", type=_positive_int,
                   help="local worker processes, >= 1 (default: all cores)")
    p.add_argument("--ray-address", help="address of an existing Ray cluster")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


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
    pl.add_argument("--ensemble", type=_positive_int, metavar="N",
                    help="run every probe with N coefficient sets drawn from the candidates' "
                         "calibrated profiles (hardware.profile) and add each metric's 90%% "
                         "prediction interval (METRIC_lo, METRIC_hi); overrides [plan] ensemble")
    _add_parallel(pl)
    rep = sub.add_parser("report", help="one self-contained HTML page of a run that "
                         "`simsched run --out DIR` wrote")
    rep.add_argument("directory", help="the run's output directory")
    rep.add_argument("--file", help="where to write the page (default DIR/report.html)")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``simsched`` command; returns the exit status."""
    args = make_parser().parse_args(argv)
    commands = {"run": cmd_run, "sweep": cmd_sweep, "capacity": cmd_capacity, "plan": cmd_plan,
                "report": cmd_report, "calibrate": cmd_calibrate}
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
