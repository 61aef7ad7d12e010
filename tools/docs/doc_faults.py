"""The generated block of docs/faults.md (see tools.docs.check_docs): one replica failure at
the peak of a ServeGen hour, client retries, the autoscaler and a retry storm
(``experiments.incidents --quick``)."""

from __future__ import annotations

from tools.docs.doc_format import claim, md_table, num


def _pc(share: float) -> str:
    return f"{share * 100:.1f} %"


def faults_incidents(runs) -> str:
    """docs/faults.md: the incident scenarios' attainment, goodput, retries and wasted work."""
    t = runs.get("incidents", "--quick")["runs"]
    a = t.attrs
    r = t.set_index("scenario")
    calm, lost = r.loc["no failure"], r.loc["no retries"]
    retried = r.loc["retries, 10 s timeout"]
    claim(lost["num_failed"] > 0 and retried["num_failed"] == 0,
          "without retries the failure loses requests; with retries none")
    claim(retried["attainment"] >= lost["attainment"],
          "retries keep attainment at least as high as no retries")
    claim(r.loc["retries, 30 s timeout"]["num_timed_out"] == retried["num_timed_out"] == 0,
          "neither timeout fires at 85 % load")
    calm_storm, storm = r.loc["storm: no retries"], r.loc["storm: no backoff"]
    budget = r.loc["storm: budget + backoff"]
    claim(storm["goodput"] < calm_storm["goodput"], "the retry storm lowers goodput")
    claim(storm["wasted_prefill_tokens"] > 2 * calm_storm["wasted_prefill_tokens"],
          "the retry storm more than doubles the wasted prefill")
    claim(calm_storm["goodput"] > budget["goodput"] > storm["goodput"],
          "a retry budget with backoff sits between no retries and the storm")
    table = t[["scenario", "num_requests", "attainment", "goodput", "ttft_p99", "num_failed",
               "num_timed_out", "retry_share", "wasted_prefill_tokens"]].copy()
    table["attainment"] = [_pc(v) for v in table["attainment"]]
    table["retry_share"] = [_pc(v) for v in table["retry_share"]]
    table.columns = ["scenario", "requests", "SLO attainment", "goodput (req/s)",
                     "TTFT p99 (s)", "failed", "timed out", "retries / requests",
                     "wasted prefill tokens"]
    return "\n".join([
        f"One replica serves {num(a['capacity'])} req/s on these lengths; the hour's busiest "
        f"window offers {num(a['peak_rate'])} req/s to the 16 (85 %); the load's windows are "
        f"compressed {num(a['compress'])}× (`--quick`). Replica 0 fails at "
        f"t={num(a['fail_at'])} s and is routable again at t={num(a['back_at'])} s.",
        "",
        md_table(table),
        "",
        f"- **One failure in 16 at 85 % load costs the requests in flight, nothing more.** "
        f"Without retries {int(lost['num_failed'])} requests fail (attainment "
        f"{_pc(lost['attainment'])} against {_pc(calm['attainment'])} without the failure); "
        f"with retries every one of them finishes elsewhere "
        f"({_pc(retried['retry_share'])} extra attempts) and the other 15 replicas absorb the "
        f"load without a queue, so the 30 s and 10 s timeouts never fire and give the same run.",
        f"- **Retries turn overload into a storm.** At 125 % of capacity, clients that give up "
        f"after 1 s and retry at once send {_pc(storm['retry_share'])} more attempts than "
        f"requests, waste {num(storm['wasted_prefill_tokens'] / 1e6)} M prefill tokens "
        f"(against {num(calm_storm['wasted_prefill_tokens'] / 1e6)} M without retries) and "
        f"cut goodput from {num(calm_storm['goodput'])} to {num(storm['goodput'])} req/s; a "
        f"10 % retry budget with jittered backoff keeps {num(budget['goodput'])} req/s.",
    ])


