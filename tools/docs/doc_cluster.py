"""The generated blocks of docs/cluster.md and the README's cluster bullets (see
tools.docs.check_docs): routing, stale state, cache affinity and deployment search."""

from __future__ import annotations

import pandas as pd

from tools.docs.doc_format import claim, md_table, num


def _ms(seconds: float) -> str:
    return f"{num(seconds * 1e3)} ms"


def _pc(share: float, sign: bool = False) -> str:
    """A share as a percentage with the docs' spacing: ``0.4`` -> ``40 %``."""
    return f"{share * 100:{'+' if sign else ''}.0f} %"


def _routing(runs) -> dict:
    t = runs.get("routing")
    by_load = t["by_load"]
    at = by_load[by_load["load"] == 0.8].set_index("router")
    return {"t": t, "by_load": by_load, "at": at, "attrs": by_load.attrs}


def cluster_routing(runs) -> str:
    """docs/cluster.md: routers at 80 % load, p99 TTFT against load, pooling, findings."""
    f = _routing(runs)
    at, by_load, a = f["at"], f["by_load"], f["attrs"]
    pooling = f["t"]["pooling"]
    routers = list(at.index)
    best = at["ttft_p99"].idxmin()
    worst = at["ttft_p99"].idxmax()
    claim(best == "least_tokens", "least_tokens has the lowest p99 TTFT at 80 % load")
    claim(worst == "least_kv", "least_kv has the highest p99 TTFT at 80 % load")
    claim(at.loc["round_robin", "ttft_p99"] < at.loc["jsq", "ttft_p99"],
          "round robin beats jsq on p99 TTFT")
    claim(at.loc["least_kv", "load_imbalance"] <= at["load_imbalance"].median(),
          "least_kv balances the work at least as well as the median router")
    grid = by_load.pivot(index="router", columns="load", values="ttft_p99").loc[routers]
    top = grid.columns.max()
    claim(grid.loc["round_robin", top] > grid.loc["jsq", top],
          "round robin falls behind jsq near saturation")
    kv_lo, kv_hi = grid.loc["least_kv"].iloc[0], grid.loc["least_kv"].iloc[-1]
    claim((grid.loc["least_tokens"] <= grid.min(axis=0) + 1e-12).all(),
          "least_tokens has the lowest p99 TTFT at every load")
    table = at[["ttft_p50", "ttft_p99", "tpot_p99", "queue_time_p99", "load_imbalance",
                "load_cv"]].copy()
    table["tpot_p99"] *= 1000
    table = table.reset_index()
    table.columns = ["router", "TTFT p50 (s)", "TTFT p99 (s)", "TPOT p99 (ms)",
                     "queue time p99 (s)", "load imbalance", "load CV"]
    grid_table = grid.reset_index()
    grid_table.columns = ["router"] + [_pc(load) for load in grid.columns]
    alone, pooled = pooling.iloc[0], pooling.iloc[1]
    tpot = at["tpot_p99"] * 1000
    return "\n".join([
        f"Capacity is eight times one replica's saturated throughput on the same trace "
        f"({num(a['replica_capacity'])} req/s, the trace replayed at 10 req/s), "
        f"{num(a['capacity'])} req/s; 80 % is {num(a['rate80'])} req/s.",
        "",
        "At 80 % load, exact state:",
        "",
        md_table(table),
        "",
        "p99 TTFT (s) against load:",
        "",
        md_table(grid_table),
        "",
        "![p99 TTFT and TPOT against load](img/cluster_ttft_vs_load.png)",
        "",
        f"- **The load signal matters more than the policy.** With 256 sequences and ample KV "
        f"per replica, a request never waits for a batch slot; its TTFT is set by how many "
        f"prompt tokens the replica is prefilling when it arrives. `least_tokens` counts exactly "
        f"that (prompt tokens until the first token) and has the lowest TTFT tail at every load "
        f"({num(at.loc['least_tokens', 'ttft_p99'])} s p99 at 80 %, queue-time p99 "
        f"{_ms(at.loc['least_tokens', 'queue_time_p99'])}). A request count (`jsq`, "
        f"`power_of_two`) treats a 3,000-token prompt like a 20-token one and does worse than "
        f"blind `round_robin` at 80 % ({num(at.loc['jsq', 'ttft_p99'])} s against "
        f"{num(at.loc['round_robin', 'ttft_p99'])} s), whose strict rotation spaces each "
        f"replica's arrivals evenly (Erlang-8 instead of Poisson gaps). Near saturation the "
        f"load-blind routers collapse: at {_pc(top)} `round_robin` reaches "
        f"{num(grid.loc['round_robin', top])} s and `random` {num(grid.loc['random', top])} s, "
        f"while JSQ holds {num(grid.loc['jsq', top])} s.",
        f"- **KV use is a poor routing signal.** A queued request holds no KV, so `least_kv` "
        f"keeps sending arrivals to the replica whose blocks are emptiest until its next "
        f"iteration admits them: its p99 TTFT is the worst ({num(at.loc['least_kv', 'ttft_p99'])}"
        f" s) and grows fastest with load ({num(kv_lo)} → {num(kv_hi)} s from "
        f"{_pc(grid.columns[0])} to {_pc(grid.columns[-1])}), while it balances the run's work "
        f"as well as most (imbalance {num(at.loc['least_kv', 'load_imbalance'], 4)}): "
        f"run-averaged balance says little about the tail.",
        f"- Routers differ less on TPOT ({num(tpot.min())}–{num(tpot.max())} ms p99): decode cost "
        f"depends on the batch, which every balanced router keeps similar.",
        f"- Eight replicas pool their load: at 90 % of capacity the cluster's p99 TTFT is "
        f"{num(pooled['ttft_p99'])} s (JSQ), while one replica alone at 90 % of its own capacity "
        f"has {num(alone['ttft_p99'])} s.",
    ])


