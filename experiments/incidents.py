"""One GPU failure at the peak of a ServeGen hour: p99 TTFT and SLO attainment over time, with
and without client retries and the autoscaler, and a retry storm.

Sixteen Llama-2-7B replicas, each on one A100-80GB (default engine, least-tokens router),
prompts uniform in 64..1,024 tokens, outputs in 16..256. Arrivals replay the busiest hour of
ServeGen's ``m-large`` day (per-client windows, bundled), scaled so the hour's busiest window
offers ``PEAK_LOAD`` of what the 16 replicas serve, and its windows compressed 6 times (the
hour in 10 minutes; ``--quick``: 30 times, in 2) so it runs in minutes. Replica 0 fails at the
start of the busiest window and is back a minute later (30 s restart, 30 s model load); request
latencies, the failure's downtime, client timeouts, backoffs and the autoscaler's delays are
real seconds (only the load's shape is compressed). SLO: TTFT <= 2 s and TPOT <= 100 ms, per user request from its first send::

    python -m experiments.incidents [--out out/incidents] [--quick] [--quiet] [--img docs/img]

Scenarios: ``no retries`` (a failed request is lost), ``retries, 30 s timeout`` and
``retries, 10 s timeout`` (clients give an attempt up 30 s or 10 s after its send without a
first token and retry failed or timed-out attempts, 3 attempts, backoff 1 s doubling with half
jitter), ``retries + autoscaler`` (the 10 s clients on a threshold autoscaler on waiting
requests that may add up to 4 replicas, 20 s to provision and load), and ``no failure``. The retry storm: the same fleet at ``STORM_LOAD`` of its
capacity with impatient clients (1 s TTFT timeout, 6 attempts, no backoff) against the same
clients without retries and with a retry budget of 10 % and a jittered backoff. A degraded
KV-transfer link in a 4P4D pool (slowed, or down with retries or recomputation):
:mod:`experiments._incidents_links`.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

import simsched
from experiments._common import parser, print_table, save_plot, try_plots, write_frames
from experiments._incidents_links import plot_links, run_links
from simsched import SimConfig
from simsched.analysis.fleet_metrics import slo_met
from simsched.analysis.plots import _figure
from simsched.config.autoscaling import AutoscalingConfig
from simsched.config.faults import FaultsConfig
from simsched.workloads import rate_schedule
from simsched.workloads.workload import WorkloadConfig

NUM_REPLICAS = 16
PEAK_LOAD = 0.85
STORM_LOAD = 1.25
TTFT_SLO, TPOT_SLO = 2.0, 0.1
HOUR, WINDOW = 3600.0, 600.0
DOWN_TIME = (30.0, 30.0)        # restart, model load (seconds, not compressed)
NUM_BINS = 30                   # timeline bins over the hour
RETRIES = dict(max_num_attempts=3, backoff_base_time=1.0, backoff_jitter=0.5)


def settings(quick: bool) -> dict:
    """The time compression: the hour in 10 minutes, or in 2 with ``--quick``."""
    return {"compress": 30.0 if quick else 6.0}


def lengths(**changes) -> WorkloadConfig:
    """The request lengths of every run (uniform prompts and outputs)."""
    return WorkloadConfig(name="custom", lengths="uniform", prompt_range=(64, 1024),
                          output_range=(16, 256), **changes)


def busiest_hour() -> tuple[float, pd.Series]:
    """The start (real s) of the ServeGen day's busiest hour and its windows' total rates."""
    totals = rate_schedule.total_rates(rate_schedule.read_servegen(model="m-large"))
    hourly = totals.rolling(int(HOUR / WINDOW)).sum().to_numpy()
    last = int(np.nanargmax(hourly))
    first = last - int(HOUR / WINDOW) + 1
    return float(first * WINDOW), totals.iloc[first:last + 1].reset_index(drop=True)


def capacity(base: SimConfig) -> float:
    """One replica's throughput (req/s) offered far above it."""
    sat = simsched.simulate(base.replace(workload=lengths(rate=40.0, duration=60.0)))
    return sat.summary()["request_throughput"]


