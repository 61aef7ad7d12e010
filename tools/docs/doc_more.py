"""The generated blocks of docs/prefix_caching.md and docs/disaggregation.md, and the README
sentences quoting them (see tools.docs.check_docs)."""

from __future__ import annotations

import pandas as pd

from tools.docs.doc_format import claim, md_table, num

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


def _prefix_summary(runs) -> dict:
    """The prefix-caching figures the README and docs/experiments.md quote, formatted."""
    f = _prefix(runs)
    gpu, top, never, off0, spx, sex = f["gpu"], f["top"], f["never"], f["off"].iloc[0], \
        f["spx"], f["sex"]
    fc, lp = spx.loc[(2048, "on fcfs")], spx.loc[(2048, "on lpm")]
    claim(lp["prefix_hit_rate"] > 2 * fc["prefix_hit_rate"], "LPM more than doubles FCFS")
    turns = sex.index.get_level_values(0)
    return dict(
        gpu=_pct(gpu["prefix_hit_rate"]), top=_pct(top["prefix_hit_rate"]),
        top_x=f"{top['cache_x_gpu']:g}", never=_pct(never["prefix_hit_rate"], 3),
        off_p50=num(off0["ttft_p50"]), top_p50=f"{top['ttft_p50']:.2f}",
        fcfs=f"{fc['prefix_hit_rate']:.2f}", lpm=f"{lp['prefix_hit_rate']:.2f}",
        turns_min=int(turns.min()), turns=int(turns.max()),
        on_p99=f"{sex.loc[(turns.max(), 'on'), 'ttft_p99'] * 1e3:.0f}",
        off_p99=num(sex.loc[(turns.max(), "off"), "ttft_p99"], 2))


def readme_prefix_caching(runs) -> str:
    """docs/experiments.md (findings at a glance): the prefix-caching bullet."""
    s = _prefix_summary(runs)
    return (
        f"- **Prefix caching**: on Mooncake's synthetic trace (Llama-3.1-8B, one A100, 0.5 req/s) "
        f"the hit rate grows from {s['gpu']} % with the GPU's cache to {s['top']} % with "
        f"{s['top_x']}× that ({s['never']} % never evicting), TTFT p50 from {s['off_p50']} s "
        f"(caching off) to {s['top_p50']} s; on 64 shared system prompts that overflow the "
        f"cache, LPM more than doubles FCFS's hit rate ({s['fcfs']} → {s['lpm']} at 2,048 "
        f"blocks); in {s['turns']}-turn conversations caching keeps TTFT p99 at {s['on_p99']} ms "
        f"instead of {s['off_p99']} s.")


def experiments_prefix_caching(runs) -> str:
    """docs/experiments.md: the prefix_caching study in one paragraph."""
    s = _prefix_summary(runs)
    return (
        f"`prefix_caching`: prefix caching off vs on on the Mooncake synthetic trace across cache "
        f"sizes (hit rate {s['gpu']} % with one A100's cache, {s['top']} % with {s['top_x']}× "
        f"that, {s['never']} % never evicting; TTFT p50 {s['off_p50']} s off → {s['top_p50']} "
        f"s), FCFS vs LPM on 64 shared system prompts that overflow the cache (hit rate "
        f"{s['fcfs']} → {s['lpm']} at 2,048 blocks), and closed-loop conversations of "
        f"{s['turns_min']}–{s['turns']} turns (TTFT p99 grows to {s['off_p99']} s without "
        f"caching, stays at {s['on_p99']} ms with it). Tables and method in "
        f"[prefix_caching.md](prefix_caching.md).")


WORKLOAD_NAME = {"sharegpt": "ShareGPT", "azure_conv": "Azure conv"}


def _cap(v: float) -> str:
    return f"{v:.1f}" if round(v, 1) == round(v, 3) else num(v)


def _disagg(runs) -> dict:
    from experiments.disaggregation import SLOS

    t = runs.get("disaggregation")
    slos, names = list(dict.fromkeys(t["slo"])), list(dict.fromkeys(t["workload"]))
    cap = {(s, w): t[(t["slo"] == s) & (t["workload"] == w)].set_index("layout")["capacity"]
           for s in slos for w in names}
    best = {k: c.drop("colocated").idxmax() for k, c in cap.items()}
    return dict(t=t, slos=slos, names=names, cap=cap, best=best, bounds=SLOS,
                bw=t.attrs["bandwidth"], an=t.attrs["anatomy"].set_index("layout"))


