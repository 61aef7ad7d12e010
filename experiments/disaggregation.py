"""Colocated vs disaggregated prefill/decode on 8 A100-80GB GPUs serving Llama-3-8B.

    python -m experiments.disaggregation [--quick] [--out out/disaggregation]

A fixed budget of 8 GPUs (8 replicas, tensor parallel 1) is laid out colocated (8 mixed
replicas, chunked prefill, ``least_tokens`` routing) or as every xPyD split (x prefill + y
decode replicas, x + y = 8; ``least_tokens`` routing in each pool; KV over InfiniBand at
200 Gb/s per GPU). For ShareGPT and Azure-conversation lengths (Poisson arrivals), the
capacity search finds the highest rate at which 90 % of requests meet TTFT <= 1 s and
TPOT <= 40 ms, then TTFT <= 1 s and TPOT <= 25 ms (and nothing is left unfinished), reported
per GPU. The best split is then
rerun with link bandwidths from 1 to 300 GB/s per GPU to see where disaggregation stops
paying. Each probe simulates ``num_requests`` requests (1000; --quick: 300 and a coarser
search over ShareGPT only, fewer splits and bandwidths).
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import pandas as pd

from experiments._common import parser, print_table, save_plot, write_frames
from simsched import SimConfig
from simsched.analysis.capacity import SLOTarget, capacity_search
from simsched.analysis.slo import SLO

NUM_GPUS = 8
# (TTFT, TPOT) bounds in seconds; 90 % of requests must meet both. The first also drives the
# bandwidth sweep.
SLOS = {"ttft1s_tpot40ms": (1.0, 0.04), "ttft1s_tpot25ms": (1.0, 0.025)}
WORKLOADS = {"sharegpt": "sharegpt", "azure_conv": "azure-conv"}
# The capacity search stops once its bracket is narrower than TOL x its lower end (--quick: 0.25).
TOL = 0.08


def base_config(workload: str, num_requests: int) -> SimConfig:
    """Llama-3-8B on A100-80GB replicas; Poisson arrivals with the workload's lengths."""
    lengths = "empirical" if workload == "sharegpt" else "trace"
    return SimConfig.preset("classic").replace(
        model="llama-3-8b", gpu="a100-80gb", name=workload, arrival="poisson",
        lengths=lengths, num_requests=num_requests, num_replicas=NUM_GPUS,
        router="least_tokens", long_prompt_policy="clip", max_sim_time=3600.0)


def layouts(quick: bool) -> dict[str, dict]:
    """Label -> config changes: colocated and the xPyD splits."""
    out = {"colocated": {"num_prefill_replicas": 0, "num_decode_replicas": 0}}
    splits = (2, 4, 6) if quick else range(1, NUM_GPUS)
    for x in splits:
        out[f"{x}P{NUM_GPUS - x}D"] = {"num_prefill_replicas": x,
                                        "num_decode_replicas": NUM_GPUS - x}
    return out


def target(slo: str) -> SLOTarget:
    """90 % of requests within the named (TTFT, TPOT) bounds."""
    ttft, tpot = SLOS[slo]
    return SLOTarget(slo=SLO(ttft=ttft, tpot=tpot), min_attainment=0.9)


def search(base: SimConfig, variants: dict, quick: bool, progress: bool,
           slo: str = "ttft1s_tpot40ms") -> pd.DataFrame:
    """Capacity (req/s) of each variant at the SLO target, and per GPU."""
    cap = capacity_search(base, target(slo), policies=variants, low=1.0,
                          tol=0.25 if quick else TOL, progress=progress)
    table = cap[["policy", "capacity", "status", "num_runs"]].rename(
        columns={"policy": "layout"})
    table["capacity_per_gpu"] = table["capacity"] / NUM_GPUS
    table.attrs = {}            # the search's run frames are not needed (and break concat)
    return table


