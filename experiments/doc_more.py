"""The generated blocks of docs/prefix_caching.md and docs/disaggregation.md, and the README
sentences quoting them (see experiments.check_docs)."""

from __future__ import annotations

import pandas as pd

from experiments.doc_format import claim, md_table, num

# The shared-prefix study's shapes (experiments.prefix_caching.shared_prefix): a request is a
# 2,048-token system prompt + a 128-token question, so at most 2,048 / 2,176 of it can hit.
SYSTEM_PROMPT, QUESTION = 2048, 128


def _sig(value: float) -> str:
    """Three significant digits, trailing zeros kept (``0.180``, ``58.0``); 0 as ``0``."""
    if value == 0:
        return "0"
    return f"{value:.3f}" if value < 0.1 else f"{value:#.3g}" if value < 100 else num(value)


def _sig_cols(rows: list[dict], skip: tuple = ()) -> pd.DataFrame:
    """The rows as a frame, every float formatted by :func:`_sig`."""
    return pd.DataFrame([{k: _sig(v) if isinstance(v, float) and k not in skip else v
                          for k, v in r.items()} for r in rows])


def _pct(share: float, digits: int = 2) -> str:
    return num(share * 100, digits)


def _prefix(runs) -> dict:
    t = runs.get("prefix_caching")
    moon, pol, sp, se = t["mooncake"], t["mooncake_policy"], t["shared_prefix"], t["sessions"]
    off = moon[moon["caching"] == "off"]
    on = moon[moon["caching"] == "on"]
    sized = on[on["cache_x_gpu"].isin(off["cache_x_gpu"])]
    never = on[~on["cache_x_gpu"].isin(off["cache_x_gpu"])].iloc[0]
    gpu = sized.iloc[0]
    top = sized.iloc[-1]
    policy = pol.set_index(["rate", "policy"])
    spx = sp.set_index(["num_blocks", "variant"])
    sex = se.set_index(["turns", "caching"])
    return dict(moon=moon, off=off, sized=sized, never=never, gpu=gpu, top=top, policy=policy,
                sp=sp, spx=spx, se=se, sex=sex)


