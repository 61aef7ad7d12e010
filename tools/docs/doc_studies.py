"""The generated blocks of docs/experiments.md and docs/policies.md (see tools.docs.check_docs)."""

from __future__ import annotations

import warnings

import numpy as np

from tools.docs.doc_blocks import _load_sweep_facts, _ms, _zoo
from tools.docs.doc_format import claim, md_table, num


def experiments_load_sweep(runs) -> str:
    """docs/experiments.md: the load sweep's table and what it shows."""
    from experiments.load_sweep import settings

    f = _load_sweep_facts(runs)
    table, by, sat = f["table"], f["by"], f["sat"]
    cfg = settings(False)
    rates, seeds = cfg["rates"], cfg["seeds"]
    labels = {"fcfs": "FCFS", "spf": "SPF", "spf+preempt": "SPF + preemption",
              "priority": "priority (3 classes)"}
    shown = table.assign(policy=table["policy"].map(labels),
                         ci=[f"{num(a)}–{num(b)}" for a, b in zip(table["ci_low"],
                                                                  table["ci_high"])])
    shown = shown[["policy", "saturation_rate", "capacity", "ci", "max_goodput"]]
    shown.columns = ["policy", "saturation rate (req/s)", "capacity (req/s)", "95 % CI",
                     "max goodput (req/s)"]
    hi = sat.max()
    # The knee: the first rate whose worst TTFT p99 is over 3x the previous rate's.
    worst = by["ttft_p99"].groupby(level="rate").max()
    steps = sorted(rates)
    jumps = [r for prev, r in zip(steps, steps[1:]) if worst[r] > 3 * worst[prev]]
    claim(len(jumps) > 0, "TTFT p99 jumps at some rate")
    knee = jumps[0]
    below = steps[steps.index(knee) - 1]
    kv = by.loc["fcfs", "kv_usage_mean"]
    p99_below = worst[below]
    at_knee = by.xs(knee, level="rate")["ttft_p99"]
    top = max(rates)
    claim(by.loc[("spf", top), "ttft_p50"] < by.loc[("fcfs", top), "ttft_p50"],
          "SPF keeps the median TTFT low past saturation")
    claim(f["cap"].nunique() == 1, "no policy moves the capacity under a p99 TTFT target")
    claim(by.loc[("spf+preempt", hi), "ttft_p99"] > by.loc[("fcfs", hi), "ttft_p99"],
          "SPF with admission preemption is worse than FCFS beyond saturation")
    seeds_text = " and ".join(map(str, seeds))
    return "\n".join([
        f"`load_sweep` ({cfg['num_requests']} requests per run, rates {num(min(rates))}–"
        f"{num(max(rates))} req/s, seeds {seeds_text}):",
        "",
        md_table(shown),
        "",
        f"- The engine is KV-bound on this workload: mean KV use (FCFS) grows from "
        f"{kv.loc[below]:.0%} at {num(below)} req/s to {kv.loc[knee]:.0%} at {num(knee)}"
        + (f" and {kv.loc[hi]:.0%} at {num(hi)}" if hi > knee else "")
        + f" req/s, and all four policies saturate at "
        f"{'or below ' if sat.nunique() > 1 else ''}{num(hi)} req/s. Up to {num(below)} req/s "
        f"TTFT p99 stays under {num(p99_below, 2)} s for every policy; at {num(knee)} req/s it "
        f"jumps to {num(at_knee['fcfs'], 2)} s (FCFS), {num(at_knee['spf'], 2)} s (SPF), "
        f"{num(at_knee['priority'], 2)} s (priority), {num(at_knee['spf+preempt'], 3)} s "
        f"(SPF+preempt).",
        f"- No policy moves the capacity under a p99 TTFT target"
        f"{' (' + num(f['cap'].iloc[0]) + ' req/s for all)' if f['cap'].nunique() == 1 else ''}: "
        f"the p99 is set by the queue that forms once memory is full, which ordering alone "
        f"cannot shorten.",
        f"- SPF keeps the *median* TTFT low past saturation "
        f"({num(by.loc[('spf', top), 'ttft_p50'], 2)} s at {num(top)} req/s vs "
        f"{num(by.loc[('fcfs', top), 'ttft_p50'], 2)} s for FCFS) at the cost of a long-prompt "
        f"tail; priority keeps the urgent class fast and starves the lowest.",
        f"- SPF with admission preemption is the worst beyond saturation: recomputing evicted "
        f"requests wastes the scarce KV/compute (TTFT p99 "
        f"{num(by.loc[('spf+preempt', hi), 'ttft_p99'], 2)} s vs "
        f"{num(by.loc[('fcfs', hi), 'ttft_p99'], 2)} s for FCFS at {num(hi)} req/s, TPOT p99 "
        f"{num(by.loc[('spf+preempt', hi), 'tpot_p99'], 2)} s).",
    ])