def fleet(base: SimConfig, cap: float, load: float, compress: float) -> tuple[SimConfig, dict]:
    """The 16-replica config replaying the busiest hour at ``load`` (peak window) and the
    incident's times (compressed clock)."""
    start, windows = busiest_hour()
    scale = load * NUM_REPLICAS * cap / windows.max()
    workload = lengths(arrival="servegen", servegen_model="m-large", start=start,
                       duration=HOUR / compress, speedup=compress,
                       rate=scale * float(windows.mean()))
    peak = int(np.argmax(windows.to_numpy()))
    fail_at = peak * WINDOW / compress
    cfg = base.replace(workload=workload, num_replicas=NUM_REPLICAS, router="least_tokens")
    return cfg, {"fail_at": fail_at, "back_at": fail_at + sum(DOWN_TIME),
                 "windows": windows * scale, "compress": compress}


def scenarios(times: dict) -> dict:
    """Name -> FaultsConfig (and autoscaling, or None) of the failure scenarios."""
    failure = dict(replica_failures=((times["fail_at"], 0),), restart_time=DOWN_TIME[0],
                   model_load_time=DOWN_TIME[1])
    auto = AutoscalingConfig(policy="threshold", metric="waiting", target=0.5, interval=5.0,
                             min_replicas=NUM_REPLICAS, max_replicas=NUM_REPLICAS + 4,
                             provisioning_time=10.0, model_load_time=10.0,
                             scale_down_window=60.0)
    return {
        "no failure": (FaultsConfig(ttft_timeout=10.0, **RETRIES), None),
        "no retries": (FaultsConfig(**failure), None),
        "retries, 30 s timeout": (FaultsConfig(ttft_timeout=30.0, **RETRIES, **failure), None),
        "retries, 10 s timeout": (FaultsConfig(ttft_timeout=10.0, **RETRIES, **failure), None),
        "retries + autoscaler": (FaultsConfig(ttft_timeout=10.0, **RETRIES, **failure), auto),
    }


def storm_scenarios(times: dict) -> dict:
    """Name -> FaultsConfig of the retry-storm pair (the same failure, a busier hour)."""
    failure = dict(replica_failures=((times["fail_at"], 0),), restart_time=DOWN_TIME[0],
                   model_load_time=DOWN_TIME[1])
    impatient = dict(ttft_timeout=1.0, max_num_attempts=6, backoff_base_time=0.0, **failure)
    return {"storm: no retries": FaultsConfig(**{**impatient, "max_num_attempts": 1}),
            "storm: no backoff": FaultsConfig(**impatient),
            "storm: budget + backoff": FaultsConfig(**{**impatient, "backoff_base_time": 1.0,
                                                       "backoff_jitter": 1.0,
                                                       "retry_budget": 0.1})}


def run(name: str, cfg: SimConfig, faults: FaultsConfig, auto, times: dict):
    """One scenario: its summary row and its timeline (bins of the hour, by first send)."""
    cfg = cfg.replace(faults=faults)
    if auto is not None:
        cfg = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster,
                                                                   autoscaling=auto))
    res = simsched.simulate(cfg)
    df, att = res.requests, res.attempts
    met = slo_met(df, TTFT_SLO, TPOT_SLO)
    span = HOUR / times["compress"]
    s = res.summary()
    row = {"scenario": name, "num_requests": len(df),
           "attainment": float(met.mean()), "goodput": float(met.sum() / span),
           "ttft_p99": s["ttft_p99"], "num_failed": s["num_failed"],
           "num_timed_out": s["num_timed_out"], "num_attempts": s["num_attempts"],
           "retry_share": s["num_attempts"] / len(df) - 1.0,
           "wasted_prefill_tokens": s["num_wasted_prefill_tokens"],
           "wasted_decode_tokens": s["num_wasted_decode_tokens"]}
    edges = np.linspace(0.0, span, NUM_BINS + 1)
    bins = np.clip(np.digitize(df["arrival_at"].to_numpy(), edges) - 1, 0, NUM_BINS - 1)
    sent = np.clip(np.digitize(att["sent_at"].to_numpy(), edges) - 1, 0, NUM_BINS - 1)
    ttft = df["ttft"].to_numpy()
    rows = []
    for b in range(NUM_BINS):
        mask = bins == b
        finite = ttft[mask & np.isfinite(ttft)]
        rows.append({"scenario": name, "at": edges[b],
                     "num_requests": int(mask.sum()),
                     "attainment": float(met[mask].mean()) if mask.any() else math.nan,
                     "ttft_p99": float(np.percentile(finite, 99)) if len(finite) else math.nan,
                     "attempts_per_request": float((sent == b).sum() / max(1, mask.sum()))})
    return row, pd.DataFrame(rows)