def prefix_caching_results(runs) -> str:
    """docs/prefix_caching.md: the three studies' tables and what they show."""
    f = _prefix(runs)
    off, sized, never, gpu, policy = f["off"], f["sized"], f["never"], f["gpu"], f["policy"]
    off0 = off.iloc[0]
    p50 = off["ttft_p50"]
    claim(p50.max() / p50.min() < 1.02, "caching off does not depend on the cache size")
    claim(off0["request_throughput"] < 0.5, "with caching off the GPU cannot keep up")
    claim(gpu["ttft_p99"] < off0["ttft_p99"], "even the GPU-sized cache lowers p99 TTFT")
    gpu_blocks = int(gpu["num_blocks"])
    mean_prompt = float(off0["mean_prompt_tokens"])

    def evicted(v):
        return "0" if v == 0 else f"{v / 1e6:.2f} M"

    rows = [{"cache (x GPU)": f"{r['cache_x_gpu']:g}", "blocks": int(r["num_blocks"]),
             "hit rate": r["prefix_hit_rate"], "TTFT p50": r["ttft_p50"],
             "TTFT p99": r["ttft_p99"], "throughput": r["request_throughput"],
             "evicted blocks": evicted(r["num_evicted_blocks"])} for _, r in sized.iterrows()]
    rows.append({"cache (x GPU)": "never evicts", "blocks": int(never["num_blocks"]),
                 "hit rate": never["prefix_hit_rate"], "TTFT p50": never["ttft_p50"],
                 "TTFT p99": never["ttft_p99"], "throughput": never["request_throughput"],
                 "evicted blocks": evicted(never["num_evicted_blocks"])})
    rates = sorted({r for r, _ in policy.index})
    lo, hi = policy.loc[rates[0]], policy.loc[rates[-1]]
    claim(lo.loc["lpm", "prefix_hit_rate"] >= lo.loc["fcfs", "prefix_hit_rate"],
          "LPM raises the Mooncake hit rate at 4x the GPU cache")
    claim(lo.loc["lpm", "ttft_p50"] < lo.loc["fcfs", "ttft_p50"], "LPM cuts Mooncake TTFT p50")
    close = abs(hi.loc["lpm", "ttft_p50"] / hi.loc["fcfs", "ttft_p50"] - 1)
    claim(close <= 0.02, "at 1 req/s FCFS and LPM are within 2 %")

    sp, spx = f["sp"], f["spx"]
    label = {"off": "off", "on fcfs": "on, FCFS", "on lpm": "on, LPM"}
    sizes = list(dict.fromkeys(sp["num_blocks"]))
    full = sizes[-1]
    sp_rows = [{"blocks": f"{int(r['num_blocks']):,}" + (" (GPU)" if r["num_blocks"] == full
                                                          else ""),
                "variant": label[r["variant"]], "hit rate": r["prefix_hit_rate"],
                "TTFT p50": r["ttft_p50"], "TTFT p99": r["ttft_p99"],
                "throughput": r["request_throughput"], "finished": int(r["num_finished"])}
               for _, r in sp.iterrows()]
    fc, lp = spx.loc[(2048, "on fcfs")], spx.loc[(2048, "on lpm")]
    claim(lp["prefix_hit_rate"] > 2 * fc["prefix_hit_rate"],
          "LPM more than doubles the hit rate at 2,048 blocks")
    claim((sp["num_finished"] < sp["num_finished"].max()).any(),
          "some shared-prefix runs end with requests unfinished")

    se, sex = f["se"], f["sex"]
    turns = list(dict.fromkeys(se["turns"]))
    se_rows = []
    for k in turns:
        o, n = sex.loc[(k, "off")], sex.loc[(k, "on")]
        se_rows.append({"turns": int(k), "mean prompt": round(o["mean_prompt_tokens"]),
                        "hit rate (on)": n["prefix_hit_rate"], "TTFT p50 off": o["ttft_p50"],
                        "TTFT p50 on": n["ttft_p50"], "TTFT p99 off": o["ttft_p99"],
                        "TTFT p99 on": n["ttft_p99"],
                        "throughput off": o["request_throughput"],
                        "on": n["request_throughput"]})
    on_p50 = se[se["caching"] == "on"]["ttft_p50"] * 1e3
    last = sex.loc[(turns[-1], "off")]
    claim(se[se["caching"] == "off"]["ttft_p99"].is_monotonic_increasing,
          "without caching TTFT grows with the conversation")
    claim(on_p50.max() < 2 * on_p50.min(), "with caching TTFT stays flat")
    return "\n".join([
        f"**Mooncake synthetic trace** on Llama-3.1-8B / one A100-80GB, replayed at "
        f"{num(rates[0])} req/s (the recorded 3.9 req/s is far beyond one GPU; "
        f"{int(off0['num_rejected'])} prompts over 128k tokens are rejected). The GPU holds "
        f"{gpu_blocks:,} blocks ({gpu_blocks * 16 / 1e3:.0f}k tokens, about "
        f"{gpu_blocks * 16 / mean_prompt:.0f} average prompts); larger caches stand for a "
        f"CPU/SSD-backed store such as Mooncake's. Caching off does not depend on the cache size "
        f"here (prefill compute is the bottleneck): hit rate 0, TTFT p50 {num(off0['ttft_p50'])} "
        f"s, p99 {num(off0['ttft_p99'])} s, {num(off0['request_throughput'])} req/s (it cannot "
        f"keep up).",
        "",
        md_table(_sig_cols(rows)),
        "",
        f"The trace's reuse is far apart (a conversation comes back after hundreds of other long "
        f"prompts), so a GPU-sized LRU cache catches little of it ({_pct(gpu['prefix_hit_rate'])}"
        f" %); a cache that never evicts serves {_pct(never['prefix_hit_rate'], 3)} %. Even "
        f"{_pct(gpu['prefix_hit_rate'])} % keeps the GPU from falling behind as far (p99 "
        f"{num(off0['ttft_p99'])} -> {num(gpu['ttft_p99'])} s).",
        f"LPM vs FCFS at 4x the GPU cache: at {num(rates[0])} req/s LPM raises the hit rate "
        f"{_sig(lo.loc['fcfs', 'prefix_hit_rate'])} -> {_sig(lo.loc['lpm', 'prefix_hit_rate'])} "
        f"and cuts TTFT p50 {num(lo.loc['fcfs', 'ttft_p50'])} -> {num(lo.loc['lpm', 'ttft_p50'])}"
        f" s, p99 {_sig(lo.loc['fcfs', 'ttft_p99'])} -> {_sig(lo.loc['lpm', 'ttft_p99'])} s; at "
        f"{num(rates[-1])} req/s (overloaded either way, the queue is far beyond 128) they are "
        f"within {max(close * 100, 1):.0f} % (p50 {num(hi.loc['fcfs', 'ttft_p50'])} vs "
        f"{num(hi.loc['lpm', 'ttft_p50'])} s).",
        "",
        f"**Shared prefix**: 64 groups x {SYSTEM_PROMPT:,}-token system prompt + {QUESTION}-token "
        f"question, 128-token output, Poisson 6 req/s, {int(sp['num_finished'].max()):,} "
        f"requests, Llama-2-7B / A100. The 64 system prompts need {64 * SYSTEM_PROMPT // 16:,} "
        f"blocks, more than any cache tried, so what the scheduler serves next decides what stays "
        f"cached.",
        "",
        md_table(_sig_cols(sp_rows)),
        "",
        f"(The maximum hit rate is {SYSTEM_PROMPT:,} / {SYSTEM_PROMPT + QUESTION:,} = "
        f"{SYSTEM_PROMPT / (SYSTEM_PROMPT + QUESTION):.2f}.) At the full GPU cache, caching turns "
        f"an overloaded engine (TTFT p50 {spx.loc[(full, 'off'), 'ttft_p50']:.0f} s) into one "
        f"with {spx.loc[(full, 'on fcfs'), 'ttft_p50']:.1f} s TTFT. With a smaller cache FCFS "
        f"thrashes (requests of 64 groups interleave); LPM serves the groups whose prompts are "
        f"cached while the queue is at most 128 long and more than doubles the hit rate at 2,048 "
        f"blocks ({fc['prefix_hit_rate']:.2f} -> {lp['prefix_hit_rate']:.2f}), with "
        f"{fc['ttft_p50'] / lp['ttft_p50']:.0f}x lower TTFT p50. Runs that end with requests "
        f"unfinished hit the time limit (2 x last arrival + 60 s).",
        "",
        f"**Multi-turn sessions** (closed loop): new user tokens uniform 50-300, outputs uniform "
        f"50-400, think time exponential (mean 5 s), {int(se['num_finished'].max())} requests "
        f"offered at 3 req/s (sessions arrive at 3 / turns per second), Llama-3.1-8B / A100.",
        "",
        md_table(_sig_cols(se_rows)),
        "",
        f"Without caching, every turn re-prefills the whole history, so TTFT grows with the "
        f"conversation (p99 {last['ttft_p99']:.0f} s at {turns[-1]} turns); with it, each turn "
        f"prefills only its new user tokens (plus the partial last block) and TTFT stays flat at "
        f"{on_p50.min():.0f}-{on_p50.max():.0f} ms. Throughput is that of a closed loop: slower "
        f"service stretches every session and the run.",
    ])


