"""A ServeGen day on an autoscaled fleet: cost per day against SLO attainment, and what
provisioning delay does during ramps.

Llama-2-7B replicas, each on one A100-80GB (calibrated cost model, default engine settings),
prompts uniform in 64..1,024 tokens, outputs in 16..256. Arrivals replay the first day of
ServeGen's ``m-large`` clients (per client and 10-minute window: rate, CV, Gamma or Weibull gaps;
bundled), scaled so the busiest window offers 85 % of what 16 replicas serve, and compressed in
time (``COMPRESS``: the day in 30 minutes; ``--quick``: in 5) so it runs in minutes. Every time
setting (windows, delays, the autoscaler's interval and stabilisation windows) is compressed by
the same factor; money and replica-hours are quoted per real day (times the factor)::

    python -m experiments.autoscaling [--out out/autoscaling] [--quick] [--quiet]

Scenarios: ``fixed`` (16 replicas all day: peak provisioning), ``threshold`` (HPA-style on
requests running per replica, target: what one replica runs at 70 % of its capacity; scale-down
stabilisation 5 min), ``saturation`` (KV demand against capacity, target: the KV use at 70 %) and
``oracle`` (a plan from the known schedule: each window's replicas at 80 % of capacity, requested
one delay ahead). The three adaptive ones run with a 30 s and a 5 min delay (provisioning plus
model load). SLO: TTFT <= 1 s and TPOT <= 50 ms; *ramp* windows are those whose rate exceeds the
mean of the hour before by 15 % or more. Price: 2 per replica-hour (illustrative).

:func:`removal_comparison` (also run by ``main``, a few seconds) compares what a removed
replica does with its requests (``on_remove``: drain, abort, migrate) in a small fixed scene.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

import simsched
from experiments._common import parser, print_table, save_plot, try_plots, write_frames
from simsched import SimConfig
from simsched.analysis.fleet_metrics import slo_met as fleet_slo_met
from simsched.analysis.plots import _figure
from simsched.config.autoscaling import AutoscalingConfig
from simsched.config.cluster import ClusterConfig
from simsched.workloads import rate_schedule
from simsched.workloads.workload import WorkloadConfig

PEAK_REPLICAS = 16
PEAK_LOAD = 0.85
PRICE = 2.0                     # per replica-hour
TTFT_SLO, TPOT_SLO = 1.0, 0.05
DAY = 86400.0
WINDOW = 600.0
DELAYS = {"30s": (20.0, 10.0), "5min": (240.0, 60.0)}      # provisioning, model load (real s)
RAMP = 0.15


def settings(quick: bool) -> dict:
    """The time compression (the day in 30 or 5 minutes)."""
    return {"compress": 288.0 if quick else 48.0}


def lengths(**changes) -> WorkloadConfig:
    """The request lengths of every run (uniform prompts and outputs)."""
    return WorkloadConfig(name="custom", lengths="uniform", prompt_range=(64, 1024),
                          output_range=(16, 256), **changes)


def calibrate(base: SimConfig) -> dict:
    """One replica's capacity (req/s offered far above it), and what it runs and how much KV
    it uses at 70 % of that: the autoscalers' targets."""
    sat = simsched.simulate(base.replace(workload=lengths(rate=40.0, duration=120.0)))
    capacity = sat.summary()["request_throughput"]
    at70 = simsched.simulate(base.replace(workload=lengths(rate=0.7 * capacity,
                                                           duration=300.0)))
    it = at70.iterations
    weights = it["duration"].to_numpy()
    running = float(np.average(it["num_seqs"], weights=weights))
    kv = float(np.average(it["kv_blocks_used"], weights=weights)) / at70.info["num_blocks"]
    return {"capacity": capacity, "running70": running, "kv70": kv}


