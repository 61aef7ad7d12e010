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
    lower = cross[cross["throughput_vs_off_at_max_rate"] < 1]
    text = md_table(shown) + "\n"
    text += (f"At the top rate {len(lower)} of {len(cross)} variants deliver less output "
             f"throughput than no speculation (lowest: {lower['variant'].iloc[0] if len(lower) else '–'}"
             f", {num(lower['throughput_vs_off_at_max_rate'].min()) if len(lower) else '–'}x).\n")
    return text