def cluster_staleness(runs) -> str:
    """docs/cluster.md: exact against stale state, and what herding looks like."""
    f = _routing(runs)
    st = f["t"]["staleness"]
    rep = f["t"]["replicas"]
    p99 = st.pivot(index="router", columns="refresh_interval", values="ttft_p99")
    q99 = st.pivot(index="router", columns="refresh_interval", values="queue_time_p99")
    routers = list(dict.fromkeys(st["router"]))
    p99, q99 = p99.loc[routers], q99.loc[routers]
    intervals = list(p99.columns)
    slow = intervals[-1]
    growth = p99[slow] / p99[0.0] - 1
    claim(growth.idxmin() == "power_of_two", "power of two choices suffers least from staleness")
    claim((p99[slow] > p99[0.0]).all(), "stale state raises every router's p99 TTFT")
    waiting = rep.groupby("variant")["num_waiting_max"]
    stale_wait, exact_wait = waiting.get_group("jsq, 500 ms snapshot"), \
        waiting.get_group("jsq, exact")
    claim(stale_wait.min() > exact_wait.max(), "a stale snapshot builds longer queues")
    rate80 = f["attrs"]["rate80"]
    rows = [{"router": r,
             "p99 TTFT exact / 50 ms / 500 ms (s)": " / ".join(num(p99.loc[r, i])
                                                           for i in intervals),
             "p99 queue time exact / 50 ms / 500 ms (s)": " / ".join(num(q99.loc[r, i])
                                                                  for i in intervals)}
            for r in routers]
    jsq50 = p99.loc["jsq", intervals[1]] / p99.loc["jsq", 0.0] - 1
    lt50 = p99.loc["least_tokens", intervals[1]] / p99.loc["least_tokens", 0.0] - 1
    return "\n".join([
        md_table(pd.DataFrame(rows)),
        "",
        "![stale state](img/cluster_staleness.png)",
        "",
        f"- **Stale state causes herding.** Between two scrapes every arrival sees the same "
        f"\"least loaded\" replica, so a 500 ms snapshot sends about {rate80 * slow:.0f} "
        f"requests ({num(rate80)} req/s × 0.5 s) to one replica at a time: its queue jumps to "
        f"{int(stale_wait.min())}–{int(stale_wait.max())} waiting (`num_waiting_max`; "
        f"{int(exact_wait.min())}–{int(exact_wait.max())} with exact state) and JSQ's p99 TTFT "
        f"goes from {num(p99.loc['jsq', 0.0])} to {num(p99.loc['jsq', slow])} s; `least_tokens`"
        f" loses its whole advantage. Even 50 ms (one or two arrivals per scrape) costs JSQ "
        f"{_pc(jsq50)} and `least_tokens` {_pc(lt50)} of p99 TTFT.",
        f"- **Power of two choices is robust to staleness** ({_pc(growth['power_of_two'], True)}"
        f" at 500 ms): two random candidates split each herd, as Mitzenmacher's analysis of "
        f"stale load information predicts. With state older than a few inter-arrival times it "
        f"is the best of the load-aware routers here.",
        "- The run-averaged token imbalance hardly moves under any setting: herding is an "
        "instantaneous imbalance that averages out, visible in queue lengths, not in totals.",
        "",
        "![requests in each replica over 20 s: exact vs 500 ms snapshot]"
        "(img/cluster_herding.png)",
    ])