def experiments_token_budget(runs) -> str:
    """docs/experiments.md: the token-budget trade-off."""
    t = runs.get("token_budget").set_index("max_num_batched_tokens")
    lo, mid, hi = t.index.min(), 4096, t.index.max()
    claim(t.loc[mid, "ttft_p99"] < t.loc[lo, "ttft_p99"], "a larger budget lowers TTFT p99")
    claim(t.loc[mid, "itl_p99"] > t.loc[lo, "itl_p99"], "a larger budget raises ITL p99")
    return (f"`token_budget` (1.5 req/s, 300 requests): raising `max_num_batched_tokens` from "
            f"{lo} to {mid} cuts\nTTFT p99 from {num(t.loc[lo, 'ttft_p99'])} s to "
            f"{num(t.loc[mid, 'ttft_p99'])} s (p50 {num(t.loc[lo, 'ttft_p50'], 2)} -> "
            f"{num(t.loc[mid, 'ttft_p50'], 2)} s) but raises the ITL p99 from "
            f"{_ms(t.loc[lo, 'itl_p99'])} to {_ms(t.loc[mid, 'itl_p99'])}\nand the worst gap "
            f"from {_ms(t.loc[lo, 'itl_max'])} to {_ms(t.loc[mid, 'itl_max'])} "
            f"({_ms(t.loc[hi, 'itl_max'])} at {hi}): a big prefill chunk stalls every decoder "
            f"in its iteration, Sarathi-Serve's trade-off.")


def experiments_memory_pressure(runs) -> str:
    """docs/experiments.md: preemptions and tails as the KV cache shrinks (the whole table)."""
    t = runs.get("memory_pressure")
    full = t[t["cache.num_blocks"] == t["cache.num_blocks"].max()]
    claim((full["num_preemptions"] == 0).all(), "the full cache preempts nothing")
    small = t[t["cache.num_blocks"] == t["cache.num_blocks"].min()].set_index("variant")
    claim(small.loc["spf+preempt", "num_preemptions"] > small.loc["fcfs", "num_preemptions"],
          "admission preemption preempts most under pressure")
    shown = t.copy()
    shown.columns = ["KV blocks", "policy", "preemptions", "recomputed tokens", "TTFT p99 (s)",
                     "ITL p99 (s)", "ITL max (s)", "saturation"]
    return "\n".join([
        "`memory_pressure` (1.0 req/s, 250 requests): the KV cache shrinks from the full "
        f"{t['cache.num_blocks'].max():,} blocks; with enough of it nothing is preempted, and "
        "below that preemptions, recomputed tokens and the TTFT and ITL tails grow, most with "
        "SPF + admission preemption (recompute stalls show in the ITL max).",
        "",
        md_table(shown),
    ])


