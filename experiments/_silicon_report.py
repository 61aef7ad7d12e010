"""The report side of ``experiments.validate_silicon``: its figures, tables and plot.

Given the per-row table :func:`experiments.validate_silicon.validate` returns (measured and
simulated TTFT / TPOT, their signed errors ``simulated / measured - 1``, expressibility and
reason), this module derives what the experiment prints and writes: :func:`groups` (median
absolute error per GPU, model, precision and layout), :func:`coverage` (rows by reason),
:func:`summary` (the headline figures), :func:`plot` and its panel :func:`scatter_panel`; and
:func:`implied_prefill_peak`, a plausibility check of a measured row. Nothing here simulates;
``validate_silicon`` re-exports every name, where callers have always found them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from experiments._common import print_table
from simsched.cost import shapes
from simsched.cost.hardware import GPUS as GPU_SPECS
from simsched.cost.hardware import MODELS

__all__ = ["coverage", "error_figures", "figures_by", "groups", "implied_prefill_peak", "plot",
           "report", "scatter_panel", "summary"]


def implied_prefill_peak(row) -> float:
    """A plausibility check of a measurement: the share of the GPU's dense tensor peak (FP8 for
    FP8 weights, else bf16) that the prefill alone must run at for the measured TTFT and TPOT.
    With C requests in flight, each lasting TTFT + (output - 1) x TPOT, the server prefills
    ``C x input / that`` tokens per second, each costing 2 FLOPs per active parameter. Above 1,
    the measured latencies cannot hold for the prompts as described (a prefix-cache hit, or
    another client, would explain it). NaN for rows without a preset."""
    if not isinstance(row.model, str) or pd.isna(row.tpot_ms) or pd.isna(row.tp_size):
        return np.nan
    spec, gpu = MODELS[row.model], GPU_SPECS[row.gpu]
    c = shapes.param_counts(spec)
    active = c["dense"] + c["experts"] * spec.experts_per_token / max(spec.num_experts, 1)
    # InferenceX's lengths are uniform in [0.8 L, L]: 0.9 L on average.
    e2e = (row.ttft_ms + (0.9 * row.osl - 1) * row.tpot_ms) / 1e3
    flops = 2.0 * active * 0.9 * row.isl * row.concurrency / e2e / int(row.tp_size)
    peak = gpu.fp8_flops if spec.weight_dtype == "fp8" and gpu.fp8_flops else gpu.peak_flops
    return float(flops / peak)


def groups(table: pd.DataFrame) -> pd.DataFrame:
    """Median absolute error (%) and row count per (GPU, model, precision, layout)."""
    ok = table[table.expressible]
    g = ok.groupby(["gpu", "model", "precision", "layout"]).agg(
        rows=("id", "size"),
        ttft_error=("ttft_error", lambda e: 100 * e.abs().median()),
        ttft_bias=("ttft_error", lambda e: 100 * e.median()),
        tpot_error=("tpot_error", lambda e: 100 * e.abs().median()),
        tpot_bias=("tpot_error", lambda e: 100 * e.median()))
    return g.reset_index()


def error_figures(ok: pd.DataFrame) -> dict:
    """Median absolute (``*_error``) and signed (``*_bias``) TTFT and TPOT errors, %, of the
    simulated rows ``ok``."""
    return {"ttft_error": 100 * ok.ttft_error.abs().median(),
            "ttft_bias": 100 * ok.ttft_error.median(),
            "tpot_error": 100 * ok.tpot_error.abs().median(),
            "tpot_bias": 100 * ok.tpot_error.median()}


def figures_by(table: pd.DataFrame, keys: list[str], names: list[str] | None = None
               ) -> pd.DataFrame:
    """Per ``keys`` of the simulated rows of ``table`` (columns renamed to ``names``): how many,
    and their :func:`error_figures`."""
    ok = table[table.expressible]
    return pd.DataFrame([{**dict(zip(names or keys, k if isinstance(k, tuple) else (k,))),
                          "rows": len(part), **error_figures(part)}
                         for k, part in ok.groupby(keys, sort=False)])


def report(out: Path, table: pd.DataFrame, summary: pd.DataFrame, groups: pd.DataFrame,
           titles: tuple[str, str], seconds: float) -> pd.DataFrame:
    """Print ``summary`` and ``groups`` under ``titles`` and the run's ``seconds``, write them and
    ``table`` (``rows.csv``, ``summary.csv``, ``groups.csv``) to ``out``, and return ``table``
    with them in its ``attrs``: the tail of the per-variant silicon experiments."""
    print(titles[0])
    print_table(summary, digits=3)
    print(f"\n{titles[1]}")
    print_table(groups, digits=3)
    print(f"({seconds:.0f} s)")
    table.to_csv(out / "rows.csv", index=False)
    summary.to_csv(out / "summary.csv", index=False)
    groups.to_csv(out / "groups.csv", index=False)
    table.attrs.update(summary=summary, groups=groups)
    return table


def coverage(table: pd.DataFrame, engine: str = "vllm") -> pd.DataFrame:
    """Rows of ``engine`` by reason (empty reason: expressible and simulated)."""
    mine = table[table.backend == engine]
    reasons = mine.reason.replace("", "expressible")
    return reasons.value_counts().rename_axis("reason").reset_index(name="rows")


def summary(table: pd.DataFrame) -> dict:
    """Headline figures: rows, expressible rows, median |error| % of TTFT and TPOT, worst group."""
    ok = table[table.expressible]
    g = groups(table)
    return {"rows": int(len(table)), "expressible": int(len(ok)),
            "ttft_error": float(100 * ok.ttft_error.abs().median()) if len(ok) else np.nan,
            "tpot_error": float(100 * ok.tpot_error.abs().median()) if len(ok) else np.nan,
            "worst_ttft_group": float(g.ttft_error.max()) if len(g) else np.nan,
            "worst_tpot_group": float(g.tpot_error.max()) if len(g) else np.nan}


def scatter_panel(ax, ok: pd.DataFrame, m: str, unit: str, size: float = 12) -> None:
    """One log-log panel: measured against simulated ``m`` (ttft / tpot) of the rows ``ok``,
    one colour per (model, GPU), the diagonal and +-25 % lines."""
    for (model, gpu), part in ok.groupby(["model", "gpu"]):
        ax.scatter(part[f"{m}_ms"], part[f"sim_{m}_ms"], s=size, alpha=0.7,
                   marker="o" if gpu == "h200" else "^", label=f"{model} {gpu}")
    lo = max(1e-1, float(np.nanmin(ok[[f"{m}_ms", f"sim_{m}_ms"]].to_numpy())) * 0.8)
    hi = float(np.nanmax(ok[[f"{m}_ms", f"sim_{m}_ms"]].to_numpy())) * 1.2
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    for f in (0.8, 1.25):
        ax.plot([lo, hi], [lo * f, hi * f], "k:", lw=0.6)
    ax.set(xscale="log", yscale="log", xlabel=f"measured {unit}", ylabel=f"simulated {unit}")


def plot(table: pd.DataFrame, out: Path) -> Path:
    """Measured vs simulated TTFT and TPOT (log-log), one colour per model; the figure file."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = table[table.expressible]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
    for ax, m, unit in zip(axes, ("ttft", "tpot"), ("TTFT (ms)", "TPOT (ms)")):
        scatter_panel(ax, ok, m, unit)
        ax.set(title=f"{m.upper()}: median |error| {100 * ok[f'{m}_error'].abs().median():.0f} %")
    axes[1].legend(fontsize=6, ncol=2, loc="upper left")
    fig.suptitle(f"{', '.join(sorted(ok.backend.unique()))} silicon rows (H100/H200): "
                 f"{len(ok)} simulated")
    fig.tight_layout()
    path = Path(out) / "silicon.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
