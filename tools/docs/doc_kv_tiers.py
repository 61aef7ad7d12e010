"""The generated blocks of docs/kv_tiers.md (see tools.docs.check_docs): the tiered KV cache on
Mooncake's trace, on 4 replicas with a shared remote store, on long multi-turn sessions, and the
two measured reload-vs-recompute TTFT ratios."""

from __future__ import annotations

import math

import pandas as pd

from tools.docs.doc_format import claim, md_table, num


def _tables(runs) -> dict:
    return runs.get("kv_tiers")


def _gib(v: float) -> str:
    if v == 0:
        return "–"
    return "unbounded" if math.isinf(v) else f"{v:,.0f}"


def _pc(v: float) -> str:
    return f"{v * 100:.1f} %"


def _rows(table: pd.DataFrame, tiers: tuple) -> pd.DataFrame:
    out = pd.DataFrame({"setup": table["setup"], "capacity (GiB)": table["gib"].map(_gib),
                        "hit rate": table["hit_rate"].map(_pc)})
    for t in tiers:
        out[f"from {t}"] = table[f"hit_{t}"].map(_pc)
    out["TTFT p50 (s)"] = table["ttft_p50"]
    out["TTFT p99 (s)"] = table["ttft_p99"]
    out["TTFT mean: waiting / loading / computing (s)"] = [
        f"{num(r.ttft_waiting)} / {num(r.ttft_loading)} / {num(r.ttft_computing)}"
        for r in table.itertuples()]
    out["loaded / stored (TB)"] = [f"{r.load_gb / 1e3:.2f} / {r.store_gb / 1e3:.2f}"
                                   for r in table.itertuples()]
    return out


def _paying(table: pd.DataFrame, setup: str) -> pd.Series:
    from experiments.kv_tiers import paying
    return pd.Series(paying(table, setup))


def kv_tiers_mooncake(runs) -> str:
    """docs/kv_tiers.md: one replica on Mooncake's trace, GPU only vs CPU / SSD tiers."""
    t = _tables(runs)["mooncake"]
    gpu = t[t["setup"] == "gpu only"].iloc[0]
    cpu = t[t["setup"] == "cpu"].set_index("gib")
    ssd = t[t["setup"] == "ssd"].set_index("gib")
    inf = math.inf
    claim(abs(cpu.loc[inf, "hit_rate"] - 0.646) < 0.01,
          "an unbounded CPU tier reaches the unbounded-memory hit rate 64.6 %")
    claim(cpu["hit_rate"].is_monotonic_increasing, "the hit rate grows with the CPU tier")
    claim((cpu["ttft_p50"] <= ssd["ttft_p50"]).all(), "a CPU tier beats an SSD of its size")
    claim(abs(gpu["hit_rate"] - 0.056) < 0.001, "GPU only hits 5.6 %")
    pay = _paying(t, "cpu")
    over = t[t["setup"] == "cpu, overlapped"].iloc[0]
    claim(over["ttft_p50"] < cpu.loc[inf, "ttft_p50"], "overlapping loads lowers TTFT p50")
    return "\n".join([
        md_table(_rows(t, ("cpu", "disk"))),
        "",
        f"The GPU alone serves {_pc(gpu['hit_rate'])} of prompt tokens; an unbounded CPU tier "
        f"{_pc(cpu.loc[inf, 'hit_rate'])}, the unbounded-memory figure of "
        f"[prefix_caching.md](prefix_caching.md), and TTFT p50 falls from "
        f"{num(gpu['ttft_p50'])} s to {num(cpu.loc[inf, 'ttft_p50'])} s. The CPU tier stops "
        f"paying at about {pay['gib']:,.0f} GiB (hit rate {_pc(pay['hit_rate'])}, within a "
        f"point of unbounded). An SSD of the same size catches the same blocks but loads them "
        f"at 6 GB/s instead of 25: TTFT p50 {num(ssd.loc[inf, 'ttft_p50'])} s unbounded. An SSD "
        f"under a 128 GiB CPU tier pays only once it is larger than the CPU tier (the tiers are "
        f"inclusive). Overlapping loads with the forward pass layer by layer cuts TTFT p50 to "
        f"{num(over['ttft_p50'])} s (loading {num(over['ttft_loading'])} s of the mean).",
    ])


