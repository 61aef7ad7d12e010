"""Multi-LoRA serving: how many adapters, how popular, how many GPU slots, and where to route.

Llama-2-7B on A100-80GB replicas (calibrated cost model, default ``vllm_v1`` engine profile),
the lesson workload (Poisson arrivals, clipped lognormal lengths), LoRA adapters of rank 16 on
the attention projections (32 MiB each), loaded from host memory at 25 GB/s + 1 ms or from disk
at 2 GB/s + 10 ms (simsched.config.lora's defaults)::

    python -m experiments.lora [--out out/lora] [--quick] [--quiet]

1. ``adapters``: one replica at 16 req/s, 1 to 128 adapters drawn uniformly or Zipf(1.0),
   ``max_loras=4``, ``max_cpu_loras=16``; and the base model alone. ``per_adapter``: TTFT by
   adapter popularity rank in the Zipf run with 32 adapters.
2. ``max_loras``: 32 adapters, Zipf(1.0), at 16 req/s, ``max_loras`` from 1 to 32 (host memory
   holds all 32): TTFT, throughput and the KV blocks the adapter slots take.
3. ``routing``: 4 replicas at 4 x 16 req/s, 64 adapters, Zipf(0.8), ``max_loras=4``,
   ``max_cpu_loras=8``: ``random``, ``jsq``, ``lora_affinity`` and ``weighted`` (its default
   weights, adapter term included).
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

import simsched
from experiments._common import parser, print_table, save_plot, write_frames
from simsched import SimConfig
from simsched.analysis.plots import _figure
from simsched.config.lora import LoRAConfig

RATE = 16.0                     # requests/s per replica
COUNTS = (1, 8, 32, 128)
POPULARITY = {"uniform": 0.0, "zipf 1.0": 1.0}
MAX_LORAS = (1, 2, 4, 8, 16, 32)
ROUTERS = ("random", "jsq", "lora_affinity", "weighted")
NUM_REPLICAS = 4
COLUMNS = ["ttft_p50", "ttft_p99", "tpot_p50", "request_throughput", "loads_per_request",
           "disk_loads_per_request", "load_time_share"]


def settings(quick: bool) -> dict:
    """Requests per single-replica run (the routing study offers four times as many)."""
    return {"num_requests": 600 if quick else 3000}


def run(cfg: SimConfig) -> tuple[dict, pd.DataFrame]:
    """One run's summary with its adapter loads, and its request frame."""
    res = simsched.simulate(cfg)
    row = dict(res.summary())
    info = res.info
    loads = info.get("lora_num_loads_cpu", 0) + info.get("lora_num_loads_disk", 0)
    n = max(1, row["num_requests"])
    row.update(loads_per_request=loads / n,
               disk_loads_per_request=info.get("lora_num_loads_disk", 0) / n,
               load_time_share=info.get("lora_load_time", 0.0) / (row["duration"]
                                                                   * cfg.cluster.num_replicas),
               num_blocks=info["num_blocks"])
    return row, res.requests


def base_config(num_requests: int, **lora) -> SimConfig:
    """One default replica at :data:`RATE` with ``lora`` (LoRAConfig fields; none: base model)."""
    cfg = SimConfig.preset("classic").replace(num_requests=num_requests, rate=RATE)
    return cfg.replace(lora=LoRAConfig(**lora)) if lora else cfg


