"""llm-d's router (the ``llm-d`` router family) against simsched's own routers, on real traces.

Llama-3.1-8B replicas on A100-80GB (calibrated cost model, classic preset, prefix caching on).
Four studies::

    python -m experiments.llm_d [--out out/llm_d] [--quick] [--quiet]

1. ``routers``: llm-d's default profile (queue 2 + KV utilisation 2 + approximate prefix 3,
   max-score picker) and simsched's ``jsq``, ``least_kv``, ``prefix_affinity`` and
   ``weighted`` routers on the Mooncake trace (bundled synthetic trace, prompts sharing
   prefixes through its hash ids) and on ServeGen's arrival process (its bundled day of
   per-client windows, uniform lengths), at 80 % of each cluster's capacity (the replica count
   times one replica's saturated throughput on the same workload), 8-64 replicas (8 and 16
   with ``--quick``); the metrics are exact (``refresh_interval = 0``).
2. ``scrape``: the default profile on Mooncake, 8 replicas, with the gauges scraped every
   0, 50 ms (llm-d's default), 200 ms and 500 ms, beside ``jsq`` on the same snapshots.
3. ``pd``: llm-d's P/D handler (``deploy/config/pd-epp-config.yaml``: prefix 2 + queue 1 in
   both profiles, ``prefix-based-pd-decider``) on 4 prefill + 4 decode replicas, Mooncake,
   its ``nonCachedTokens`` threshold swept (0: decode only; ``always-disagg-pd-decider``:
   every request prefilled on a prefill replica).
4. ``slo``: predicted-latency routing (llm-d's Helm predictor profile: latency producer in
   streaming mode, strict and loose prefix-affinity filters around the SLO headroom tier
   filter, latency scorer, weighted-random picker), with its scorer's default ``least``
   headroom strategy and with ``most``, against the default profile, on Mooncake, 8 replicas,
   at 60, 80 and 100 % of capacity, every request carrying a TTFT SLO of 3 s and a TPOT SLO of
   100 ms; SLO attainment is the share of requests meeting both.

Everything is one seed; the tables go to ``--out`` as CSV and the figures as PNG.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import pandas as pd

import simsched
from experiments._common import parser, print_table, save_plot, write_frames
from simsched import SimConfig
from simsched.analysis.plots import _figure
from simsched.analysis.slo import SLO, goodput
from simsched.workloads.workload import WorkloadConfig

ROUTERS = ("llm-d", "jsq", "least_kv", "prefix_affinity", "weighted")
COLUMNS = ["ttft_p50", "ttft_p99", "tpot_p99", "prefix_hit_rate", "load_imbalance"]
SCRAPES = (0.0, 0.05, 0.2, 0.5)
THRESHOLDS = (0, 256, 1024, 4096, 16384)
LOADS = (0.6, 0.8, 1.0)
SLO_TTFT, SLO_TPOT = 3.0, 0.1       # seconds


def settings(quick: bool) -> dict:
    """Requests per run and cluster sizes of the full or quick study."""
    if quick:
        return {"requests": 300, "per_replica": 40, "replicas": (8, 16), "calibrate": 120}
    return {"requests": None, "per_replica": 120, "replicas": (8, 16, 32, 64),
            "calibrate": 400}


def workload(name: str, num_requests: int | None, rate: float) -> WorkloadConfig:
    """``mooncake`` (the bundled trace, rescaled to ``rate``) or ``servegen`` (its arrival
    process at mean ``rate``, uniform lengths)."""
    if name == "mooncake":
        return WorkloadConfig.preset("mooncake", rate=rate, num_requests=num_requests)
    return WorkloadConfig(name="custom", lengths="uniform", prompt_range=(64, 2048),
                          output_range=(16, 256), arrival="servegen", servegen_model="m-large",
                          rate=rate, num_requests=num_requests or 4000)


def base(name: str, num_requests, rate: float, num_replicas: int) -> SimConfig:
    """The study's config for ``name`` at ``rate`` on ``num_replicas`` replicas."""
    return SimConfig.preset("classic", workload=workload(name, num_requests, rate)).replace(
        model="llama-3.1-8b", num_replicas=num_replicas,
        **{"cache.enable_prefix_caching": True})


def capacity(name: str, num_requests: int) -> float:
    """One replica's throughput (requests/s) when offered far more than it serves."""
    return simsched.simulate(base(name, num_requests, 200.0, 1)).summary()["request_throughput"]