def experiments_starvation(runs) -> str:
    """docs/experiments.md: SPF's starvation of long prompts."""
    st = runs.get("starvation")
    short, long = st.index[0], st.index[-1]
    claim(st.loc[long, ("max", "spf")] > st.loc[long, ("max", "fcfs")], "SPF starves long prompts")
    aging = ("spf_aging" in st.columns.get_level_values(1))
    tail = ""
    if aging:
        bounded = st.loc[long, ("max", "spf_aging")] < st.loc[long, ("max", "spf")]
        tail = (f"; SPF with aging (`spf_aging`) {'bounds' if bounded else 'does not bound'} "
                f"that tail here\n(max {num(st.loc[long, ('max', 'spf_aging')])} s)")
    return (f"`starvation` (2.25 req/s, just below saturation, 400 requests): SPF cuts TTFT p99 "
            f"of short prompts\n(<= {short.right} tokens) from "
            f"{num(st.loc[short, ('p99', 'fcfs')])} s (FCFS) to "
            f"{num(st.loc[short, ('p99', 'spf')])} s, but prompts of {long.left:,}-"
            f"{long.right:,} tokens wait up to {num(st.loc[long, ('max', 'spf')])} s\n(p99 "
            f"{num(st.loc[long, ('p99', 'spf')])} s) vs {num(st.loc[long, ('max', 'fcfs')])} s "
            f"under FCFS{tail}.")


# ----------------------------------------------------------------------------- docs/policies.md


