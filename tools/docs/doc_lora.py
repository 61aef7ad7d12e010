"""The generated blocks of docs/lora.md and the docs/experiments.md paragraph quoting them (see
tools.docs.check_docs)."""

from __future__ import annotations

import pandas as pd

from tools.docs.doc_format import claim, md_table, num

COLUMNS = {"ttft_p50": "TTFT p50 (s)", "ttft_p99": "TTFT p99 (s)", "tpot_p50": "TPOT p50 (s)",
           "request_throughput": "req/s", "loads_per_request": "loads / request",
           "disk_loads_per_request": "from disk / request",
           "load_time_share": "GPU time loading"}


def _tables(runs) -> dict:
    return runs.get("lora")


def _view(frame: pd.DataFrame, first: list[str]) -> pd.DataFrame:
    out = frame[first + list(COLUMNS)].rename(columns=COLUMNS).copy()
    out["GPU time loading"] = [f"{v * 100:.1f} %" for v in frame["load_time_share"]]
    return out


def lora_adapters(runs) -> str:
    """docs/lora.md: adapter count and popularity, and TTFT by popularity rank."""
    t = _tables(runs)
    a, per = t["adapters"], t["per_adapter"]
    base = a[a.popularity == "base model"].iloc[0]
    uni = a[a.popularity == "uniform"].set_index("num_adapters")
    zipf = a[a.popularity == "zipf 1.0"].set_index("num_adapters")
    claim(uni.loc[128, "ttft_p99"] > zipf.loc[128, "ttft_p99"] > base.ttft_p99,
          "uniform popularity hurts more than Zipf, both more than the base model")
    claim(uni.ttft_p99.is_monotonic_increasing, "p99 TTFT grows with the adapter count")
    claim(abs(uni.loc[1, "ttft_p99"] / base.ttft_p99 - 1) < 0.1,
          "one adapter costs little over the base model")
    claim(per.ttft_p50.iloc[0] < per.ttft_p50.iloc[-1], "popular adapters wait less")
    claim((per.waiting_mean > per.loading_mean).all() and (per.waiting_mean > per.rest_mean).all(),
          "waiting dominates the TTFT split")
    text = [md_table(_view(a, ["popularity", "num_adapters"])), "",
            f"One adapter costs almost nothing over the base model (p99 TTFT "
            f"{num(uni.loc[1, 'ttft_p99'])} s vs {num(base.ttft_p99)} s): it is loaded once and "
            f"stays. With more adapters than the 4 GPU slots each step may batch, requests wait "
            f"for a slot and cold adapters are loaded: at 128 adapters p99 TTFT is "
            f"{num(uni.loc[128, 'ttft_p99'])} s with uniform popularity and "
            f"{num(zipf.loc[128, 'ttft_p99'])} s under Zipf(1.0), where a few hot adapters keep "
            f"their slots; throughput falls to {num(uni.loc[128, 'request_throughput'])} req/s "
            f"(base {num(base.request_throughput)}) and {num(uni.loc[128, 'load_time_share'] * 100, 2)} "
            f"% of the GPU's time goes to loading adapters, nearly all from disk (host memory "
            f"holds 16). Waiting for a slot costs more than the loads themselves.", "",
            "TTFT by popularity rank, 32 adapters under Zipf(1.0):", "",
            md_table(per), "",
            f"The most popular adapter's requests get their first token in "
            f"{num(per.ttft_p50.iloc[0])} s at the median; those of the 16 least popular wait "
            f"{num(per.ttft_p50.iloc[-1])} s: a request is skipped while its adapter has no slot "
            f"(vLLM's rule), and the hot adapters' requests behind it go first. The split of "
            f"the mean TTFT shows where the time goes: waiting for admission "
            f"({num(per.waiting_mean.iloc[-1])} s for the least popular) dwarfs the adapter loads "
            f"in the prefill's steps ({num(per.loading_mean.iloc[-1])} s) and the prefill itself."]
    return "\n".join(text)


