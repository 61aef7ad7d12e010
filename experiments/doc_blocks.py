"""The generated blocks of README.md and docs/: each function returns one block's Markdown text.

Registered in :data:`experiments.check_docs.BLOCKS`; ``runs.get(name, *argv)`` runs an
experiment once per check. Numbers are formatted by :func:`num`; :func:`claim` fails the check
when a statement next to them stops holding.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd


class Drift(Exception):
    """A documented result or claim that the code no longer produces."""


def claim(holds: bool, text: str) -> None:
    """Fail the check if a claim the docs make next to the numbers no longer holds."""
    if not holds:
        raise Drift(f"claim no longer holds: {text}")


def num(value: float, digits: int = 3) -> str:
    """``value`` to ``digits`` significant digits, with thousands separators, never 1e+03."""
    if value != value:
        return "–"
    if abs(value) >= 10 ** digits:
        return f"{round(value):,}"
    text = f"{value:.{digits}g}"
    return text if "e" not in text else f"{value:.{digits}f}"


def md_table(frame: pd.DataFrame, digits: int = 3) -> str:
    """A Markdown table; floats to ``digits`` significant digits, integers with separators."""
    def cell(v):
        if isinstance(v, (bool, np.bool_)):
            return str(v)
        if isinstance(v, (int, np.integer)):
            return f"{v:,}"
        if isinstance(v, float):
            return num(v, digits)
        return str(v)

    lines = ["| " + " | ".join(map(str, frame.columns)) + " |",
             "|" + "---|" * len(frame.columns)]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    return "\n".join(lines)


def wrap_md(text: str, width: int = 100) -> str:
    """Re-flow the prose of a Markdown block to ``width`` columns (tables, code and blank lines
    kept as they are; a list item's continuation lines indented by two spaces)."""
    import textwrap

    out: list[str] = []
    para: list[str] = []

    def flush():
        if para:
            first = para[0]
            indent = "  " if first.startswith(("- ", "* ")) else ""
            out.append(textwrap.fill(" ".join(p.strip() for p in para), width=width,
                                     subsequent_indent=indent, break_long_words=False,
                                     break_on_hyphens=False))
            para.clear()

    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            flush()
            fenced = not fenced
            out.append(line)
        elif fenced or not line.strip() or line.startswith(("|", "#", "<!--")):
            flush()
            out.append(line)
        elif line.startswith(("- ", "* ")):
            flush()
            para.append(line)
        else:
            para.append(line)
    flush()
    return "\n".join(out)


def _ms(seconds: float) -> str:
    return f"{num(seconds * 1e3)} ms"


# ----------------------------------------------------------------------------- README


def readme_policy_comparison(runs) -> str:
    """README: the main job's three policies."""
    t = runs.get("policy_comparison")
    fcfs, spf, pre = (t.loc[p] for p in ("FCFS", "SPF", "SPF + preemption"))
    claim(spf["ttft_mean"] < fcfs["ttft_mean"], "SPF lowers the mean TTFT")
    claim(pre["ttft_p95"] < min(fcfs["ttft_p95"], spf["ttft_p95"]),
          "SPF + preemption has the lowest p95 TTFT")
    claim(pre["num_preemptions"] > fcfs["num_preemptions"], "preemption preempts more")
    claim(pre["itl_p99"] > fcfs["itl_p99"], "preemption worsens the ITL tail")
    return (f"- **Policy comparison** (lesson workload, 30 req/s, 16 sequences, 96 KV blocks, "
            f"Llama-2-7B on an A100-80GB):\n"
            f"  SPF cuts mean TTFT from {num(fcfs['ttft_mean'])} s (FCFS) to "
            f"{num(spf['ttft_mean'])} s; SPF with admission preemption has the lowest p95 TTFT "
            f"({num(pre['ttft_p95'])} s vs {num(fcfs['ttft_p95'])} s FCFS) but "
            f"{pre['num_preemptions'] / fcfs['num_preemptions']:.1f}× the preemptions "
            f"({int(pre['num_preemptions']):,} vs {int(fcfs['num_preemptions']):,}) and a worse "
            f"ITL tail "
            f"(p99 {_ms(pre['itl_p99'])} vs {_ms(fcfs['itl_p99'])}).")


def _load_sweep_facts(runs) -> dict:
    table = runs.get("load_sweep")
    by = table.attrs["by_rate"].set_index(["variant", "rate"])
    sat = table.set_index("policy")["saturation_rate"]
    cap = table.set_index("policy")["capacity"]
    return {"table": table, "by": by, "sat": sat, "cap": cap}


def readme_experiments(runs) -> str:
    """README: one bullet each for saturation, token budget and starvation."""
    f = _load_sweep_facts(runs)
    sat, cap, by = f["sat"], f["cap"], f["by"]
    lo, hi = sat.min(), sat.max()
    claim(cap.nunique() == 1, "ordering does not move the p99-TTFT capacity")
    beyond = [r for r in by.loc["fcfs"].index if r >= hi]
    claim(all(by.loc[("spf+preempt", r), "ttft_p99"] == by.xs(r, level="rate")["ttft_p99"].max()
              for r in beyond), "SPF with admission preemption is the worst beyond saturation")
    tb = runs.get("token_budget").set_index("max_num_batched_tokens")
    claim(tb.loc[4096, "ttft_p99"] < tb.loc[256, "ttft_p99"]
          and tb.loc[4096, "itl_p99"] > tb.loc[256, "itl_p99"], "the budget trades TTFT for ITL")
    st = runs.get("starvation")
    short, long = st.index[0], st.index[-1]
    claim(st.loc[short, ("p99", "spf")] < st.loc[short, ("p99", "fcfs")]
          and st.loc[long, ("max", "spf")] > st.loc[long, ("max", "fcfs")],
          "SPF helps short prompts and starves long ones")
    band = f"at {num(lo)} req/s" if lo == hi else f"between {num(lo)} and {num(hi)} req/s"
    return (f"- **Saturation** (ShareGPT lengths): every policy saturates {band} on one A100;\n"
            f"  ordering does not move the p99-TTFT capacity ({num(cap.iloc[0])} req/s), SPF "
            f"keeps the median TTFT low past saturation, and SPF with admission preemption is "
            f"the worst beyond it (recompute wastes the scarce KV).\n"
            f"- **Token budget**: 256 → 4096 tokens per iteration cuts TTFT p99 from "
            f"{num(tb.loc[256, 'ttft_p99'])} s to {num(tb.loc[4096, 'ttft_p99'])} s and raises "
            f"ITL p99 from {_ms(tb.loc[256, 'itl_p99'])} to {_ms(tb.loc[4096, 'itl_p99'])} "
            f"(Sarathi-Serve's trade-off).\n"
            f"- **Starvation**: SPF cuts short prompts' TTFT p99 from "
            f"{num(st.loc[short, ('p99', 'fcfs')])} s to {num(st.loc[short, ('p99', 'spf')])} s "
            f"while 2–4k-token prompts wait up to {num(st.loc[long, ('max', 'spf')])} s "
            f"({num(st.loc[long, ('max', 'fcfs')])} s under FCFS).")


def _cost_facts() -> dict:
    from simsched.config import HardwareConfig
    from simsched.cost import hardware
    from simsched.cost.base import Batch
    from simsched.cost.factory import make_cost_model

    model = make_cost_model(HardwareConfig())
    decode = Batch(num_decode_seqs=1, decode_context_sum=1)
    return {"decode": model.iteration_time(decode), "parts": model.breakdown(decode),
            "prefill": model.iteration_time(Batch([2048], [0])),
            "blocks": hardware.kv_capacity_blocks(HardwareConfig(), 16),
            "blocks_40": hardware.kv_capacity_blocks(HardwareConfig(gpu="a100-40gb"), 16)}


def _fit_facts(runs) -> dict:
    tables = runs.get("calibrate_a100", "--quick")
    lin = tables["linear"]
    worst = lin.loc[lin["loo"].idxmax()]
    return {"lin": lin, "comp": tables["components"], "seen": lin["seen"].mean(),
            "loo": lin["loo"].mean(), "worst": worst}


def readme_cost(runs) -> str:
    """README: KV capacity, two iteration times and the fit errors."""
    c, fit = _cost_facts(), _fit_facts(runs)
    return (f"KV capacity follows vLLM (GPU memory × `gpu_memory_utilization` − weights − "
            f"activation reserve):\n{c['blocks']:,} blocks of 16 tokens for Llama-2-7B on an "
            f"A100-80GB. Llama-2-7B on one A100-80GB:\na lone decode takes "
            f"{_ms(c['decode'])}, a 2048-token prefill {_ms(c['prefill'])}.\n\n"
            f"Fit error of the linear ops over 1…4096 tokens and TP 1/2/4/8: "
            f"{fit['seen']:.2f} % MAPE for profiled models;\n{fit['loo']:.1f} % mean "
            f"({fit['worst']['loo']:.1f} % worst) leave-one-model-out for a model known only "
            f"by its shape.")


def _describe_traces() -> dict:
    from simsched.workloads.workload import WorkloadConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {name: WorkloadConfig.preset(name).describe()
                for name in ("azure-code", "azure-conv")}


def readme_traces(runs) -> str:
    """README: the two bundled traces in one line each."""
    d = _describe_traces()
    lines = [f"{name}: {str(desc).splitlines()[0]}" for name, desc in d.items()]
    return "```\n" + "\n".join(lines) + "\n```"


def _zoo(runs) -> dict:
    return runs.get("policy_zoo")


def readme_policy_zoo(runs) -> str:
    """README: three results of the policy zoo."""
    z = _zoo(runs)
    pol = z["policies"].set_index(["policy", "mode"])
    ten = z["tenants"].set_index("policy")
    sty = z["styles"].set_index("style")
    non_preemptive = [p for p, m in pol.index if m == "recompute" and p != "mlfq"]
    best = min(non_preemptive, key=lambda p: pol.loc[(p, "recompute"), "ttft_mean"])
    claim(best == "sjf_oracle", "sjf_oracle has the lowest mean TTFT of the non-preemptive "
                                "policies")
    claim(sty.loc["stall_free", "output_throughput"] > sty.loc["static", "output_throughput"],
          "stall-free beats static batching on throughput")
    return (f"on the Azure conversation trace with a tight cache,\n`sjf_oracle` has the lowest "
            f"mean TTFT of the non-preemptive policies "
            f"({num(pol.loc[('sjf_oracle', 'recompute'), 'ttft_mean'])} s vs "
            f"{num(pol.loc[('fcfs', 'recompute'), 'ttft_mean'])} s FCFS),\n`fair` moves a heavy "
            f"tenant's service share from {ten.loc['fcfs', 'share_t0']:.0%} to "
            f"{ten.loc['fair', 'share_t0']:.0%}, and stall-free beats static\nbatching on "
            f"throughput ({num(sty.loc['stall_free', 'output_throughput'])} vs "
            f"{num(sty.loc['static', 'output_throughput'])} tokens/s).")


# ----------------------------------------------------------------------------- docs/experiments.md


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
    knee = max(r for r in rates if r < sat.min())       # the last rate every policy carries
    below = max(r for r in rates if r < knee)
    kv = by.loc["fcfs", "kv_usage_mean"]
    p99_below = by.xs(below, level="rate")["ttft_p99"].max()
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
        f"{kv.loc[below]:.0%} at {num(below)} req/s to {kv.loc[knee]:.0%} at {num(knee)} and "
        f"{kv.loc[hi]:.0%} at {num(hi)} req/s, and all four policies saturate at "
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


# ----------------------------------------------------------------------------- docs/workloads.md


def workloads_traces(runs) -> str:
    """docs/workloads.md: both traces described, and how many prompts exceed a 4k context."""
    from simsched.workloads.workload import WorkloadConfig, generate

    d = _describe_traces()
    over = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in d:
            table = generate(WorkloadConfig.preset(name), np.random.default_rng(0))
            over[name] = int((table["num_prompt_tokens"] > 4096).sum())
    text = "\n\n".join(f"{name}\n{desc}" for name, desc in d.items())
    return (f"```\n{text}\n```\n\nBoth traces hold prompts longer than Llama-2's 4,096-token "
            f"context (code: {over['azure-code']:,},\nconversation: {over['azure-conv']:,}).")


# ----------------------------------------------------------------------------- docs/cost_model.md


def cost_iteration(runs) -> str:
    """docs/cost_model.md: two iteration times, the CPU overhead fit and KV capacity."""
    from simsched.cost import calibration as cal

    c = _cost_facts()
    parts = {k: v for k, v in c["parts"].items()}
    cpu = cal.fit_all()["cpu"]
    return (f"Llama-2-7B on one A100-80GB: a lone decode takes {_ms(c['decode'])} (linear "
            f"{num(parts['linear'] * 1e3, 2)}, attention {num(parts['attention'] * 1e3, 1)},\n"
            f"CPU {num(parts['overhead'] * 1e3, 1)} ms); a 2048-token prefill "
            f"{_ms(c['prefill'])}. The fitted CPU overhead per iteration is\n"
            f"`{num(cpu['a'] * 1e3, 2)} ms + {num(cpu['a_tp'] * 1e3, 2)} ms·[TP>1] + "
            f"{num(cpu['b'] * 1e3, 2)} ms × sequences`. KV capacity: Llama-2-7B on an "
            f"A100-80GB at 0.9 gives\n{c['blocks']:,} blocks of 16 tokens ({c['blocks_40']:,} on "
            f"an A100-40GB).")


def cost_fit(runs) -> str:
    """docs/cost_model.md: linear-op fit errors per model and TP, and the other components."""
    fit = _fit_facts(runs)
    lin, comp = fit["lin"], fit["comp"]
    tps = sorted(lin["tp"].unique())
    rows = []
    for model, group in lin.groupby("model", sort=False):
        by_tp = group.set_index("tp")
        rows.append([model] + [f"{by_tp.loc[tp, 'seen']:.2f} / {by_tp.loc[tp, 'loo']:.2f}"
                               if tp in by_tp.index else "–" for tp in tps])
    table = pd.DataFrame(rows, columns=["model"] + [f"TP{tp} seen / LOO" for tp in tps])
    worst = fit["worst"]
    parts = comp.groupby("component", sort=False)["mape"].agg(["min", "max"])
    cpu = comp[comp["component"] == "cpu overhead"].sort_values("mape")
    others = "; ".join(
        f"{name} {lo:.1f} %" if abs(hi - lo) < 0.05 else f"{name} {lo:.1f}–{hi:.1f} %"
        for name, (lo, hi) in parts.drop(index="cpu overhead", errors="ignore").iterrows())
    return "\n".join([
        md_table(table),
        "",
        f"Overall: seen {fit['seen']:.2f} %, leave-one-model-out {fit['loo']:.2f} % (worst "
        f"{worst['loo']:.1f} %, {worst['model']} at TP{worst['tp']}). Other parts on\ntheir own "
        f"measurements: {others}; CPU overhead {cpu['mape'].iloc[0]:.1f}–"
        f"{cpu['mape'].iloc[-2]:.1f} % ({cpu['mape'].iloc[-1]:.0f} % for "
        f"{cpu['subset'].iloc[-1]}).",
    ])
