"""The generated blocks of docs/validation_silicon.md (see tools.docs.check_docs): coverage and
errors of ``experiments.validate_silicon`` on the vLLM rows of the silicon set, with the
catalog's default kernels and with each GPU's AIConfigurator tables."""

from __future__ import annotations

import pandas as pd

from tools.docs.doc_format import claim


def _pct(x: float) -> str:
    return "-" if pd.isna(x) else f"{x:.0f}"


def _headline(table: pd.DataFrame) -> dict:
    return table.attrs["summary"]


def silicon_coverage(runs) -> str:
    """How many vLLM rows are expressible, and why not for the rest."""
    table = runs.get("validate_silicon")
    if table.empty:
        return "(the silicon rows are not beside this checkout: nothing to show)\n"
    cov = table.attrs["coverage"]
    mine = table[table.backend == "vllm"]
    lines = [f"{int(mine.expressible.sum())} of {len(mine)} vLLM rows (of {len(table)} rows in "
             f"`hopper.csv`) are simulated; the others:", "",
             "| reason | rows |", "|---|---|"]
    for r in cov.itertuples():
        if r.reason != "expressible":
            lines.append(f"| {r.reason} | {r.rows} |")
    return "\n".join(lines) + "\n"


def silicon_errors(runs) -> str:
    """Median absolute TTFT/TPOT error per (GPU, model, precision, layout), both profiles."""
    default = runs.get("validate_silicon")
    if default.empty:
        return "(the silicon rows are not beside this checkout: nothing to show)\n"
    aic = runs.get("validate_silicon", "--kernels", "aiconfigurator")
    a, b = _headline(default), _headline(aic)
    claim(a["expressible"] == b["expressible"], "both profiles simulate the same rows")
    g = default.attrs["groups"].merge(aic.attrs["groups"], on=["gpu", "model", "precision",
                                                                "layout", "rows"],
                                      suffixes=("", "_aic"))
    lines = ["| | rows | median abs. TTFT error % | median abs. TPOT error % | worst group TTFT "
             "/ TPOT % |", "|---|---|---|---|---|"]
    for name, s in (("default kernels", a), ("AIConfigurator kernels", b)):
        lines.append(f"| {name} | {s['expressible']} | {_pct(s['ttft_error'])} | "
                     f"{_pct(s['tpot_error'])} | {_pct(s['worst_ttft_group'])} / "
                     f"{_pct(s['worst_tpot_group'])} |")
    lines += ["", "Per (GPU, model, precision, layout), median absolute error % (signed median "
              "in brackets: below 0, simulated too fast), default kernels | AIConfigurator "
              "kernels:", "",
              "| GPU | model | precision | layout | rows | TTFT | TPOT | TTFT (aic) | "
              "TPOT (aic) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in g.itertuples():
        lines.append(f"| {r.gpu} | {r.model} | {r.precision} | {r.layout} | {r.rows} | "
                     f"{_pct(r.ttft_error)} ({_pct(r.ttft_bias)}) | "
                     f"{_pct(r.tpot_error)} ({_pct(r.tpot_bias)}) | "
                     f"{_pct(r.ttft_error_aic)} ({_pct(r.ttft_bias_aic)}) | "
                     f"{_pct(r.tpot_error_aic)} ({_pct(r.tpot_bias_aic)}) |")
    return "\n".join(lines) + "\n"