def disagg_capacity(runs) -> str:
    """docs/disaggregation.md: capacity per layout, workload and SLO, and what it says."""
    from experiments.disaggregation import NUM_GPUS

    f = _disagg(runs)
    slos, names, cap, best, an = f["slos"], f["names"], f["cap"], f["best"], f["an"]
    rows, gain = [], {}
    for s in slos:
        ttft, tpot = f["bounds"][s]
        for w in names:
            c, b = cap[(s, w)], best[(s, w)]
            gain[(s, w)] = c[b] / c["colocated"]
            rows.append({"SLO (90 % of requests)": f"TTFT ≤ {ttft:g} s, TPOT ≤ {tpot * 1e3:g} ms",
                         "workload": WORKLOAD_NAME[w],
                         "colocated": f"{num(c['colocated'])} ({_cap(c['colocated'] / 8)})",
                         "best split": f"{b}: {num(c[b])} ({_cap(c[b] / 8)})",
                         "gain": f"{gain[(s, w)]:.2f}×"})
    s0, s1 = slos
    w0, w1 = names
    claim(all(g > 1 for g in gain.values()), "the best split beats colocated serving")
    g0 = [gain[(s0, w)] for w in names]
    g1 = [gain[(s1, w)] for w in names]
    claim(min(g1) > max(g0), "the gain grows as the TPOT bound tightens")
    loss = [1 - cap[(s1, w)]["colocated"] / cap[(s0, w)]["colocated"] for w in names]
    claim(all(0.25 < x < 0.45 for x in loss), "colocated loses about a third from 40 to 25 ms")
    split = best[(s1, w0)]
    claim(all(cap[(s1, w)][split] / cap[(s0, w)][split] > 1 - min(loss) for w in names),
          f"{split} loses less than colocated")
    col = an.loc["colocated"]
    sp = an.loc[[i for i in an.index if i != "colocated" and "@" not in i][0]]
    claim(col["ttft_ok"] == 1.0, "colocated meets the TTFT bound for every request at capacity")
    claim(col["tpot_ok"] < col["ttft_ok"] and col["tpot_ok"] < 0.98, "colocated fails on TPOT")
    claim(sp["tpot_ok"] > col["tpot_ok"], f"{sp.name} meets the TPOT bound more often")
    num_prefill = int(sp.name.split("P")[0])
    if sp["ttft_p90"] > 1.05 * col["ttft_p90"]:
        ttft = (f", at the cost of a longer TTFT ({sp['ttft_p50']:.2f} / {sp['ttft_p90']:.2f} s "
                f"against {col['ttft_p50']:.2f} / {col['ttft_p90']:.2f} s: {num_prefill} of the "
                f"{NUM_GPUS} GPUs do all the prefills)")
    else:
        ttft = (f", with about the same TTFT ({sp['ttft_p50']:.2f} / {sp['ttft_p90']:.2f} s "
                f"against {col['ttft_p50']:.2f} / {col['ttft_p90']:.2f} s)")
    kept = [cap[(s1, w)][split] >= cap[(s0, w)][split] for w in names]
    claim(sp["kv_wait_time_mean"] == 0, "no wait for decode memory at 25 GB/s")
    edges = [c.drop("colocated") for c in cap.values()]
    highs = [max(e.iloc[0], e.iloc[-1]) / e.max() for e in edges]
    claim(max(highs) < 1 / 3, "the extreme splits sustain under a third of the best")
    curve = cap[(s0, w0)].drop("colocated")
    curve1 = cap[(s0, w1)].drop("colocated")
    pct = lambda g: f"{(min(g) - 1) * 100:.0f}-{(max(g) - 1) * 100:.0f} %"  # noqa: E731
    return "\n".join([
        "Capacity (req/s for the 8 GPUs; per GPU in brackets):",
        "",
        md_table(pd.DataFrame(rows)),
        "",
        f"The whole curve (ShareGPT, TPOT ≤ {f['bounds'][s0][1] * 1e3:g} ms): "
        + ", ".join(f"{k} {num(v)}" for k, v in curve.items())
        + " req/s; Azure conversation: " + ", ".join(num(v) for v in curve1) + ".",
        "",
        "What it says:",
        "",
        f"- **Disaggregation pays, and more as the TPOT bound tightens.** With a "
        f"{f['bounds'][s0][1] * 1e3:g} ms TPOT bound the best split beats colocated serving by "
        f"{pct(g0)} per GPU; at {f['bounds'][s1][1] * 1e3:g} ms by {pct(g1)}. Colocated serving "
        f"loses a third of its capacity going from {f['bounds'][s0][1] * 1e3:g} to "
        f"{f['bounds'][s1][1] * 1e3:g} ms ("
        + " and ".join(f"{num(cap[(s0, w)]['colocated'])} → {num(cap[(s1, w)]['colocated'])}"
                       for w in names)
        + f" req/s: chunked prefills still stretch the decode iterations they join), while "
        f"{split} loses {'nothing' if all(kept) else 'less'} ("
        + " and ".join(f"{num(cap[(s0, w)][split])} → {num(cap[(s1, w)][split])}" for w in names)
        + f"): its decode "
        f"replicas run decode-only iterations. Colocated serving fails on TPOT, not TTFT: at its "
        f"own capacity on ShareGPT ({num(cap[(s0, w0)]['colocated'])} req/s) every request meets "
        f"the 1 s TTFT bound but only {num(col['tpot_ok'] * 100)} % the "
        f"{f['bounds'][s0][1] * 1e3:g} ms one; its TPOT is {num(col['tpot_p50'] * 1e3)} ms (p50) "
        f"/ {num(col['tpot_p90'] * 1e3)} ms (p90). {sp.name} at that rate keeps "
        f"{num(sp['tpot_ok'] * 100)} % within it (TPOT {sp['tpot_p50'] * 1e3:.1f} / "
        f"{sp['tpot_p90'] * 1e3:.1f} ms){ttft}. Its mean transfer is "
        f"{sp['kv_transfer_mb_mean']:.0f} MB in {num(sp['kv_transfer_time_mean'] * 1e3)} ms, with "
        f"no wait for decode memory.",
        f"- **The split must match the workload.** Capacity falls steeply on either side of the "
        f"best ratio (1P7D and 7P1D sustain a sixth to under a third of the best split): with "
        f"too few prefill replicas TTFT queues build; with too few decode replicas TPOT fails "
        f"(and transfers wait for decode memory, holding KV on the prefill side). The best ratio "
        f"moves with the SLO (Azure conversation: {best[(s0, w1)]} at "
        f"{f['bounds'][s0][1] * 1e3:g} ms, {best[(s1, w1)]} at {f['bounds'][s1][1] * 1e3:g} ms), "
        f"so a fixed xPyD deployment is only right for one operating point.",
    ])