def _plot(timeline: pd.DataFrame, names: list, times: dict, title: str):
    fig, axes = _figure(None, 2, (10, 6.5), nrows=2, ncols=1, sharex=True)
    for name in names:
        t = timeline[timeline["scenario"] == name]
        axes[0].plot(t["at"], t["ttft_p99"], label=name, drawstyle="steps-post")
        axes[1].plot(t["at"], t["attainment"] * 100, label=name, drawstyle="steps-post")
    for ax in axes:
        ax.axvspan(times["fail_at"], times["back_at"], color="0.9", zorder=0)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("TTFT p99 (s, user's view)")
    axes[1].set_ylabel("SLO attainment (%)")
    axes[1].set_xlabel(f"first send, simulated s (the hour's load compressed "
                       f"{times['compress']:g}x; shaded: replica 0 down)")
    axes[0].set_title(title)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def main(argv=None) -> dict[str, pd.DataFrame]:
    """Run every scenario; return ``runs`` (one row each) and ``timeline`` (per bin)."""
    p = parser("incidents", __doc__, "the hour compressed into 2 minutes, not 10")
    p.add_argument("--img", default=None, help="also copy the plots here (docs/img)")
    args = p.parse_args(argv)
    out = Path(args.out)
    compress = settings(args.quick)["compress"]
    base = SimConfig().replace(workload=lengths())
    cap = capacity(base)
    rows, frames = [], []
    cfg, times = fleet(base, cap, PEAK_LOAD, compress)
    for name, (faults, auto) in scenarios(times).items():
        if not args.quiet:
            print(f"running {name} ...", flush=True)
        row, timeline = run(name, cfg, faults, auto, times)
        rows.append(row)
        frames.append(timeline)
    storm_cfg, storm_times = fleet(base, cap, STORM_LOAD, compress)
    for name, faults in storm_scenarios(storm_times).items():
        if not args.quiet:
            print(f"running {name} ...", flush=True)
        row, timeline = run(name, storm_cfg, faults, None, storm_times)
        rows.append(row)
        frames.append(timeline)
    runs = pd.DataFrame(rows)
    runs.attrs.update(capacity=cap, compress=compress, fail_at=times["fail_at"],
                      back_at=times["back_at"], peak_rate=float(times["windows"].max()))
    timeline = pd.concat(frames, ignore_index=True)
    # A degraded KV-transfer link in a disaggregated pool (experiments._incidents_links).
    links, links_timeline, link_times = run_links(
        base, args.quick, None if args.quiet else (lambda m: print(m, flush=True)))
    print_table(runs)
    print_table(links)
    write_frames(out, runs=runs, timeline=timeline, links=links, links_timeline=links_timeline)
    names = list(scenarios(times))
    plots = try_plots(lambda: [
        save_plot(out / "incidents_failure.png", lambda: _plot(
            timeline, names, times, "one replica of 16 fails at the peak")),
        save_plot(out / "incidents_retry_storm.png", lambda: _plot(
            timeline, list(storm_scenarios(storm_times)), storm_times,
            f"a retry storm at {STORM_LOAD:.0%} load")),
        save_plot(out / "incidents_link.png", lambda: plot_links(links_timeline, link_times))])
    if args.img:
        Path(args.img).mkdir(parents=True, exist_ok=True)
        for path in plots:
            if path is not None:
                shutil.copy(path, Path(args.img) / path.name)
    return {"runs": runs, "timeline": timeline, "links": links,
            "links_timeline": links_timeline}


if __name__ == "__main__":
    main()