def lora_max_loras(runs) -> str:
    """docs/lora.md: the max_loras sweep."""
    m = _tables(runs)["max_loras"].set_index("max_loras")
    best = m.ttft_p99.idxmin()
    claim(m.loc[1, "ttft_p99"] > 10 * m.loc[8, "ttft_p99"], "one slot is far worse than eight")
    claim(m.num_blocks.is_monotonic_decreasing, "slots take KV blocks")
    claim(m.kv_usage_mean.max() < 0.2, "the KV cache is far from full at this load")
    view = _view(m.reset_index(), ["max_loras", "num_blocks"])
    return "\n".join([
        md_table(view), "",
        f"With one slot every step serves one adapter and p99 TTFT is "
        f"{num(m.loc[1, 'ttft_p99'])} s; 8 slots bring it to {num(m.loc[8, 'ttft_p99'])} s and "
        f"the best here is {num(m.loc[best, 'ttft_p99'])} s at {best}. The slots' memory comes out "
        f"of the KV cache ({m.loc[1, 'num_blocks'] - m.loc[32, 'num_blocks']:,} blocks fewer at "
        f"32 slots than at 1), which this load never misses: on average at most "
        f"{num(m.kv_usage_mean.max() * 100, 2)} % of the cache is in use."])


def lora_routing(runs) -> str:
    """docs/lora.md: routers on four replicas."""
    r = _tables(runs)["routing"].set_index("router")
    claim(r.loc["lora_affinity", "ttft_p99"] < r.loc["random", "ttft_p99"],
          "lora_affinity beats random on p99 TTFT")
    claim(r.loc["lora_affinity", "loads_per_request"] < r.loc["random", "loads_per_request"],
          "lora_affinity loads fewer adapters")
    claim(r.loc["lora_affinity", "ttft_p99"] < r.loc["weighted", "ttft_p99"]
          <= r.loc["random", "ttft_p99"], "weighted's adapter term helps, less than lora_affinity")
    view = _view(r.reset_index(), ["router"])
    view["load_imbalance"] = r.load_imbalance.to_numpy()
    return "\n".join([
        md_table(view), "",
        f"`lora_affinity` sends a request where its adapter is loaded (bounded by load): p99 TTFT "
        f"{num(r.loc['lora_affinity', 'ttft_p99'])} s against {num(r.loc['random', 'ttft_p99'])} s "
        f"for `random` and {num(r.loc['jsq', 'ttft_p99'])} s for `jsq`, with "
        f"{num(r.loc['lora_affinity', 'disk_loads_per_request'], 2)} disk loads per request "
        f"instead of {num(r.loc['random', 'disk_loads_per_request'], 2)}, at a load imbalance of "
        f"{num(r.loc['lora_affinity', 'load_imbalance'])}. `weighted`'s adapter term (weight 1, "
        f"beside queue, KV and prefix at 1) helps less "
        f"({num(r.loc['weighted', 'ttft_p99'])} s): it counts only adapters already on a GPU, "
        f"while `lora_affinity` also remembers where it sent an adapter's last request."])


def experiments_lora(runs) -> str:
    """docs/experiments.md: one paragraph."""
    t = _tables(runs)
    a = t["adapters"]
    uni = a[a.popularity == "uniform"].set_index("num_adapters")
    base = a[a.popularity == "base model"].iloc[0]
    r = t["routing"].set_index("router")
    return (f"`lora`: multi-LoRA serving on Llama-2-7B / A100-80GB at 16 req/s: p99 TTFT "
            f"{num(base.ttft_p99)} s for the base model, {num(uni.loc[1, 'ttft_p99'])} s with one "
            f"adapter, {num(uni.loc[128, 'ttft_p99'])} s with 128 equally popular ones on 4 GPU "
            f"slots; a `max_loras` sweep; on 4 replicas `lora_affinity` routing cuts p99 TTFT from "
            f"{num(r.loc['random', 'ttft_p99'])} s (`random`) to "
            f"{num(r.loc['lora_affinity', 'ttft_p99'])} s. Tables and method in "
            f"[lora.md](lora.md).")