def disagg_bandwidth(runs) -> str:
    """docs/disaggregation.md: the best split's capacity against link bandwidth."""
    f = _disagg(runs)
    s0, w0 = f["slos"][0], f["names"][0]
    bw, an = f["bw"], f["an"]
    colocated = f["cap"][(s0, w0)]["colocated"]
    split = bw["layout"].iloc[0].split("@")[0]
    good = bw[bw["vs_colocated"] > 1]
    lo = bw[bw["vs_colocated"] < 1]["link_bandwidth_gbps"].max()
    first = good["link_bandwidth_gbps"].min()
    claim((bw["link_bandwidth_gbps"] <= lo).sum() + len(good) == len(bw)
          and good["link_bandwidth_gbps"].min() > lo, "the benefit has one threshold")
    from experiments.disaggregation import TOL

    claim(good["capacity"].max() <= good["capacity"].min() * (1 + TOL),
          "above the threshold the capacity does not move at the search's resolution")
    row = lambda key, fmt: [key] + [fmt(v) for v in bw[col[key]]]  # noqa: E731
    col = {"capacity (req/s)": "capacity", "vs colocated": "vs_colocated"}
    table = pd.DataFrame([row("capacity (req/s)", lambda v: num(v, 2)), row("vs colocated", lambda v: f"{v:.2f}×")],
                         columns=["GB/s per GPU"] + [f"{b:g}" for b in bw["link_bandwidth_gbps"]])
    fast, slow = an.loc[split], an.loc[f"{split}@1GB/s"]
    mb = fast["kv_transfer_mb_mean"]
    claim(slow["ttft_ok"] >= fast["ttft_ok"] - 0.01, "TTFT is untouched at 1 GB/s")
    claim(slow["tpot_ok"] < 0.9, "at 1 GB/s most of the loss is on TPOT")
    return "\n".join([
        f"**Link bandwidth** (ShareGPT, {split}, TPOT ≤ {f['bounds'][s0][1] * 1e3:g} ms; "
        f"colocated: {num(colocated)} req/s):",
        "",
        "![bandwidth](img/disaggregation_bandwidth.png)",
        "",
        md_table(table),
        "",
        f"Disaggregation stops paying between {first:g} and {lo:g} GB/s per GPU ({first * 8:g} and "
        f"{lo * 8:g} Gb/s). At 1 GB/s a mean {mb:.0f} MB transfer alone takes "
        f"{mb / 1e3:.2f} s, and the transfers leaving one prefill replica share its link: at "
        f"{num(colocated)} req/s the mean transfer takes {num(slow['kv_transfer_time_mean'], 2)} s, "
        f"TTFT is untouched ({slow['ttft_ok'] * 100:.0f} % within 1 s, as at 25 GB/s; the prefill "
        f"replicas have memory to spare for the held KV) but only {slow['tpot_ok'] * 100:.0f} % of "
        f"requests stay within the TPOT bound ({num(fast['tpot_ok'] * 100)} % at 25 GB/s), the "
        f"whole transfer sitting in the second-token gap. From {first:g} GB/s up the capacity does "
        f"not move at this search's resolution: on any current datacenter link (25 GB/s, "
        f"InfiniBand 200, and up) the transfer adds ~{fast['kv_transfer_time_mean'] * 1e3:.0f} ms "
        f"to the second-token gap, nothing to speak of once spread over a ~445-token output's "
        f"TPOT. (The model does not overlap the transfer with the prefill; with layer-wise "
        f"overlap the threshold would be lower still.)",
    ])