def adapters_study(n: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Adapter count x popularity (and the base model); TTFT by popularity rank."""
    row, _ = run(base_config(n))
    rows = [dict(row, popularity="base model", num_adapters=0)]
    per_adapter = None
    for label, zipf in POPULARITY.items():
        for count in COUNTS:
            cfg = base_config(n, max_loras=4, max_cpu_loras=16).replace(
                num_adapters=count, adapter_zipf=zipf)
            row, requests = run(cfg)
            rows.append(dict(row, popularity=label, num_adapters=count))
            if zipf and count == 32:
                per_adapter = _by_rank(requests)
    return pd.DataFrame(rows), per_adapter


def _by_rank(requests: pd.DataFrame) -> pd.DataFrame:
    """TTFT of the Zipf run's requests by their adapter's popularity rank (0: most popular)."""
    groups = {"rank 0": requests.adapter == 0, "ranks 1-3": requests.adapter.between(1, 3),
              "ranks 4-15": requests.adapter.between(4, 15),
              "ranks 16-31": requests.adapter >= 16}
    # Mean TTFT split: waiting for admission (an adapter slot among others), adapter loads in
    # the prefill's steps, and the rest (prefill compute, output path).
    rest = requests.ttft - requests.queue_time - requests.lora_load_time
    return pd.DataFrame([{"adapters": k, "num_requests": int(m.sum()),
                          "ttft_p50": requests.ttft[m].median(),
                          "ttft_p99": requests.ttft[m].quantile(0.99),
                          "ttft_mean": requests.ttft[m].mean(),
                          "waiting_mean": requests.queue_time[m].mean(),
                          "loading_mean": requests.lora_load_time[m].mean(),
                          "rest_mean": rest[m].mean()}
                         for k, m in groups.items()])


def max_loras_study(n: int) -> pd.DataFrame:
    """``max_loras`` from 1 to 32 with 32 Zipf(1.0) adapters, all in host memory."""
    rows = []
    for m in MAX_LORAS:
        cfg = base_config(n, max_loras=m, max_cpu_loras=32).replace(num_adapters=32,
                                                                    adapter_zipf=1.0)
        row, _ = run(cfg)
        rows.append(dict(row, max_loras=m))
    return pd.DataFrame(rows)


def routing_study(n: int) -> pd.DataFrame:
    """Four replicas, 64 Zipf(0.8) adapters: each router."""
    rows = []
    for router in ROUTERS:
        cfg = base_config(NUM_REPLICAS * n, max_loras=4, max_cpu_loras=8).replace(
            num_adapters=64, adapter_zipf=0.8, num_replicas=NUM_REPLICAS, router=router,
            rate=NUM_REPLICAS * RATE)
        row, _ = run(cfg)
        rows.append(dict(row, router=router))
    return pd.DataFrame(rows)


def _plot(adapters: pd.DataFrame, max_loras: pd.DataFrame, routing: pd.DataFrame):
    fig, axes = _figure(None, 3, (13, 3.8))
    base = adapters[adapters.popularity == "base model"].iloc[0]
    for label, rows in adapters[adapters.popularity != "base model"].groupby("popularity"):
        axes[0].plot(rows.num_adapters, rows.ttft_p99, marker="o", label=label)
    axes[0].axhline(base.ttft_p99, color="grey", linestyle="--", label="base model")
    axes[0].set_xscale("log", base=2)
    axes[0].set_yscale("log")
    axes[0].set_xlabel("adapters (max_loras=4, max_cpu_loras=16)")
    axes[0].set_ylabel("p99 TTFT (s)")
    axes[0].legend(fontsize=7)
    axes[1].plot(max_loras.max_loras, max_loras.ttft_p99, marker="o", label="p99 TTFT")
    axes[1].plot(max_loras.max_loras, max_loras.ttft_p50, marker="s", label="p50 TTFT")
    axes[1].set_xscale("log", base=2)
    axes[1].set_yscale("log")
    axes[1].set_xlabel("max_loras (32 adapters, Zipf 1.0)")
    axes[1].set_ylabel("TTFT (s)")
    axes[1].legend(fontsize=7)
    x = np.arange(len(routing))
    axes[2].bar(x - 0.2, routing.ttft_p99, 0.4, label="p99 TTFT (s)")
    loads = axes[2].twinx()
    loads.bar(x + 0.2, routing.disk_loads_per_request, 0.4, color="tab:orange",
              label="disk loads / request")
    loads.set_ylabel("disk loads / request")
    axes[2].set_ylim(0, 1.35 * routing.ttft_p99.max())           # room for the legends
    loads.set_ylim(0, 1.35 * routing.disk_loads_per_request.max())
    axes[2].set_ylabel("p99 TTFT (s)")
    axes[2].set_xticks(x, routing.router, fontsize=8)
    axes[2].set_title(f"{NUM_REPLICAS} replicas, 64 adapters (Zipf 0.8)", fontsize=9)
    axes[2].legend(fontsize=7, loc="upper left")
    loads.legend(fontsize=7, loc="upper right")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(f"Llama-2-7B / A100-80GB, lesson workload, {RATE:g} req/s per replica, "
                 "rank-16 adapters", fontsize=9)
    fig.tight_layout()
    return fig


def main(argv=None) -> dict[str, pd.DataFrame]:
    """Run the three studies; return their tables (``adapters``, ``per_adapter``,
    ``max_loras``, ``routing``) and print them."""
    args = parser("lora", __doc__, "600 requests per replica instead of 3,000").parse_args(argv)
    out = Path(args.out)
    warnings.simplefilter("ignore")
    t0 = time.time()
    n = settings(args.quick)["num_requests"]
    adapters, per_adapter = adapters_study(n)
    max_loras = max_loras_study(n)
    routing = routing_study(n)
    tables = {"adapters": adapters, "per_adapter": per_adapter, "max_loras": max_loras,
              "routing": routing}
    print(f"{time.time() - t0:.0f} s")
    print("\nadapter count and popularity (one replica, max_loras=4, max_cpu_loras=16)")
    print_table(adapters[["popularity", "num_adapters", *COLUMNS]])
    print("\nTTFT by adapter popularity (32 adapters, Zipf 1.0)")
    print_table(per_adapter)
    print("\nmax_loras (32 adapters, Zipf 1.0, all in host memory)")
    print_table(max_loras[["max_loras", "num_blocks", *COLUMNS]])
    print(f"\nrouting ({NUM_REPLICAS} replicas, 64 adapters, Zipf 0.8)")
    print_table(routing[["router", *COLUMNS, "load_imbalance"]])
    write_frames(out, **tables)
    print(f"wrote {out}/")
    save_plot(out / "lora.png", lambda: _plot(adapters, max_loras, routing))
    return tables


if __name__ == "__main__":
    main()