def main(argv=None) -> pd.DataFrame:
    """Run the study; return the capacity table (the bandwidth sweep in ``attrs``)."""
    quick = "300 requests per probe, ShareGPT and the first SLO only, 3 splits, coarse search"
    args = parser("disaggregation", __doc__, quick).parse_args(argv)
    out = Path(args.out)
    warnings.simplefilter("ignore")          # clipped-prompt notices
    t0 = time.time()
    n = 300 if args.quick else 1000
    names = ["sharegpt"] if args.quick else list(WORKLOADS)
    slos = list(SLOS)[:1] if args.quick else list(SLOS)
    tables = []
    for slo in slos:
        for name in names:
            t = search(base_config(WORKLOADS[name], n), layouts(args.quick), args.quick,
                       not args.quiet, slo)
            tables.append(t.assign(workload=name, slo=slo))
    table = pd.concat(tables, ignore_index=True)[
        ["slo", "workload", "layout", "capacity", "capacity_per_gpu", "status", "num_runs"]]
    print(f"SLO: >= 90 % of requests within the TTFT and TPOT bounds; {n} requests per probe")
    print_table(table, digits=3)
    # Bandwidth sweep: the best split of the first workload against colocated.
    first = table[(table["workload"] == names[0]) & (table["slo"] == slos[0])]
    split = first[first["layout"] != "colocated"].sort_values("capacity").iloc[-1]["layout"]
    x = int(split.split("P")[0])
    bandwidths = (1.0, 5.0, 25.0) if args.quick else (0.5, 1.0, 2.0, 5.0, 12.5, 25.0, 50.0, 300.0)
    variants = {f"{split}@{bw:g}GB/s": {"num_prefill_replicas": x,
                                        "num_decode_replicas": NUM_GPUS - x,
                                        "link_bandwidth_gbps": bw} for bw in bandwidths}
    bw = search(base_config(WORKLOADS[names[0]], n), variants, args.quick, not args.quiet)
    bw.insert(1, "link_bandwidth_gbps", list(bandwidths))
    colocated = float(first.loc[first["layout"] == "colocated", "capacity"].iloc[0])
    bw["vs_colocated"] = bw["capacity"] / colocated
    print(f"{names[0]}: {split} by link bandwidth (GB/s per GPU) vs colocated "
          f"({colocated:.3g} req/s)")
    print_table(bw, digits=3)
    detail = anatomy(base_config(WORKLOADS[names[0]], n), split, colocated)
    print(f"{names[0]} at {colocated:.3g} req/s (colocated capacity): where the time goes")
    print_table(detail, digits=3)
    print(f"done in {time.time() - t0:.0f} s")
    write_frames(out, capacity=table, bandwidth=bw, anatomy=detail)
    print(f"wrote {out}/")
    save_plot(out / "capacity_per_gpu.png", lambda: _plot_capacity(table))
    save_plot(out / "bandwidth.png", lambda: _plot_bandwidth(bw, colocated, split))
    table.attrs["bandwidth"] = bw
    table.attrs["anatomy"] = detail
    return table


def anatomy(base: SimConfig, split: str, rate: float) -> pd.DataFrame:
    """Colocated vs ``split`` (InfiniBand 200, then 1 GB/s) at one rate: latencies, the share of
    requests within each bound, and the transfers."""
    from simsched.analysis.runner import simulate

    x = int(split.split("P")[0])
    rows = []
    xy = {"num_prefill_replicas": x, "num_decode_replicas": NUM_GPUS - x}
    for label, changes in (("colocated", {}), (split, xy),
                           (f"{split}@1GB/s", {**xy, "link_bandwidth_gbps": 1.0})):
        res = simulate(base.replace(rate=rate, **changes))
        s, df = res.summary(), res.requests
        row = {"layout": label, "ttft_p50": s["ttft_p50"], "ttft_p90": s["ttft_p90"],
               "tpot_p50": s["tpot_p50"], "tpot_p90": s["tpot_p90"]}
        slo = SLOS["ttft1s_tpot40ms"]
        good = (df["ttft"] <= slo[0]) & ((df["tpot"] <= slo[1]) | df["tpot"].isna())
        row["slo_attainment"] = float(good[df["status"] == "finished"].sum() / len(df))
        row["ttft_ok"] = float((df["ttft"] <= slo[0]).mean())
        row["tpot_ok"] = float(((df["tpot"] <= slo[1]) | df["tpot"].isna()).mean())
        if "kv_transfer_time" in df:
            row["kv_transfer_time_mean"] = float(df["kv_transfer_time"].mean())
            row["kv_wait_time_mean"] = float(df["kv_wait_time"].mean())
            row["kv_transfer_mb_mean"] = float(df["kv_transfer_bytes"].mean() / 1e6)
        rows.append(row)
    return pd.DataFrame(rows)


def _plot_capacity(table: pd.DataFrame):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    cols = table.assign(case=table["workload"] + ", " + table["slo"])
    wide = cols.pivot(index="layout", columns="case", values="capacity_per_gpu")
    wide = wide.loc[list(dict.fromkeys(table["layout"]))]
    wide.plot.bar(ax=ax, rot=0)
    ax.legend(fontsize=7)
    ax.set_ylabel("req/s per GPU at 90 % SLO")
    ax.set_title("8 x A100-80GB, Llama-3-8B: colocated vs xPyD")
    fig.tight_layout()
    return fig


def _plot_bandwidth(bw: pd.DataFrame, colocated: float, split: str):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(bw["link_bandwidth_gbps"], bw["capacity"] / NUM_GPUS, "o-", label=split)
    ax.axhline(colocated / NUM_GPUS, color="gray", ls="--", label="colocated")
    ax.set_xscale("log")
    ax.set_xlabel("link bandwidth per GPU (GB/s)")
    ax.set_ylabel("req/s per GPU at 90 % SLO")
    ax.legend()
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    main()