def cluster_affinity(runs) -> str:
    """docs/cluster.md: cache affinity against load balance with prefix caching on."""
    aff = _routing(runs)["t"]["affinity"]
    on = aff[aff["caching"] == "on"].set_index(["workload", "router"])
    off = aff[aff["caching"] == "off"].set_index("workload")
    sp, se = on.loc["shared-prefix"], on.loc["sessions"]
    claim(sp["prefix_hit_rate"].idxmax() == "prefix_affinity",
          "prefix_affinity has the highest hit rate on the shared-prefix workload")
    claim(se.loc["session_affinity", "prefix_hit_rate"] > se.loc["jsq", "prefix_hit_rate"],
          "session_affinity beats jsq on hit rate for sessions")
    claim(sp.loc["prefix_affinity", "ttft_p50"] < sp.loc["jsq", "ttft_p50"],
          "affinity lowers the median TTFT")
    claim(se.loc["session_affinity", "ttft_p99"] < se.loc["jsq", "ttft_p99"],
          "session affinity lowers the sessions' p99 TTFT")
    balancers = ["round_robin", "jsq", "least_tokens"]
    rows = []
    for name in ("shared-prefix", "sessions"):
        for router, r in on.loc[name].iterrows():
            rows.append({"workload": name, "router": router, "hit rate": r["prefix_hit_rate"],
                         "TTFT p50 (s)": r["ttft_p50"], "TTFT p99 (s)": r["ttft_p99"],
                         "TPOT p99 (ms)": r["tpot_p99"] * 1000,
                         "load imbalance": r["load_imbalance"]})
        o = off.loc[name]
        rows.append({"workload": name, "router": "jsq, caching off", "hit rate": 0.0,
                     "TTFT p50 (s)": o["ttft_p50"], "TTFT p99 (s)": o["ttft_p99"],
                     "TPOT p99 (ms)": o["tpot_p99"] * 1000, "load imbalance": o["load_imbalance"]})
    rate_sp = off.loc["shared-prefix", "rate"]
    rate_se = off.loc["sessions", "rate"]
    lo_sp = sp.loc[balancers, "prefix_hit_rate"]
    lo_se = se.loc[balancers, "prefix_hit_rate"]
    return "\n".join([
        f"Offered load: {num(rate_sp)} req/s of `shared-prefix` and {num(rate_se)} sessions/s "
        f"(8 turns each), 80 % of what eight replicas serve with caching off.",
        "",
        md_table(pd.DataFrame(rows)),
        "",
        "![hit rate and p99 TTFT per router](img/cluster_affinity.png)",
        "",
        f"- **Affinity multiplies the hit rate.** The load balancers spread every prefix group "
        f"over all eight replicas, so each cache sees all 128 system prompts (twice its size) "
        f"and hits {num(lo_sp.min(), 2)}–{num(lo_sp.max(), 2)} of the prompt tokens; "
        f"`prefix_affinity` keeps each group on the replica that cached it and hits "
        f"{num(sp.loc['prefix_affinity', 'prefix_hit_rate'], 2)}, cutting the median TTFT from "
        f"{num(sp.loc['jsq', 'ttft_p50'])} s (JSQ) to "
        f"{num(sp.loc['prefix_affinity', 'ttft_p50'])} s. `weighted` (prefix + queue + KV "
        f"scores) sits between ({num(sp.loc['weighted', 'prefix_hit_rate'], 2)}); "
        f"`session_affinity` has no sessions to follow here and routes as JSQ does.",
        f"- **Sessions want stickiness.** A turn's prompt is its whole history, cached where the "
        f"previous turn ran: `session_affinity` (and `prefix_affinity`, which finds the same "
        f"replica by its cache) hit {num(se.loc['session_affinity', 'prefix_hit_rate'], 2)} "
        f"against {num(lo_se.min(), 2)}–{num(lo_se.max(), 2)} for the balancers, and their p99 "
        f"TTFT is {num(se.loc['session_affinity', 'ttft_p99'])} s against "
        f"{num(se.loc['jsq', 'ttft_p99'])} s for JSQ.",
        f"- The price is balance: the affinity routers' load imbalance is "
        f"{num(sp.loc['prefix_affinity', 'load_imbalance'], 3)} (shared-prefix) and "
        f"{num(se.loc['session_affinity', 'load_imbalance'], 3)} (sessions) against "
        f"{num(sp.loc['jsq', 'load_imbalance'], 3)} and {num(se.loc['jsq', 'load_imbalance'], 3)}"
        f" for JSQ; the load cap (1.5 x the mean outstanding requests + 4) keeps it bounded.",
    ])