def policies_zoo(runs) -> str:
    """docs/policies.md: the policy zoo's setting, three tables and the reading of them."""
    from experiments import policy_zoo
    from simsched.workloads.workload import WorkloadConfig, describe, generate

    z = _zoo(runs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        window = generate(WorkloadConfig.preset("azure-conv", duration=300.0,
                                                max_prompt_tokens=3072,
                                                long_prompt_policy="clip"),
                          np.random.default_rng(0))
    d = describe(window)
    cols = policy_zoo.COLUMNS
    pol = z["policies"]
    p = pol.set_index(["policy", "mode"])
    ten = z["tenants"].set_index("policy")
    sty = z["styles"].set_index("style")
    rec = lambda name, col: p.loc[(name, "recompute"), col]  # noqa: E731
    claim(rec("sjf_oracle", "ttft_mean") < rec("fcfs", "ttft_mean"), "sjf_oracle beats FCFS")
    claim(all(rec(x, "starve_ttft_max") > rec("fcfs", "starve_ttft_max")
              for x in ("sjf_oracle", "predicted_sjf", "spf")), "SJF and SPF starve long prompts")
    claim(p.loc[("mlfq", "swap"), "num_swaps"] < p.loc[("mlfq", "swap"), "num_preemptions"] / 2,
          "most mlfq preemptions fall back to recompute under swap")
    claim(rec("mlfq", "ttft_mean") < min(rec(x, "ttft_mean") for x, m in p.index
                                         if m == "recompute" and x != "mlfq"),
          "mlfq has the lowest TTFT of all")
    claim(p.loc[("fcfs", "swap"), "ttft_mean"] < rec("fcfs", "ttft_mean"),
          "swap lowers FCFS mean TTFT")
    claim(ten.loc["fair", "share_t0"] < ten.loc["fcfs", "share_t0"], "fair lowers the heavy share")
    claim(sty.loc["prefill_first", "itl_p99"] > sty.loc["stall_free", "itl_p99"],
          "prefill-first worsens the ITL tail")
    return "\n".join([
        f"Azure 2023 conversation trace, first 300 s ({d['num_requests']:,} requests, "
        f"~{d['rate']:.1f} req/s, prompts clipped to 3072\ntokens), Llama-2-7B on A100-80GB "
        f"(calibrated), max_num_seqs 128. Times in seconds; `starve_ttft_max` = largest\nTTFT "
        f"among the longest-prompt decile; `output_throughput` in output tokens/s.",
        "",
        "* **Policies**: KV cache cut to 3000 blocks (48k tokens) so that memory runs out; 30% "
        "of requests\n  priority 0. Admission preemption off (only `mlfq` preempts for "
        "admission, by design).",
        "* **Fairness**: the window replayed at 20 req/s by two tenants sending 80% / 20% of "
        "the requests\n  (full cache); share = each tenant's share of VTC-weighted service "
        "(prompt + 2·output tokens)\n  served until the last arrival.",
        "* **Batching styles**: FCFS, full cache (7422 blocks), the trace at its recorded rate.",
        "",
        "### Policies",
        "",
        md_table(pol[["policy", "mode"] + cols + ["num_swaps", "swap_time"]]),
        "",
        "### Fairness",
        "",
        md_table(z["tenants"][["policy", "share_t0", "share_t1"] + cols]),
        "",
        "### Batching styles",
        "",
        md_table(z["styles"][["style"] + cols]),
        "",
        "Reading the tables:",
        "",
        f"* Among non-preemptive policies `sjf_oracle` gives the lowest mean TTFT "
        f"({num(rec('sjf_oracle', 'ttft_mean'))} s vs {num(rec('fcfs', 'ttft_mean'))} s FCFS)\n"
        f"  and `predicted_sjf` with sigma 1 recovers part of the gain "
        f"({num(rec('predicted_sjf', 'ttft_mean'))} s); both, like `spf`, starve long prompts "
        f"(`starve_ttft_max` {num(rec('sjf_oracle', 'starve_ttft_max'))} s, "
        f"{num(rec('predicted_sjf', 'starve_ttft_max'))} s and "
        f"{num(rec('spf', 'starve_ttft_max'))} s vs {num(rec('fcfs', 'starve_ttft_max'))} s "
        f"FCFS). Aging (`spf_aging`, `priority_aging`) and the `predicted_sjf` wait cap trade "
        f"part of the mean for a smaller tail.",
        f"* `mlfq` has the lowest TTFT of all ({num(rec('mlfq', 'ttft_mean'))} s) because every "
        f"new arrival preempts a demoted running\n  request, but it pays with "
        f"{int(rec('mlfq', 'num_preemptions')):,} preemptions, "
        f"{1 - rec('mlfq', 'output_throughput') / rec('fcfs', 'output_throughput'):.0%} less "
        f"throughput and {rec('mlfq', 'e2el_mean') / rec('fcfs', 'e2el_mean'):.1f}× the E2E "
        f"latency of FCFS on this memory-starved cache; with swap only "
        f"{int(p.loc[('mlfq', 'swap'), 'num_swaps']):,} of its "
        f"{int(p.loc[('mlfq', 'swap'), 'num_preemptions']):,} preemptions are swaps: the 4 GiB "
        f"swap space (512 blocks) fills and the rest fall back to recompute.",
        f"* Swap instead of recompute lowers FCFS mean TTFT ({num(rec('fcfs', 'ttft_mean'))} → "
        f"{num(p.loc[('fcfs', 'swap'), 'ttft_mean'])} s) at the cost of "
        f"{num(p.loc[('fcfs', 'swap'), 'swap_time'])} s of PCIe transfers.",
        f"* `fair` moves the heavy tenant's service share from "
        f"{ten.loc['fcfs', 'share_t0']:.0%} (FCFS) to {ten.loc['fair', 'share_t0']:.0%}; "
        f"service before the queues build up is still proportional to arrivals, so the share "
        f"over the whole window is not exactly 50%. In the single-tenant policy table `fair` "
        f"is FCFS.",
        f"* Stall-free chunked prefill beats static batching on throughput "
        f"({num(sty.loc['stall_free', 'output_throughput'])} vs "
        f"{num(sty.loc['static', 'output_throughput'])} tokens/s) and TTFT\n  "
        f"({num(sty.loc['stall_free', 'ttft_mean'])} vs {num(sty.loc['static', 'ttft_mean'])} s); "
        f"prefill-first stalls every decode in its prefill iterations (ITL p99 "
        f"{_ms(sty.loc['prefill_first', 'itl_p99'])} vs "
        f"{_ms(sty.loc['stall_free', 'itl_p99'])}).",
    ])