def run(cfg: SimConfig, **labels) -> dict:
    """One run's summary figures with ``labels``."""
    res = simsched.simulate(cfg)
    s = res.summary()
    row = {**labels, **{c: s.get(c) for c in COLUMNS}}
    row.update(goodput(res.requests, SLO(ttft=SLO_TTFT, tpot=SLO_TPOT)))
    df = res.requests
    if "prefill_replica" in df:
        row["disaggregated"] = float((df["prefill_replica"] != df["decode_replica"]).mean())
    return row


def pd_config(threshold: int | None) -> dict:
    """llm-d's P/D sample config with ``nonCachedTokens`` = ``threshold`` (None: always)."""
    decider = ({"type": "always-disagg-pd-decider"} if threshold is None else
               {"type": "prefix-based-pd-decider", "parameters": {"nonCachedTokens": threshold}})
    return {"plugins": [
        {"type": "prefix-cache-scorer"}, {"type": "queue-scorer"}, {"type": "prefill-filter"},
        {"type": "decode-filter"}, {"type": "max-score-picker"}, decider,
        {"type": "disagg-profile-handler", "parameters": {"deciders": {"prefill":
                                                                      decider["type"]}}}],
        "schedulingProfiles": [{"name": role, "plugins": [
            {"pluginRef": f"{role}-filter"}, {"pluginRef": "max-score-picker"},
            {"pluginRef": "prefix-cache-scorer", "weight": 2},
            {"pluginRef": "queue-scorer", "weight": 1}]} for role in ("prefill", "decode")]}


def predictor_config(strategy: str = "least") -> dict:
    """llm-d's predictor profile (its Helm chart's, the latency producer streaming), the latency
    scorer's ``headroomSelectionStrategy`` = ``strategy``."""
    return {"plugins": [
        {"type": "predicted-latency-producer", "parameters": {"streamingMode": True}},
        {"name": "strict-affinity-filter", "type": "prefix-cache-affinity-filter",
         "parameters": {"affinityThreshold": 0.99}},
        {"name": "loose-affinity-filter", "type": "prefix-cache-affinity-filter",
         "parameters": {"affinityThreshold": 0.80}},
        {"type": "latency-scorer", "parameters": {"headroomSelectionStrategy": strategy}},
        {"type": "weighted-random-picker"}, {"type": "slo-headroom-tier-filter"},
        {"type": "latency-slo-admitter"}],
        "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": p} for p in (
            "predicted-latency-producer", "strict-affinity-filter", "slo-headroom-tier-filter",
            "loose-affinity-filter", "latency-scorer", "weighted-random-picker")]}]}


PROFILES = {"default": {},
            "predicted (least)": {"config": predictor_config("least")},
            "predicted (most)": {"config": predictor_config("most")}}


def studies(cfg: dict, progress: bool) -> dict[str, pd.DataFrame]:
    """The four studies' tables."""
    rows, scrape, pd_rows, slo = [], [], [], []
    caps = {name: capacity(name, cfg["calibrate"]) for name in ("mooncake", "servegen")}
    for name, cap1 in caps.items():
        for n in cfg["replicas"]:
            count = cfg["requests"] and max(cfg["requests"], cfg["per_replica"] * n)
            for router in ROUTERS:
                if progress:
                    print(f"{name}, {n} replicas, {router}", flush=True)
                rows.append(run(base(name, count, 0.8 * n * cap1, n).replace(router=router),
                                workload=name, num_replicas=n, router=router,
                                rate=0.8 * n * cap1))
    n = 8
    moon = base("mooncake", cfg["requests"], 0.8 * n * caps["mooncake"], n)
    for interval in SCRAPES:
        for router in ("llm-d", "jsq"):
            scrape.append(run(moon.replace(router=router, refresh_interval=interval),
                              router=router, refresh_interval=interval))
    roles = ("prefill",) * 4 + ("decode",) * 4
    for threshold in THRESHOLDS + (None,):
        pd_rows.append(run(moon.replace(router="llm-d", roles=roles,
                                        router_options={"config": pd_config(threshold)}),
                           non_cached_tokens=-1 if threshold is None else threshold))
    for load in LOADS:
        for profile, options in PROFILES.items():
            if progress:
                print(f"SLO study, {load:.0%} load, {profile}", flush=True)
            options = {**options, "slo_ttft_ms": SLO_TTFT * 1000, "slo_tpot_ms": SLO_TPOT * 1000}
            slo.append(run(base("mooncake", cfg["requests"], load * n * caps["mooncake"], n)
                           .replace(router="llm-d", router_options=options),
                           load=load, profile=profile))
    return {"routers": pd.DataFrame(rows), "scrape": pd.DataFrame(scrape),
            "pd": pd.DataFrame(pd_rows), "slo": pd.DataFrame(slo), "capacity": pd.DataFrame(
                [{"workload": k, "replica_capacity": v} for k, v in caps.items()])}