def cluster_deployment(runs) -> str:
    """docs/cluster.md: the cheapest deployment per rate and what the search shows."""
    t = runs.get("deployment_search")
    best = t.attrs["best"]
    ok = t[t["status"] == "ok"]

    def cand(label):
        return ok[ok["label"] == label].set_index("rate")

    a100, l40s, tp2 = (cand("a100-80gb tp1 jsq"), cand("l40s tp1 jsq"),
                       cand("a100-80gb tp2 jsq"))
    rr, small = cand("a100-80gb tp1 round_robin"), \
        cand("a100-80gb tp1 jsq max_num_batched_tokens=512")
    rates = list(best["rate"])
    top = rates[-1]
    dearest = ok.groupby("rate")["cost_per_million"].max()
    claim((l40s["cost_per_million"] >= dearest.loc[l40s.index] - 1e-9).all(),
          "the L40S is the most expensive per request at every rate")
    claim((l40s["tpot_p99"] > 0.04).all(), "the L40S runs near the TPOT limit")
    tp2_cheaper = [r for r in tp2.index
                   if tp2.loc[r, "cost_per_million"] < a100.loc[r, "cost_per_million"] - 1e-9]
    tp2_text = ("is never cheaper than TP1 replicas" if not tp2_cheaper else
                "is cheaper than TP1 replicas only at " + ", ".join(num(r) for r in tp2_cheaper)
                + " req/s (" + ", ".join(
                    f"{int(tp2.loc[r, 'num_replicas'])} x 2 GPUs, "
                    f"${num(tp2.loc[r, 'cost_per_million'])} against "
                    f"{int(a100.loc[r, 'num_replicas'])} x 1, "
                    f"${num(a100.loc[r, 'cost_per_million'])}" for r in tp2_cheaper) + ")")
    claim((tp2["ttft_p99"] < a100.loc[tp2.index, "ttft_p99"]).all(),
          "TP2 lowers the A100's TTFT")
    claim(a100["cost_per_million"].iloc[0] > a100["cost_per_million"].min(),
          "cost per request falls with load")
    rows = []
    for _, b in best.iterrows():
        r = b["rate"]
        rows.append({"rate (req/s)": num(r), "cheapest": f"{b['label']}",
                     "replicas": int(b["num_replicas"]),
                     "$ per M requests": num(b["cost_per_million"]),
                     "p99 TTFT (s)": num(b["ttft_p99"]), "p99 TPOT (ms)": num(b["tpot_p99"] * 1e3),
                     "A100-80GB TP1 (JSQ)": f"{int(a100.loc[r, 'num_replicas'])}, "
                                            f"${num(a100.loc[r, 'cost_per_million'])}",
                     "L40S": (f"{int(l40s.loc[r, 'num_replicas'])}, "
                              f"${num(l40s.loc[r, 'cost_per_million'])}" if r in l40s.index
                              else "infeasible")})
    more_rr = [r for r in rates if rr.loc[r, "num_replicas"] > a100.loc[r, "num_replicas"]]
    rr_text = (f"round robin needs more replicas than JSQ at {', '.join(num(r) for r in more_rr)}"
               f" req/s" if more_rr else "round robin needs as many replicas as JSQ at every rate")
    winners = list(dict.fromkeys(best["gpu"]))
    return "\n".join([
        f"{len(t.attrs['runs'])} simulations.",
        "",
        md_table(pd.DataFrame(rows)),
        "",
        "![cost against p99 TTFT with the Pareto front](img/deployment_cost_vs_ttft.png)",
        "",
        f"- Cost per request falls with load while replicas fill up (A100-80GB: "
        f"${num(a100['cost_per_million'].iloc[0])} per million at {num(rates[0])} req/s, "
        f"${num(a100['cost_per_million'].min())} from "
        f"{num(a100['cost_per_million'].idxmin())} req/s): replica counts are integers, so low "
        f"rates pay for idle capacity, and "
        + ("the cheapest GPU changes with the rate (" + ", ".join(winners) + ")."
           if len(winners) > 1 else f"the {winners[0]} is the cheapest at every rate."),
        "- The L40S is the most expensive per request at every rate: its 864 GB/s memory makes "
        f"decode slow (p99 TPOT {num(l40s['tpot_p99'].min() * 1e3)}–"
        f"{num(l40s['tpot_p99'].max() * 1e3)} ms against the 50 ms limit). Tensor parallelism "
        f"(TP2) lowers the A100's TTFT but {tp2_text}.",
        f"- At {num(top)} req/s a 512-token budget needs {int(small.loc[top, 'num_replicas'])} "
        f"A100-80GBs against {int(a100.loc[top, 'num_replicas'])} with the default 2,048 "
        f"tokens; {rr_text}.",
        "- The H100 and H200 figures come from the cost model's calibration for those GPUs (see "
        "[cost_model.md](cost_model.md)); they move with it.",
    ])