def oracle_plan(totals: pd.Series, scale: float, capacity: float, compress: float,
                lead: float) -> tuple:
    """Replicas for each window at 80 % of capacity, requested ``lead`` (compressed s) ahead:
    at any time the larger of the current window's need and the need ``lead`` later."""
    window = WINDOW / compress
    need = np.clip(np.ceil(totals.to_numpy() * scale / (0.8 * capacity)), 1, PEAK_REPLICAS)
    starts = np.arange(len(need)) * window
    times = sorted({0.0} | {max(0.0, s - lead) for s in starts} | set(starts))
    plan, last = [], None
    for t in times:
        here = min(int(t // window), len(need) - 1)
        ahead = min(int((t + lead) // window), len(need) - 1)
        count = int(max(need[here], need[ahead]))
        if count != last:
            plan.append((float(t), count))
            last = count
    return tuple(plan)


def scenarios(cal: dict, totals: pd.Series, scale: float, compress: float) -> dict:
    """Name -> AutoscalingConfig of every scenario."""
    c = compress
    common = dict(interval=30.0 / c, scale_down_window=300.0 / c, price_per_hour=PRICE,
                  min_replicas=1, max_replicas=PEAK_REPLICAS)
    out = {"fixed": AutoscalingConfig(policy="scheduled", plan=((0.0, PEAK_REPLICAS),),
                                      provisioning_time=0.0, model_load_time=0.0, **common)}
    for label, (prov, load) in DELAYS.items():
        delays = dict(provisioning_time=prov / c, model_load_time=load / c)
        out[f"threshold {label}"] = AutoscalingConfig(
            policy="threshold", metric="running", target=cal["running70"], **delays, **common)
        out[f"saturation {label}"] = AutoscalingConfig(
            policy="saturation", kv_target=cal["kv70"], **delays, **common)
        out[f"oracle {label}"] = AutoscalingConfig(
            policy="scheduled", plan=oracle_plan(totals, scale, cal["capacity"], c,
                                                 (prov + load) / c), **delays, **common)
    return out


def ramp_windows(totals: pd.Series) -> np.ndarray:
    """Whether each window's rate exceeds the mean of the hour before by ``RAMP`` or more."""
    rates = totals.to_numpy()
    before = pd.Series(rates).shift(1).rolling(6, min_periods=1).mean().to_numpy()
    return np.nan_to_num(rates / before - 1.0, nan=0.0) >= RAMP


def run_scenario(name: str, base: SimConfig, auto: AutoscalingConfig, compress: float,
                 ramps: np.ndarray, start: int) -> tuple[dict, pd.DataFrame]:
    """One day from ``start`` replicas: its summary row and its per-window table."""
    cfg = dataclasses.replace(base, cluster=ClusterConfig(
        num_replicas=PEAK_REPLICAS if name == "fixed" else start, router="least_tokens",
        autoscaling=auto))
    started = time.time()
    res = simsched.simulate(cfg)
    windows = res.fleet.windows(res.requests, WINDOW / compress, TTFT_SLO, TPOT_SLO)
    windows = windows.iloc[:len(ramps)].copy()
    windows["hour"] = windows["start"] * compress / 3600.0
    windows["ramp"] = ramps[:len(windows)]
    windows["scenario"] = name
    day = min(res.sim_time, DAY / compress)
    met = windows["attainment"] * windows["num_requests"]
    ramp = windows[windows["ramp"]]
    summary = res.summary()
    row = {"scenario": name, "num_requests": len(res.requests),
           "cost_per_day": res.fleet.cost_between(0, day) * compress,
           "replica_hours_per_day": res.fleet.cost_between(0, day) * compress / PRICE,
           "mean_replicas": res.fleet.cost_between(0, day) / PRICE * 3600 / day,
           "peak_replicas": int(windows["routable"].max()),
           "attainment": float(met.sum() / windows["num_requests"].sum()),
           "ramp_attainment": float((ramp["attainment"] * ramp["num_requests"]).sum()
                                    / ramp["num_requests"].sum()) if len(ramp) else math.nan,
           "worst_window": float(windows["attainment"].min()),
           "ttft_p99": summary["ttft_p99"], "tpot_p99": summary["tpot_p99"],
           "wall_s": time.time() - started}
    return row, windows


REMOVAL_OPTIONS = (("drain", 0.0), ("abort", 0.0), ("migrate", 0.0), ("migrate", 2.0))


def removal_comparison() -> pd.DataFrame:
    """What a scale-down does to the requests of the removed replicas, per ``on_remove``.

    A small fixed scene (seconds to run; not the ServeGen day): four replicas serve 20 req/s of
    256-token prompts and 128-token outputs for 40 s, and a plan takes the fleet to two at 20 s,
    with each removal option (``migrate`` with no delay and with a 2 s one). One row per option:
    the removed replicas' billed seconds after the removal, aborted and migrated requests, SLO
    attainment over every request (aborted ones miss), and the latencies."""
    workload = WorkloadConfig(name="custom", arrival="poisson", lengths="fixed", prompt_len=256,
                              output_len=128, rate=20.0, duration=40.0)
    rows = []
    for mode, delay in REMOVAL_OPTIONS:
        auto = AutoscalingConfig(policy="scheduled", plan=((0.0, 4), (20.0, 2)),
                                 provisioning_time=0.0, model_load_time=0.0, interval=5.0,
                                 price_per_hour=PRICE, on_remove=mode, migration_time=delay)
        cfg = SimConfig.preset("classic", workload=workload, cluster=ClusterConfig(
            num_replicas=4, router="least_tokens", autoscaling=auto)).replace(max_num_seqs=16)
        res = simsched.simulate(cfg)
        s, units, df = res.summary(), res.fleet.units, res.requests
        removed = units[units["drain_at"].notna()]
        met = fleet_slo_met(df, TTFT_SLO, TPOT_SLO)
        rows.append({"on_remove": mode, "migration_time": delay,
                     "num_requests": len(df),
                     "billed_after_removal": float((removed["stopped_at"]
                                                    - removed["drain_at"]).sum()),
                     "num_aborted": s.get("num_aborted", 0),
                     "num_migrations": s.get("num_migrations", 0),
                     "attainment": float(met.mean()), "ttft_p99": s["ttft_p99"],
                     "e2el_p99": s["e2el_p99"], "e2el_max": float(df["e2el"].max())})
    return pd.DataFrame(rows)


def _plot_day(windows: pd.DataFrame, names: list[str]):
    fig, axes = _figure(None, 2, (11, 6.5), nrows=2, ncols=1, sharex=True)
    first = windows[windows["scenario"] == names[0]]
    twin = axes[0].twinx()
    twin.fill_between(first["hour"], first["rate"], color="0.85", step="post", label="load")
    twin.set_ylabel("offered load (req/s, compressed clock)")
    axes[0].set_zorder(twin.get_zorder() + 1)
    axes[0].patch.set_visible(False)
    for name in names:
        rows = windows[windows["scenario"] == name]
        axes[0].step(rows["hour"], rows["routable"], where="post", label=name, linewidth=1)
        axes[1].plot(rows["hour"], rows["attainment"] * 100, label=name, linewidth=1)
    axes[0].set_ylabel("routable replicas")
    axes[1].set_ylabel("SLO attainment (%)")
    axes[1].set_xlabel("hour of the ServeGen day (m-large)")
    axes[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def _plot_cost(table: pd.DataFrame):
    fig, axes = _figure(None, 1, (6, 4))
    ax = axes[0]
    markers = "osD^v<>"
    for k, (_, row) in enumerate(table.iterrows()):
        ax.scatter(row["cost_per_day"], row["attainment"] * 100, marker=markers[k % 7],
                   label=row["scenario"])
    ax.legend(fontsize=7)
    ax.set_xlabel(f"cost per day (at {PRICE:g} per replica-hour)")
    ax.set_ylabel("SLO attainment over the day (%)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def main(argv=None) -> dict[str, pd.DataFrame]:
    """Run every scenario; return ``runs`` (one row each) and ``windows`` (per window)."""
    args = parser("autoscaling", __doc__, "the day compressed into 5 minutes, not 30") \
        .parse_args(argv)
    out = Path(args.out)
    warnings.simplefilter("ignore")
    compress = settings(args.quick)["compress"]
    base = SimConfig.preset("classic", workload=lengths())
    cal = calibrate(base)
    table = rate_schedule.read_servegen(model="m-large")
    totals = rate_schedule.total_rates(table)
    # Scale so the busiest window offers PEAK_LOAD of the peak fleet's capacity (real clock).
    scale = PEAK_LOAD * PEAK_REPLICAS * cal["capacity"] / totals.max()
    mean_rate = scale * rate_schedule.mean_rate(table)
    workload = lengths(arrival="servegen", servegen_model="m-large", speedup=compress,
                       rate=mean_rate)
    base = base.replace(workload=workload)
    ramps = ramp_windows(totals)
    # The adaptive fleets start with what the first window needs at 80 % of capacity.
    start = int(min(PEAK_REPLICAS, max(1, math.ceil(totals.iloc[0] * scale
                                                     / (0.8 * cal["capacity"])))))
    rows, frames = [], []
    for name, auto in scenarios(cal, totals, scale, compress).items():
        if not args.quiet:
            print(f"running {name} ...", flush=True)
        row, windows = run_scenario(name, base, auto, compress, ramps, start)
        rows.append(row)
        frames.append(windows)
    runs = pd.DataFrame(rows)
    runs.attrs.update(cal, compress=compress, mean_rate=mean_rate,
                      peak_rate=scale * totals.max(), num_ramp_windows=int(ramps.sum()))
    windows = pd.concat(frames, ignore_index=True)
    removal = removal_comparison()
    print_table(runs.drop(columns=["wall_s"]))
    print_table(removal, out)
    write_frames(out, runs=runs, windows=windows, removal=removal)
    names = list(runs["scenario"])
    try_plots(lambda: [save_plot(out / "autoscaling_day.png",
                                 lambda: _plot_day(windows, names)),
                       save_plot(out / "autoscaling_cost.png", lambda: _plot_cost(runs))])
    return {"runs": runs, "windows": windows, "removal": removal}


if __name__ == "__main__":
    main()
