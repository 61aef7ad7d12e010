"""Generated blocks of docs/llm_d.md and docs/experiments.md: the study ``experiments.llm_d``
(its quick form, about a minute on two cores)."""

from __future__ import annotations

import pandas as pd

from tools.docs.doc_format import claim, md_table, num

NAMES = {"ttft_p50": "TTFT p50 (s)", "ttft_p99": "TTFT p99 (s)", "tpot_p99": "TPOT p99 (s)",
         "prefix_hit_rate": "prefix hit rate", "load_imbalance": "load imbalance"}


def _tables(runs) -> dict:
    return runs.get("llm_d", "--quick")


def _p99(table: pd.DataFrame, workload: str, n: int, router: str) -> float:
    t = table
    return float(t[(t.workload == workload) & (t.num_replicas == n)
                   & (t.router == router)].ttft_p99.iloc[0])


def llm_d_routers(runs) -> str:
    """docs/llm_d.md: the default profile against simsched's routers."""
    t = _tables(runs)
    r = t["routers"]
    caps = t["capacity"].set_index("workload")["replica_capacity"]
    n = int(r.num_replicas.max())
    others = ("jsq", "least_kv", "weighted")
    claim(all(_p99(r, "mooncake", n, "llm-d") <= _p99(r, "mooncake", n, o) for o in others),
          f"llm-d's default profile has the lowest Mooncake p99 TTFT of jsq/least_kv/weighted "
          f"at {n} replicas")
    view = r[["workload", "num_replicas", "router", *NAMES]].rename(
        columns={**NAMES, "num_replicas": "replicas"})
    return "\n".join([
        md_table(view), "",
        f"One replica saturates at {num(caps['mooncake'])} req/s on Mooncake and "
        f"{num(caps['servegen'])} req/s on the ServeGen arrivals; each cluster is offered 80 % "
        f"of its replica count times that. On Mooncake, whose prompts share prefixes, the "
        f"default profile's prefix term gives it `prefix_affinity`'s hit rate with a p99 TTFT "
        f"of {num(_p99(r, 'mooncake', n, 'llm-d'))} s at {n} replicas, against "
        f"{num(_p99(r, 'mooncake', n, 'jsq'))} s for `jsq` and "
        f"{num(_p99(r, 'mooncake', n, 'least_kv'))} s for `least_kv` (KV use alone lags "
        f"the queue)."])


def llm_d_scrape(runs) -> str:
    """docs/llm_d.md: the scrape interval."""
    s = _tables(runs)["scrape"]
    p = s.pivot(index="refresh_interval", columns="router", values="ttft_p99")
    claim(p.loc[0.5, "jsq"] > p.loc[0.0, "jsq"], "a 500 ms scrape hurts jsq")
    view = pd.DataFrame({"scrape interval (ms)": [int(round(v * 1000)) for v in p.index],
                         "llm-d p99 TTFT (s)": p["llm-d"].to_numpy(),
                         "jsq p99 TTFT (s)": p["jsq"].to_numpy()})
    return "\n".join([
        md_table(view), "",
        f"With gauges 500 ms old, `jsq` herds onto the replicas that looked idle (p99 TTFT "
        f"{num(p.loc[0.0, 'jsq'])} s exact, {num(p.loc[0.5, 'jsq'])} s at 500 ms); the default "
        f"profile moves from {num(p.loc[0.0, 'llm-d'])} s to {num(p.loc[0.5, 'llm-d'])} s: its "
        f"prefix index is updated at dispatch, never stale, and spreads requests by content."])


