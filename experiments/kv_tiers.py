"""Tiered KV cache: hit rate and TTFT with CPU, SSD and a shared remote store below the GPU.

Four studies (simsched.engine.kv.tiers; docs/kv_tiers.md)::

    python -m experiments.kv_tiers [--out out/kv_tiers] [--quick]

1. ``mooncake``: Mooncake's conversation trace (3,993 requests, mean prompt 15.3k tokens) on
   Llama-3.1-8B / one A100-80GB at 0.5 req/s, as in docs/prefix_caching.md: GPU only, then a
   CPU tier of 64 GiB to 2 TiB and unbounded, a CPU tier over an SSD, an SSD alone.
2. ``cluster``: the same trace at 2 req/s on 4 replicas (round robin, so a conversation's turns
   land on different replicas): GPU only, a 256 GiB CPU tier each, a remote store shared by
   all four (unbounded, 100 Gb/s), and both.
3. ``sessions``: long-context multi-turn conversations (6 turns, 2-6k new tokens a turn, each
   prompt the whole history, a minute of think time between turns) on Llama-3.1-8B / A100:
   GPU only and CPU tiers of several sizes, SSD.
4. ``reload``: the reload-vs-recompute TTFT of two published measurements, configured like them
   (see :data:`MEASURED`): each client's prompt is a conversation whose earlier part was served
   before and since pushed out of the GPU to the CPU tier; cold: nothing cached.

Every row has the hit rate (prompt tokens served from any cache), the share of prompt tokens
each tier served, TTFT p50/p99 and its mean split into waiting (arrival to first admission),
loading (step time the request's loads added) and computing (the rest), and the bytes moved.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from experiments._common import parser as make_parser
from experiments._common import print_table, save_plot, try_plots, write_frames
from simsched import SimConfig
from simsched.analysis.runner import run as run_engine
from simsched.workloads.workload import WorkloadConfig

GPU_BLOCKS = 19477      # Llama-3.1-8B on one A100-80GB at 90 % memory, 16-token blocks (38 GiB)
# (name, TTFT recompute s, TTFT reload s, source)
MEASURED = {"hicache_8k": (1.725, 0.482, "SGLang HiCache, 8k input (sglang #26305)"),
            "vllm_70b_3k": (2.140, 1.280, "Llama-3.1-70B, 3,072-token prompt, CPU reload "
                                          "(vLLM PR #45947)")}


def tiers(*specs, overlap: bool = False) -> dict:
    """The config change for tiers ``specs`` (mappings of KVTierConfig fields)."""
    return {"cache.enable_prefix_caching": True,
            "cache.kv_tiers": {"tiers": list(specs), "overlap_layers": overlap}}


def cpu(gib=None) -> dict:
    return {"name": "cpu", "capacity_gib": gib}


def disk(gib=None) -> dict:
    return {"name": "disk", "capacity_gib": gib}


def run(cfg: SimConfig, **labels) -> dict:
    """One simulation: its labels, hit rates per tier, TTFT and its split, bytes moved."""
    started = time.perf_counter()
    res, engine = run_engine(cfg, keep_engine=True)
    s = res.summary()
    df = res.requests
    row = dict(labels)
    caches = [r.kv for r in engine.replicas]
    admitted = df["first_scheduled_at"].notna().to_numpy()
    prompt = float(df["num_prompt_tokens"].to_numpy()[admitted].sum())
    row["hit_rate"] = s.get("prefix_hit_rate", 0.0)
    seen = {}
    for kv in caches:
        for tier in getattr(kv, "tiers", ()):
            seen[id(tier)] = tier           # a shared tier counts once
    per = {}
    for tier in seen.values():
        per[tier.name] = per.get(tier.name, 0) + tier.num_hit_tokens
    for name in ("cpu", "disk", "remote"):
        row[f"hit_{name}"] = per.get(name, 0) / prompt
    row["hit_gpu"] = row["hit_rate"] - sum(row[f"hit_{n}"] for n in ("cpu", "disk", "remote"))
    row.update(ttft_p50=s["ttft_p50"], ttft_p99=s["ttft_p99"])
    row.update(ttft_split(df, caches))
    row["load_gb"] = sum(t.num_load_bytes for t in seen.values()) / 1e9
    row["store_gb"] = sum(t.num_store_bytes for t in seen.values()) / 1e9
    row.update(throughput=s["request_throughput"], num_finished=s["num_finished"],
               wall_s=time.perf_counter() - started)
    return row


def ttft_split(df: pd.DataFrame, caches) -> dict:
    """Mean TTFT split over first tokens: waiting (arrival to first admission), loading (the
    step time its tier loads added) and computing (the rest)."""
    done = df["ttft"].notna().to_numpy()
    ids = df["request_id"].to_numpy()[done]
    loads = {}
    for kv in caches:
        loads.update(getattr(kv, "load_time_of", {}))
    loading = np.array([loads.get(int(i), 0.0) for i in ids])
    waiting = (df["first_scheduled_at"] - df["arrival_at"]).to_numpy()[done]
    ttft = df["ttft"].to_numpy()[done]
    return {"ttft_mean": float(ttft.mean()), "ttft_waiting": float(waiting.mean()),
            "ttft_loading": float(loading.mean()),
            "ttft_computing": float((ttft - waiting - loading).mean())}


def mooncake(quick: bool) -> pd.DataFrame:
    """GPU only, then a CPU tier, an SSD alone and an SSD under a 128 GiB CPU tier, each swept
    over its capacity (``gib``), on one replica."""
    wl = WorkloadConfig.preset("mooncake", rate=0.5, num_requests=1200 if quick else None)
    base = SimConfig.preset("classic", workload=wl).replace(model="llama-3.1-8b",
                                          **{"cache.enable_prefix_caching": True})
    rows = [run(base, setup="gpu only", gib=0.0)]
    sizes = (64, 256, 1024, None) if quick else (64, 128, 256, 512, 1024, 2048, None)
    for gib in sizes:
        size = np.inf if gib is None else float(gib)
        rows.append(run(base.replace(**tiers(cpu(gib))), setup="cpu", gib=size))
        rows.append(run(base.replace(**tiers(disk(gib))), setup="ssd", gib=size))
        rows.append(run(base.replace(**tiers(cpu(128), disk(gib))), setup="cpu 128 GiB + ssd",
                        gib=size))
    rows.append(run(base.replace(**tiers(cpu(), overlap=True)), setup="cpu, overlapped",
                    gib=np.inf))
    return pd.DataFrame(rows)


def cluster(quick: bool) -> pd.DataFrame:
    """4 replicas, round robin: GPU only, 256 GiB CPU tiers, a shared remote store (swept over
    its capacity, ``gib``), both."""
    wl = WorkloadConfig.preset("mooncake", rate=2.0, num_requests=1200 if quick else None)
    base = SimConfig.preset("classic", workload=wl).replace(model="llama-3.1-8b", **{
        "cache.enable_prefix_caching": True, "cluster.num_replicas": 4,
        "cluster.router": "round_robin"})

    def remote(gib):
        return {"cluster.kv_remote_tier": {"name": "remote", "capacity_gib": gib}}

    rows = [run(base, setup="gpu only", gib=0.0),
            run(base.replace(**tiers(cpu(256))), setup="cpu 256 GiB each", gib=0.0)]
    for gib in ((1024, None) if quick else (512, 1024, 2048, 4096, 8192, None)):
        size = np.inf if gib is None else float(gib)
        rows.append(run(base.replace(**tiers(), **remote(gib)), setup="remote", gib=size))
    rows.append(run(base.replace(**tiers(cpu(256)), **remote(None)),
                    setup="cpu 256 GiB each + remote", gib=np.inf))
    return pd.DataFrame(rows)


def sessions(quick: bool) -> pd.DataFrame:
    """Long-context multi-turn conversations: GPU only, then a CPU tier and an SSD, each swept
    over its capacity (``gib``)."""
    n = 40 if quick else 120
    wl = WorkloadConfig(name="sessions", num_turns=6, rate=n / 600, num_requests=n,
                        think_time=("exponential", 60.0), lengths="uniform",
                        prompt_range=(2000, 6000), output_range=(200, 600))
    base = SimConfig.preset("classic", workload=wl).replace(model="llama-3.1-8b",
                                          **{"cache.enable_prefix_caching": True})
    rows = [run(base, setup="gpu only", gib=0.0)]
    for gib in ((32, 128, None) if quick else (16, 32, 64, 128, 256, None)):
        size = np.inf if gib is None else float(gib)
        rows.append(run(base.replace(**tiers(cpu(gib))), setup="cpu", gib=size))
        rows.append(run(base.replace(**tiers(disk(gib))), setup="ssd", gib=size))
    return pd.DataFrame(rows)


def burst(num_clients: int, prompt: int, reused: int, filler: bool,
          gap: float = 30.0) -> list[dict]:
    """Each client's conversation: a first request of ``reused`` tokens (at 0), with ``filler``
    other content that pushes it out of the GPU (at ``gap / 2``), then its ``prompt``-token
    continuation (at ``gap``), all clients at once. ``reused=0``: no first request (cold)."""
    def ids(c, n):
        return list(range(1000 * c, 1000 * c + -(-n // 512)))

    rows = [{"arrival_at": 0.0, "num_prompt_tokens": reused, "num_output_tokens": 1,
             "hash_ids": ids(c, reused)} for c in range(num_clients) if reused]
    if filler:
        rows += [{"arrival_at": gap / 2, "num_prompt_tokens": prompt, "num_output_tokens": 1,
                  "hash_ids": ids(c + num_clients, prompt)} for c in range(num_clients)]
    rows += [{"arrival_at": gap, "num_prompt_tokens": prompt, "num_output_tokens": 1,
              "hash_ids": ids(c, prompt)} for c in range(num_clients)]
    return rows


def reload_ttft(setup: dict, num_clients: int, reused: int) -> tuple[float, float]:
    """Mean TTFT and mean loading part of the burst's continuations (cold when ``reused=0``).

    With ``setup["hit"] == "cpu"`` the GPU holds one round of prompts and filler evicts the
    first turns to an unbounded CPU tier; with ``"gpu"`` it holds both rounds (a GPU hit)."""
    prompt = setup["prompt"]
    rounds = 1 if setup["hit"] == "cpu" else 2
    blocks = num_clients * rounds * (-(-prompt // 16) + 1)
    cfg = SimConfig.preset("classic").replace(model=setup["model"], gpu=setup["gpu"], **{
        "hardware.tensor_parallel_size": setup["tp"], "cache.num_blocks": blocks,
        "max_num_batched_tokens": 8192, "max_num_seqs": 256}).replace(**tiers(cpu()))
    res, engine = run_engine(cfg, burst(num_clients, prompt, reused, setup["hit"] == "cpu"),
                             keep_engine=True)
    df = res.requests
    last = df["arrival_at"].to_numpy() == df["arrival_at"].max()
    split = ttft_split(df[last], [engine.replicas[0].kv])
    return split["ttft_mean"], split["ttft_loading"]


# How each measurement is configured (docs/kv_tiers.md): model, GPU, tensor parallelism, the
# prompt, and where the hit comes from. Not published with the numbers, so chosen and swept:
# the concurrency (the client count whose cold TTFT is nearest the measured cold TTFT) and the
# share of the prompt that earlier turns cover.
RELOAD_SETUPS = {
    "hicache_8k": dict(model="llama-3.1-8b", gpu="h100-sxm", tp=1, prompt=8192, hit="gpu"),
    "vllm_70b_3k": dict(model="llama-3.1-70b", gpu="h100-sxm", tp=4, prompt=3072, hit="cpu"),
}
CLIENTS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
SHARES = (0.5, 0.75, 0.9, 1.0)


def reload(quick: bool) -> pd.DataFrame:
    """The two measured reload-vs-recompute TTFT ratios, simulated as configured."""
    rows = []
    for name, s in RELOAD_SETUPS.items():
        measured_cold, measured_warm, source = MEASURED[name]
        colds = {c: reload_ttft(s, c, 0)[0] for c in CLIENTS}
        clients = min(colds, key=lambda c: abs(colds[c] - measured_cold))
        for share in SHARES[-2:] if quick else SHARES:
            reused = min(int(s["prompt"] * share) // 16 * 16, s["prompt"] - 16)
            warm, loading = reload_ttft(s, clients, reused)
            ratio, measured = warm / colds[clients], measured_warm / measured_cold
            rows.append({"measurement": name, "model": s["model"], "gpu": s["gpu"],
                         "tp": s["tp"], "hit": s["hit"], "clients": clients,
                         "prompt": s["prompt"], "reused": reused,
                         "ttft_cold": colds[clients], "ttft_warm": warm,
                         "ttft_loading": loading, "ratio": ratio, "measured_ratio": measured,
                         "ratio_error": ratio / measured - 1, "source": source})
    return pd.DataFrame(rows)


def paying(table: pd.DataFrame, setup: str) -> dict:
    """Where tier ``setup`` stops paying: the smallest capacity whose hit rate is within a
    point of the largest one's (and that one's hit rate and TTFT p50)."""
    rows = table[table["setup"] == setup].sort_values("gib")
    best = rows["hit_rate"].max()
    enough = rows[rows["hit_rate"] >= best - 0.01].iloc[0]
    return {"setup": setup, "gib": float(enough["gib"]), "hit_rate": float(enough["hit_rate"]),
            "best_hit_rate": float(best), "ttft_p50": float(enough["ttft_p50"])}


def plot(table: pd.DataFrame, title: str):
    """Hit rate and TTFT p50 against tier capacity, one line per swept tier (GPU only at the
    left end, unbounded at the right)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = table["gib"].replace(np.inf, np.nan)
    lo, hi = sizes[sizes > 0].min() / 2, sizes.max() * 2
    gpu = table[table["setup"] == "gpu only"].iloc[0]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for setup, rows in table.groupby("setup", sort=False):
        if setup == "gpu only" or rows["gib"].nunique() < 2:
            continue
        x = rows["gib"].replace(np.inf, hi)
        a.plot(x, rows["hit_rate"], "o-", label=setup)
        b.plot(x, rows["ttft_p50"], "o-", label=setup)
    for ax, column in ((a, "hit_rate"), (b, "ttft_p50")):
        ax.axhline(gpu[column], color="gray", ls=":", label="gpu only")
        ax.set_xscale("log")
        ax.set_xlim(lo, hi * 1.5)
        ax.set_xlabel("tier capacity (GiB; rightmost: unbounded)")
        ax.grid(alpha=0.3)
    a.set_ylabel("prompt tokens served from a cache")
    b.set_ylabel("TTFT p50 (s)")
    b.set_yscale("log")
    b.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def main(argv=None) -> dict[str, pd.DataFrame]:
    """Run the four studies; print and write their tables; draw the plots."""
    p = make_parser("kv_tiers", __doc__, "fewer sizes, shorter runs")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")   # ten Mooncake prompts exceed 128k tokens: rejected, noted
    out = Path(args.out)
    t0 = time.time()
    tables = {"mooncake": mooncake(args.quick), "cluster": cluster(args.quick),
              "sessions": sessions(args.quick), "reload": reload(args.quick)}
    write_frames(out, **tables)
    for name, table in tables.items():
        print(f"\n== {name}")
        print_table(table.drop(columns=["wall_s"], errors="ignore"), out)
    for name, setups in (("mooncake", ("cpu", "ssd", "cpu 128 GiB + ssd")),
                         ("cluster", ("remote",)), ("sessions", ("cpu", "ssd"))):
        for setup in setups:
            print(f"{name}: stops paying at {paying(tables[name], setup)}")
    try_plots(lambda: [save_plot(out / f"{name}.png", lambda n=name: plot(
        tables[n], f"{n}: hit rate and TTFT p50 against tier capacity"))
        for name in ("mooncake", "cluster", "sessions")])
    print(f"\n{time.time() - t0:.0f} s")
    return tables


if __name__ == "__main__":
    main()