def readme_prefix_caching(runs) -> str:
    """README: the prefix-caching bullet of "What the experiments show"."""
    f = _prefix(runs)
    gpu, top, never, off0, spx, sex = f["gpu"], f["top"], f["never"], f["off"].iloc[0], \
        f["spx"], f["sex"]
    fc, lp = spx.loc[(2048, "on fcfs")], spx.loc[(2048, "on lpm")]
    claim(lp["prefix_hit_rate"] > 2 * fc["prefix_hit_rate"], "LPM more than doubles FCFS")
    turns = sex.index.get_level_values(0).max()
    return (
        f"- **Prefix caching**: on Mooncake's synthetic trace (Llama-3.1-8B, one A100, 0.5 req/s) "
        f"the hit rate grows from {_pct(gpu['prefix_hit_rate'])} % with the GPU's cache to "
        f"{_pct(top['prefix_hit_rate'])} % with {top['cache_x_gpu']:g}× that "
        f"({_pct(never['prefix_hit_rate'], 3)} % never evicting), TTFT p50 from "
        f"{num(off0['ttft_p50'])} s (caching off) to {top['ttft_p50']:.2f} s; on 64 shared "
        f"system prompts that overflow the cache, LPM more than doubles FCFS's hit rate "
        f"({fc['prefix_hit_rate']:.2f} → {lp['prefix_hit_rate']:.2f} at 2,048 blocks); in "
        f"{turns}-turn conversations caching keeps TTFT p99 at "
        f"{sex.loc[(turns, 'on'), 'ttft_p99'] * 1e3:.0f} ms instead of "
        f"{num(sex.loc[(turns, 'off'), 'ttft_p99'], 2)} s.")