def faults_links(runs) -> str:
    """docs/faults.md: a degraded KV-transfer link in a 4P4D pool (slowed, down with retries,
    down with recomputation)."""
    t = runs.get("incidents", "--quick")["links"]
    a = t.attrs
    r = t.set_index("scenario")
    calm, retry, recompute = (r.loc["no incident"], r.loc["link down, retry"],
                              r.loc["link down, recompute"])
    slow, failure = r.iloc[1], r.loc["prefill replica 0 fails"]
    links = t[t["scenario"] != "prefill replica 0 fails"]
    claim(links["ttft_p99"].max() <= 1.1 * calm["ttft_p99"],
          "no link scenario moves TTFT p99 by more than 10 %")
    claim(failure["ttft_p99"] > 1.5 * calm["ttft_p99"] and failure["tpot_p99"]
          < 1.2 * calm["tpot_p99"], "a prefill replica's failure costs TTFT, not TPOT")
    claim(retry["kv_transfer_time_max"] > 0.5 * (a["link_until"] - a["link_at"]),
          "retried transfers wait out most of the outage")
    claim(retry["tpot_p99"] > 5 * calm["tpot_p99"] and slow["tpot_p99"] > 5 * calm["tpot_p99"],
          "a slowed or retried link multiplies TPOT p99")
    claim(recompute["kv_transfer_time_max"] == calm["kv_transfer_time_max"]
          and recompute["itl_p99"] > 2 * calm["itl_p99"]
          and recompute["tpot_p99"] < 2 * calm["tpot_p99"],
          "recomputation keeps hand-offs short, raises ITL p99, not TPOT p99")
    table = t[["scenario", "ttft_p99", "itl_p99", "tpot_p99", "kv_transfer_time_max",
               "num_transfer_failures", "num_recomputed", "num_failed"]].copy()
    for col in ("itl_p99", "tpot_p99"):
        table[col] = [num(v * 1000) for v in table[col]]
    table.columns = ["scenario", "TTFT p99 (s)", "ITL p99 (ms)", "TPOT p99 (ms)",
                     "longest transfer (s)", "failed transfers", "recomputed",
                     "failed requests"]
    ms = lambda v: num(v * 1000)  # noqa: E731
    return "\n".join([
        f"The 4P4D pool serves {num(a['link_capacity'])} req/s on these lengths; it is offered "
        f"{num(a['link_rate'])} req/s (70 %) for {num(a['link_duration'])} s (`--quick`). "
        f"Prefill replica 0's link degrades from t={num(a['link_at'])} s to "
        f"t={num(a['link_until'])} s.",
        "",
        md_table(table),
        "",
        f"- **TTFT does not see the link.** The prefill replica emits the first token before "
        f"the transfer, and its memory holds the KV waiting to leave for the whole outage, so "
        f"TTFT p99 stays at {num(calm['ttft_p99'])} s in every link scenario.",
        f"- **Slowed or retried, the transfers wait out the outage in the second token's gap.** "
        f"At {slow.name.split()[-1]} of its bandwidth or down with retries, a transfer leaving "
        f"replica 0 takes up to {num(slow['kv_transfer_time_max'])} s / "
        f"{num(retry['kv_transfer_time_max'])} s, and TPOT p99 goes from "
        f"{ms(calm['tpot_p99'])} ms to {ms(slow['tpot_p99'])} / {ms(retry['tpot_p99'])} ms "
        f"({int(retry['num_transfer_failures'])} transfers failed and were sent again at "
        f"recovery). ITL p99, pooled over every token, barely shows it ("
        f"{ms(calm['itl_p99'])} → {ms(retry['itl_p99'])} ms).",
        f"- **Recomputing moves the cost to the decode replicas' batches.** With "
        f"`on_link_down=\"recompute\"` no transfer waits (the longest is "
        f"{ms(recompute['kv_transfer_time_max'])} ms, as without the incident) and TPOT p99 "
        f"stays at {ms(recompute['tpot_p99'])} ms, but the {int(recompute['num_recomputed'])} "
        f"prompts prefilled again on the decode replicas lengthen their iterations: ITL p99 "
        f"goes from {ms(calm['itl_p99'])} to {ms(recompute['itl_p99'])} ms.",
        f"- **Losing the replica instead costs TTFT.** If prefill replica 0 itself fails for "
        f"as long, {int(failure['num_failed'])} request(s) in flight there fail and the other "
        f"three prefill replicas take its share: TTFT p99 goes from {num(calm['ttft_p99'])} to "
        f"{num(failure['ttft_p99'])} s while TPOT p99 stays at {ms(failure['tpot_p99'])} ms.",
    ])