def llm_d_pd(runs) -> str:
    """docs/llm_d.md: the P/D threshold sweep."""
    d = _tables(runs)["pd"]
    label = ["always" if v < 0 else f"{v:,}" for v in d.non_cached_tokens]
    view = pd.DataFrame({"nonCachedTokens": label,
                         "disaggregated": [f"{v * 100:.0f} %" for v in d.disaggregated],
                         **{NAMES[c]: d[c].to_numpy() for c in ("ttft_p50", "ttft_p99",
                                                                "tpot_p99")}})
    never, always = d.iloc[0], d.iloc[-1]
    best = d.loc[d.ttft_p99.idxmin()]
    claim(never.ttft_p99 > best.ttft_p99 and always.ttft_p99 > best.ttft_p99,
          "an intermediate threshold beats decode-only and always-disaggregate on p99 TTFT")
    return "\n".join([
        md_table(view), "",
        f"Decode only (threshold 0) leaves the four prefill replicas idle: p99 TTFT "
        f"{num(never.ttft_p99)} s. Disaggregating every request queues all prefills on them "
        f"({num(always.ttft_p99)} s). Of the thresholds tried, "
        f"{int(best.non_cached_tokens):,} uncached tokens splits the work "
        f"({best.disaggregated * 100:.0f} % disaggregated): p99 TTFT "
        f"{num(best.ttft_p99)} s; p99 TPOT {num(best.tpot_p99)} s against "
        f"{num(never.tpot_p99)} s decode-only, where long prefills interrupt decodes."])


def experiments_llm_d(runs) -> str:
    """docs/experiments.md: one paragraph."""
    t = _tables(runs)
    r, d = t["routers"], t["pd"]
    n = int(r.num_replicas.max())
    best = d.loc[d.ttft_p99.idxmin()]
    return (f"llm-d's default profile against simsched's routers on Mooncake at {n} replicas: "
            f"p99 TTFT {num(_p99(r, 'mooncake', n, 'llm-d'))} s against "
            f"{num(_p99(r, 'mooncake', n, 'jsq'))} s for `jsq`; its P/D handler on 4 + 4 "
            f"replicas does best at nonCachedTokens = {int(best.non_cached_tokens):,} "
            f"(p99 TTFT {num(best.ttft_p99)} s, against {num(d.iloc[0].ttft_p99)} s decode-only "
            f"and {num(d.iloc[-1].ttft_p99)} s always disaggregated). "
            "[docs/llm_d.md](llm_d.md#the-study-experimentsllm_d)")


def llm_d_slo(runs) -> str:
    """docs/llm_d.md: predicted-latency routing against the default profile under an SLO."""
    from experiments.llm_d import SLO_TPOT, SLO_TTFT
    s = _tables(runs)["slo"]
    d = s[s.profile == "default"].set_index("load")
    claim(d.slo_attainment.iloc[0] >= d.slo_attainment.iloc[-1],
          "the default profile's SLO attainment does not rise with the load")
    view = pd.DataFrame({"load": [f"{v * 100:.0f} %" for v in s.load],
                         "profile": s.profile.to_numpy(),
                         "SLO attainment": [f"{v * 100:.1f} %" for v in s.slo_attainment],
                         "goodput (req/s)": s.goodput.to_numpy(),
                         **{NAMES[c]: s[c].to_numpy() for c in ("ttft_p50", "ttft_p99",
                                                                "tpot_p99")}})
    best = s.loc[s.groupby("load").slo_attainment.idxmax()]
    wins = ", ".join(f"{r.profile} at {r.load * 100:.0f} % ({r.slo_attainment * 100:.1f} %)"
                     for r in best.itertuples())
    least = s[s.profile == "predicted (least)"].set_index("load")
    return "\n".join([
        md_table(view), "",
        f"SLO: TTFT {num(SLO_TTFT)} s and TPOT {num(SLO_TPOT * 1000)} ms, on every request. "
        f"Highest attainment: {wins}. The predictor profile's own scorer strategy, `least`, "
        f"packs requests onto the endpoints predicted closest to the SLO (llm-d's choice, to "
        f"keep headroom elsewhere): with simsched's linear model it meets the SLO for "
        f"{least.slo_attainment.iloc[1] * 100:.1f} % of requests at "
        f"{least.index[1] * 100:.0f} % load, against "
        f"{d.slo_attainment.iloc[1] * 100:.1f} % for the default profile."])