def kv_tiers_cluster(runs) -> str:
    """docs/kv_tiers.md: 4 replicas, round robin, with a shared remote store."""
    t = _tables(runs)["cluster"]
    gpu = t[t["setup"] == "gpu only"].iloc[0]
    local = t[t["setup"] == "cpu 256 GiB each"].iloc[0]
    remote = t[t["setup"] == "remote"].set_index("gib")
    both = t[t["setup"] == "cpu 256 GiB each + remote"].iloc[0]
    inf = math.inf
    claim(remote.loc[inf, "hit_rate"] > local["hit_rate"] + 0.2,
          "a shared remote store beats per-replica CPU tiers under round robin")
    claim(both["ttft_p50"] <= remote.loc[inf, "ttft_p50"], "CPU over remote lowers TTFT p50")
    pay = _paying(t, "remote")
    return "\n".join([
        md_table(_rows(t, ("cpu", "remote"))),
        "",
        f"Round robin spreads a conversation's turns over the four replicas, so a replica's own "
        f"memory sees little of its reuse: GPU only {_pc(gpu['hit_rate'])}, a 256 GiB CPU tier "
        f"each {_pc(local['hit_rate'])}. A remote store shared by the four serves every "
        f"replica's evicted blocks to all: {_pc(remote.loc[inf, 'hit_rate'])} unbounded, "
        f"TTFT p50 {num(gpu['ttft_p50'])} s -> {num(remote.loc[inf, 'ttft_p50'])} s; it stops "
        f"paying at about {pay['gib']:,.0f} GiB ({_pc(pay['hit_rate'])}). CPU tiers above it "
        f"take the nearest reuse off the network (TTFT p50 {num(both['ttft_p50'])} s).",
    ])


def kv_tiers_sessions(runs) -> str:
    """docs/kv_tiers.md: long-context multi-turn sessions."""
    t = _tables(runs)["sessions"]
    gpu = t[t["setup"] == "gpu only"].iloc[0]
    pay_cpu, pay_ssd = _paying(t, "cpu"), _paying(t, "ssd")
    cpu = t[t["setup"] == "cpu"].set_index("gib")
    claim(cpu.loc[math.inf, "hit_rate"] > 10 * gpu["hit_rate"],
          "the CPU tier serves ten times the GPU's hits")
    return "\n".join([
        md_table(_rows(t, ("cpu", "disk"))),
        "",
        f"A minute of think time between turns is long enough for the GPU to evict the "
        f"history: GPU only hits {_pc(gpu['hit_rate'])}. A CPU tier keeps it: the hit rate "
        f"reaches {_pc(pay_cpu['best_hit_rate'])} and stops growing at {pay_cpu['gib']:,.0f} GiB "
        f"(TTFT p50 {num(gpu['ttft_p50'])} s -> {num(pay_cpu['ttft_p50'])} s); an SSD stops "
        f"paying at {pay_ssd['gib']:,.0f} GiB with TTFT p50 {num(pay_ssd['ttft_p50'])} s.",
    ])


def kv_tiers_reload(runs) -> str:
    """docs/kv_tiers.md: the two measured TTFT ratios, simulated as configured."""
    t = _tables(runs)["reload"]
    out = pd.DataFrame({
        "measurement": t["measurement"], "model / GPU / TP": [
            f"{r.model} / {r.gpu} / {r.tp}" for r in t.itertuples()],
        "hit from": t["hit"], "clients": t["clients"], "prompt": t["prompt"],
        "reused": t["reused"], "TTFT cold (s)": t["ttft_cold"],
        "TTFT warm (s)": t["ttft_warm"], "of it loading (s)": t["ttft_loading"],
        "ratio": t["ratio"], "measured": t["measured_ratio"],
        "error": [f"{e * 100:+.0f} %" for e in t["ratio_error"]]})
    within = t[t["ratio_error"].abs() <= 0.2]
    claim(set(within["measurement"]) == set(t["measurement"]),
          "each measurement is reproduced within 20 % by one configuration")
    picks = {r.measurement: r for r in within.itertuples()}
    h, v = picks["hicache_8k"], picks["vllm_70b_3k"]
    full = t.loc[t.groupby("measurement")["reused"].idxmax()].set_index("measurement")
    hf, vf = full.loc["hicache_8k"], full.loc["vllm_70b_3k"]
    claim(hf["ratio"] < 0.5 * h.measured_ratio and vf["ratio"] < 0.5 * v.measured_ratio,
          "a full hit's ratio is far below either measurement")
    claim(v.ttft_loading < vf["ttft_loading"], "the load grows with the share reloaded")
    return "\n".join([
        md_table(out),
        "",
        f"Within 20 %: HiCache's 8k prompts with {h.reused:,} of {h.prompt:,} tokens reused "
        f"from the GPU ({h.clients} concurrent clients): ratio {num(h.ratio)} vs "
        f"{num(h.measured_ratio)} measured ({h.ratio_error * 100:+.0f} %); the 70B 3,072-token "
        f"prompts with {v.reused:,} tokens reloaded from the CPU tier ({v.clients} clients): "
        f"{num(v.ratio)} vs {num(v.measured_ratio)} ({v.ratio_error * 100:+.0f} %). The ratio "
        f"is mostly the share of the prompt still to compute; the load adds to it (the 70B "
        f"rows' loading column) and grows with the share reloaded. Had either measurement "
        f"reused all but one block of its prompt, the model's ratio would be far below it "
        f"({num(hf['ratio'])} for the GPU hit, {num(vf['ratio'])} for the CPU reload): under "
        f"this model both reused part of their prompts, which the sources do not state.",
    ])


