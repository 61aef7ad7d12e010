"""The generated blocks of docs/speculative.md (see tools.docs.check_docs)."""

from __future__ import annotations

from tools.docs.doc_format import claim, md_table, num


def speculative_runs(runs) -> str:
    """docs/speculative.md: TPOT and throughput by variant at a light, a middle and the top
    rate."""
    table, _ = runs.get("speculative")
    rates = sorted(table["rate"].unique())
    shown = table[table["rate"].isin([rates[0], rates[len(rates) // 2], rates[-1]])]
    shown = shown.assign(tpot_p50=shown["tpot_p50"] * 1e3, tpot_p99=shown["tpot_p99"] * 1e3,
                         itl_p50=shown["itl_p50"] * 1e3,
                         itl_per_token_p50=shown["itl_per_token_p50"] * 1e3)
    shown = shown[["variant", "rate", "tpot_p50", "tpot_p99", "itl_p50", "itl_per_token_p50",
                   "output_throughput", "mean_acceptance_length"]]
    shown.columns = ["variant", "rate (req/s)", "TPOT p50 (ms)", "TPOT p99 (ms)",
                     "ITL p50 per chunk (ms)", "ITL p50 per token (ms)",
                     "output tok/s", "mean acceptance length"]
    return md_table(shown.sort_values(["rate (req/s)", "variant"], kind="stable")) + "\n"


def speculative_crossover(runs) -> str:
    """docs/speculative.md: where speculation stops paying, and the claims the text makes."""
    table, cross = runs.get("speculative")
    eagle3 = cross.set_index("variant").loc["eagle K=3"]
    claim(eagle3["tpot_speedup_low_load"] > 1.8,
          "EAGLE K=3 cuts TPOT at low load by most of its mean acceptance length")
    claim(eagle3["tpot_speedup_low_load"] < eagle3["mean_acceptance_length"],
          "the low-load TPOT gain is below the mean acceptance length (proposer + verify cost)")
    shown = cross.copy()
    shown.columns = ["variant", "TPOT speed-up at the lowest rate", "mean acceptance length",
                     "median TPOT no better from (req/s)", "throughput vs off at the top rate"]
    by = cross.set_index("variant")["throughput_vs_off_at_max_rate"]
    claim(by["ngram K=3"] < 1 and by["eagle K=5"] < 1 and by["draft_model K=3"] < 1,
          "at the top rate n-gram, EAGLE K=5 and the draft model lower throughput")
    claim(by["eagle K=1"] > by["eagle K=5"], "a larger K costs more throughput under overload")
    lower = by[by < 1]
    top = table["rate"].max()
    text = md_table(shown) + "\n"
    text += (f"At {num(top)} req/s {len(lower)} of {len(by)} variants deliver less output "
             f"throughput than no speculation: {', '.join(f'{v} {num(x)}x' for v, x in lower.items())}"
             f"; EAGLE's throughput gain falls from {num(by['eagle K=1'])}x at K = 1 to "
             f"{num(by['eagle K=5'])}x at K = 5.\n")
    return text