def plot_routers(table: pd.DataFrame):
    """p99 TTFT per router against the replica count, one panel per workload."""
    names = list(dict.fromkeys(table["workload"]))
    fig, axes = _figure(None, len(names), figsize=(5 * len(names), 3.6))
    for ax, name in zip(axes, names):
        part = table[table["workload"] == name]
        for router, g in part.groupby("router", sort=False):
            ax.plot(g["num_replicas"], g["ttft_p99"], marker="o", label=router)
        ax.set(title=f"{name}, 80 % load", xlabel="replicas", ylabel="p99 TTFT (s)")
        ax.set_xscale("log", base=2)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_scrape(table: pd.DataFrame):
    """p99 TTFT against the scrape interval."""
    fig, (ax,) = _figure(None, 1, figsize=(5, 3.6))
    for router, g in table.groupby("router", sort=False):
        ax.plot(g["refresh_interval"] * 1000, g["ttft_p99"], marker="o", label=router)
    ax.set(title="Mooncake, 8 replicas: stale gauges", xlabel="scrape interval (ms)",
           ylabel="p99 TTFT (s)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_pd(table: pd.DataFrame):
    """TTFT and TPOT against the P/D threshold."""
    fig, (ax,) = _figure(None, 1, figsize=(5, 3.6))
    t = table[table["non_cached_tokens"] >= 0]
    labels = [str(v) for v in t["non_cached_tokens"]] + ["always"]
    x = range(len(labels))
    full = pd.concat([t, table[table["non_cached_tokens"] < 0]])
    ax.plot(x, full["ttft_p99"], marker="o", label="p99 TTFT (s)")
    ax.plot(x, full["tpot_p99"] * 10, marker="s", label="p99 TPOT (s) x 10")
    ax.set_xticks(list(x), labels)
    ax.set(title="P/D 4+4, Mooncake", xlabel="nonCachedTokens (0: decode only)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_slo(table: pd.DataFrame):
    """SLO attainment against the load, per profile."""
    fig, (ax,) = _figure(None, 1, figsize=(5, 3.6))
    for profile, g in table.groupby("profile", sort=False):
        ax.plot(g["load"] * 100, g["slo_attainment"] * 100, marker="o", label=profile)
    ax.set(title=f"Mooncake, 8 replicas: TTFT {SLO_TTFT:g} s, TPOT {SLO_TPOT * 1000:g} ms",
           xlabel="load (% of capacity)", ylabel="SLO attainment (%)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def main(argv=None) -> dict[str, pd.DataFrame]:
    """Run the studies, print and write their tables and figures; return the tables."""
    args = parser("llm_d", __doc__, "300 requests a run, 8 and 16 replicas").parse_args(argv)
    out = Path(args.out)
    warnings.simplefilter("ignore")
    t0 = time.time()
    tables = studies(settings(args.quick), not args.quiet)
    print(f"{time.time() - t0:.0f} s")
    print_table(tables["capacity"])
    print("\nrouters at 80 % load, exact metrics")
    print_table(tables["routers"][["workload", "num_replicas", "router", *COLUMNS]], digits=3)
    print("\nscrape interval (Mooncake, 8 replicas)")
    print_table(tables["scrape"], digits=3)
    print("\nP/D threshold (4 prefill + 4 decode, Mooncake; -1: always)")
    print_table(tables["pd"], digits=3)
    print(f"\npredicted latency against the default profile (Mooncake, 8 replicas, SLO TTFT "
          f"{SLO_TTFT:g} s, TPOT {SLO_TPOT:g} s)")
    print_table(tables["slo"][["load", "profile", "slo_attainment", "goodput", "ttft_p50",
                               "ttft_p99", "tpot_p99"]], digits=3)
    write_frames(out, **tables)
    save_plot(out / "routers.png", lambda: plot_routers(tables["routers"]))
    save_plot(out / "scrape.png", lambda: plot_scrape(tables["scrape"]))
    save_plot(out / "pd.png", lambda: plot_pd(tables["pd"]))
    save_plot(out / "slo.png", lambda: plot_slo(tables["slo"]))
    print(f"wrote {out}/")
    return tables


if __name__ == "__main__":
    main()