# A tier smaller than the prefix working set (issue 40, defect 16): 40 system prompts of 160
# tokens (10 blocks each), 400 requests, a 40-block GPU cache.
SMALL_GROUPS, SMALL_PREFIX, SMALL_GPU_BLOCKS = 40, 160, 40
SMALL_CAPACITIES = (0.0, 0.1, 0.4, 1.6, 6.4, math.inf)


def small_tier_sweep() -> pd.DataFrame:
    """The shared-prefix workload above with no CPU tier (capacity 0) and CPU tiers of
    :data:`SMALL_CAPACITIES` GiB: per capacity the tier's blocks, the prefix hit rate at first
    admission, and the blocks written to the tier per request."""
    import dataclasses

    import simsched
    from simsched import SimConfig
    from simsched.cost import hardware
    from simsched.workloads.workload import WorkloadConfig

    wl = dataclasses.replace(WorkloadConfig.preset("shared-prefix"),
                             system_prompt_len=SMALL_PREFIX, num_prefix_groups=SMALL_GROUPS,
                             num_requests=400)
    # The classic rules the figures were measured with (tiers need the segments prefix model).
    base = SimConfig.preset("classic").replace(workload=wl, **{"cache.enable_prefix_caching": True,
                                             "cache.num_blocks": SMALL_GPU_BLOCKS})
    block_bytes = hardware.kv_bytes_per_token(base.hardware) * base.cache.block_size
    rows = []
    for gib in SMALL_CAPACITIES:
        tier = {"name": "cpu"} if math.isinf(gib) else {"name": "cpu", "capacity_gib": gib}
        cfg = base if not gib else base.replace(**{"cache.kv_tiers": {"tiers": [tier]}})
        res = simsched.simulate(cfg)
        s = res.summary()
        rows.append({"gib": gib, "blocks": math.inf if math.isinf(gib)
                     else int(gib * 2 ** 30 // block_bytes),
                     "hit_rate": s["prefix_hit_rate"],
                     "stored_per_request": s.get("kv_cpu_store_bytes", 0.0) / block_bytes
                     / len(res.requests)})
    return pd.DataFrame(rows)


def kv_tiers_small(runs) -> str:
    """docs/kv_tiers.md: why a CPU tier smaller than the prefix working set adds (almost)
    nothing under LRU, against its size."""
    t = small_tier_sweep().set_index("gib")
    gpu = t.loc[0.0, "hit_rate"]
    gain = (t["hit_rate"] - gpu).drop(0.0)
    claim(gain.is_monotonic_increasing, "the hit rate grows with the CPU tier")
    claim(gain.loc[0.1] < 0.01, "a 0.1 GiB tier adds under a point")
    small = t.loc[0.1]
    claim(small["blocks"] < small["stored_per_request"],
          "a request writes more blocks than the 0.1 GiB tier holds")
    working = SMALL_GROUPS * SMALL_PREFIX // 16
    prompt = SMALL_PREFIX + 128
    pinned = (small["blocks"] // (SMALL_PREFIX // 16)) / SMALL_GROUPS * SMALL_PREFIX / prompt
    table = pd.DataFrame({
        "CPU tier (GiB)": ["none" if not g else "unbounded" if math.isinf(g) else f"{g:g}"
                           for g in t.index],
        "tier blocks": ["–" if not g else ("unbounded" if math.isinf(b) else f"{int(b):,}")
                        for g, b in zip(t.index, t["blocks"])],
        "prefix hit rate": t["hit_rate"].map(_pc).tolist(),
        "added by the tier": ["–"] + [f"{v * 100:+.1f} pt" for v in gain],
        "blocks stored per request": ["–"] + [f"{v:.1f}" for v in t["stored_per_request"].iloc[1:]]})
    unb = t.loc[math.inf]
    return "\n".join([
        md_table(table),
        "",
        f"{SMALL_GROUPS} system prompts of {SMALL_PREFIX} tokens ({working} blocks of 16 "
        f"between them) before 128-token questions, 400 requests, a {SMALL_GPU_BLOCKS}-block GPU "
        f"cache. Every block the GPU evicts goes to the tier, the questions' and outputs' too: "
        f"{num(small['stored_per_request'])} blocks a request with a 0.1 GiB tier "
        f"({small['blocks']:,.0f} blocks), {num(unb['stored_per_request'])} unbounded. A group "
        f"comes back after {SMALL_GROUPS} requests on average, so its prefix has "
        f"{SMALL_GROUPS} x {num(unb['stored_per_request'])} ≈ "
        f"{SMALL_GROUPS * unb['stored_per_request']:,.0f} blocks written after it, and LRU keeps "
        f"it only if its group returns within capacity / blocks-per-request requests: under one "
        f"request at 0.1 GiB, so almost never ({gain.loc[0.1] * 100:+.1f} pt). A policy that "
        f"kept one whole prefix there instead (its {small['blocks']:,.0f} blocks hold one of "
        f"{SMALL_GROUPS}) would add about {pinned * 100:.1f} pt: under uniform popularity a tier "
        f"pays in proportion to the share of the working set it holds.",
    ])