def readme_cluster(runs) -> str:
    """docs/experiments.md (findings at a glance): one bullet each for routing and deployment
    search."""
    f = _routing(runs)
    at = f["at"]
    st = f["t"]["staleness"].pivot(index="router", columns="refresh_interval",
                                   values="ttft_p99")
    aff = f["t"]["affinity"]
    sp = aff[(aff["caching"] == "on") & (aff["workload"] == "shared-prefix")] \
        .set_index("router")
    dep = runs.get("deployment_search")
    best = dep.attrs["best"]
    claim(at["ttft_p99"].idxmin() == "least_tokens", "least_tokens has the lowest p99 TTFT")
    claim(at.loc["round_robin", "ttft_p99"] < at.loc["jsq", "ttft_p99"],
          "round robin beats jsq")
    slow = st.columns.max()
    p2 = st.loc["power_of_two", slow] / st.loc["power_of_two", 0.0] - 1
    return "\n".join([
        f"- **Routing** (8 × Llama-2-7B on A100-80GB, Azure conversation trace at 80 % of "
        f"cluster capacity): `least_tokens` has the lowest p99 TTFT "
        f"({num(at.loc['least_tokens', 'ttft_p99'])} s), blind `round_robin` "
        f"({num(at.loc['round_robin', 'ttft_p99'])} s) beats `jsq` "
        f"({num(at.loc['jsq', 'ttft_p99'])} s) and `least_kv` is worst "
        f"({num(at.loc['least_kv', 'ttft_p99'])} s: queued requests hold no KV). A load snapshot "
        f"500 ms old herds arrivals onto one replica at a time (JSQ's p99 TTFT "
        f"{num(st.loc['jsq', 0.0])} → {num(st.loc['jsq', slow])} s); power of two choices loses "
        f"only {_pc(p2)}. With prefix caching on 128 shared system prompts, `prefix_affinity` "
        f"hits {num(sp.loc['prefix_affinity', 'prefix_hit_rate'], 2)} of prompt tokens against "
        f"{num(sp.loc['jsq', 'prefix_hit_rate'], 2)} for JSQ.",
        f"- **Deployment search** (p99 TTFT ≤ 1 s, p99 TPOT ≤ 50 ms, same trace): the cheapest "
        f"deployment per rate is "
        + "; ".join(f"{int(b['num_replicas'])} × {b['gpu']} at {num(b['rate'])} req/s "
                    f"(${num(b['cost_per_million'])} per million requests)"
                    for _, b in best.iterrows())
        + " under the assumed GPU prices.",
    ])
