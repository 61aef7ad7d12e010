"""Sim-to-real for SGLang and TensorRT-LLM: their rows of the silicon set (H100, H200).

    python -m experiments.engine_silicon [--quick] [--engines sglang,trtllm] [--out DIR]
                                         [--img DIR] [--kernels default,aiconfigurator]
                                         [--no-overlap]

Runs :func:`experiments.validate_silicon.validate` on the SGLang and TensorRT-LLM rows of
``../shared/data/real-serving/silicon/hopper.csv`` (their recipes: :mod:`experiments.
_silicon_engines`), each with the GPU's default kernels and with the engine's own AIConfigurator
tables (``hardware.kernel_profile="aiconfigurator"``: SGLang 0.5.9's, TensorRT-LLM 1.2.0rc5's),
and reports per engine and kernel choice: coverage, the median absolute and signed TTFT and TPOT
errors, and the errors per (GPU, model, precision, layout).

Nothing is fitted on these rows: the engine profiles' host and output terms are vLLM 0.15's
(:mod:`simsched.cost.engine_profiles`). :func:`term_check` says what fitting one named
per-engine term would buy, judged leaving one (GPU, model) group out at a time: an output-path
delay (added to TTFT), a host gap per step or a cost per layer and step (added to every step,
so to TPOT). It uses that first-order effect on the simulated figures (no re-simulation), and
its results are reported, not shipped.

Written to ``--out``: ``rows.csv`` (every row, both kernel choices), ``summary.csv``,
``groups.csv``, ``terms.csv`` and ``engines_silicon.png`` (measured against simulated, per
engine). ``--quick``: one row per (GPU, model, layout) group, C <= 64 (seconds).
``--kernels``: only these kernel choices (coverage and plot: the first). ``--no-overlap``:
without the engines' overlap schedulers as the replica's arrival rule
(``scheduler.async_scheduling=False``; on by default under their profiles, as in both real
engines: :func:`simsched.config.pipeline.arrival_rule`).
"""

from __future__ import annotations

import dataclasses
import functools
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd

from experiments import validate_silicon as vs
from experiments._common import print_table, try_plots
from experiments._common import parser as make_parser
from simsched.cost.hardware import MODELS

ENGINES = ("sglang", "trtllm")
KERNELS = ("default", "aiconfigurator")
# Candidate per-engine terms: name -> (metric it adds to, what it is per, its regressor).
TERMS = {
    "output_delay": ("ttft", "per request (output path)", lambda t: np.ones(len(t))),
    "step_gap": ("tpot", "per step (host)", lambda t: np.ones(len(t))),
    "kernel_per_layer": ("tpot", "per layer and step",
                         lambda t: np.array([MODELS[m].num_layers for m in t.model], float)),
}


def _without_overlap(configure, cfg, row):
    """``configure``, then the engine's normal loop (no overlap scheduler's arrival rule)."""
    return configure(cfg, row).replace(**{"scheduler.async_scheduling": False})


def run(rows: pd.DataFrame, engines=ENGINES, quick: bool = False,
        kernels=KERNELS, overlap: bool = True) -> pd.DataFrame:
    """Every row of ``engines`` simulated with each kernel choice (column ``kernels``);
    ``overlap=False``: without the engines' overlap schedulers
    (``scheduler.async_scheduling=False``: :func:`simsched.config.pipeline.arrival_rule`)."""
    parts = []
    for engine in engines:
        eng = vs.ENGINES[engine]
        if not overlap:
            eng = dataclasses.replace(eng, configure=functools.partial(_without_overlap,
                                                                       eng.configure))
        for k in kernels:
            part = vs.validate(rows, eng, quick, kernels=k)
            parts.append(part[part.backend == engine].assign(kernels=k))
    return pd.concat(parts, ignore_index=True)


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per (engine, kernels): rows, expressible rows, median |error| and signed median (%)."""
    out = []
    for (engine, k), part in table.groupby(["backend", "kernels"], sort=False):
        ok = part[part.expressible]
        g = vs.groups(part)
        out.append({"engine": engine, "kernels": k, "rows": len(part), "expressible": len(ok),
                    **vs.error_figures(ok),
                    "worst_ttft_group": g.ttft_error.max(), "worst_tpot_group": g.tpot_error.max()})
    return pd.DataFrame(out)


def groups(table: pd.DataFrame) -> pd.DataFrame:
    """Median |error| and signed median (%) per (engine, kernels, GPU, model, precision, layout)."""
    return pd.concat([vs.groups(part).assign(engine=e, kernels=k) for (e, k), part in
                      table.groupby(["backend", "kernels"], sort=False)], ignore_index=True)


def _fit(x: np.ndarray, sim: np.ndarray, meas: np.ndarray) -> float:
    """The value c minimising the summed |(sim + c x) / meas - 1| (a weighted median)."""
    slope = x / meas                      # the relative error moves by c x / meas
    need = (meas - sim) / x               # c that makes each row exact
    order = np.argsort(need)
    w = np.abs(slope)[order]
    return float(need[order][np.searchsorted(np.cumsum(w), w.sum() / 2)])


def term_check(table: pd.DataFrame) -> pd.DataFrame:
    """Per (engine, kernels) and candidate term: its fitted value on all rows and the median
    |error| before, with it in-sample, and leaving each (GPU, model) group out."""
    out = []
    for (engine, k), part in table[table.expressible].groupby(["backend", "kernels"],
                                                               sort=False):
        part = part.reset_index(drop=True)
        key = (part.gpu + " " + part.model).to_numpy()
        for name, (metric, per, regressor) in TERMS.items():
            x = regressor(part)
            sim, meas = part[f"sim_{metric}_ms"].to_numpy(), part[f"{metric}_ms"].to_numpy()
            c = _fit(x, sim, meas)
            loo = np.empty(len(part))
            for g in np.unique(key):
                held = key == g
                cg = _fit(x[~held], sim[~held], meas[~held]) if (~held).any() else 0.0
                loo[held] = ((sim + cg * x) / meas - 1)[held]
            out.append({"engine": engine, "kernels": k, "term": name, "metric": metric,
                        "per": per, "value_ms": c,
                        "before": 100 * np.median(np.abs(sim / meas - 1)),
                        "in_sample": 100 * np.median(np.abs((sim + c * x) / meas - 1)),
                        "loo": 100 * np.median(np.abs(loo))})
    return pd.DataFrame(out)


def plot(table: pd.DataFrame, out: Path, kernels: str = "default") -> Path:
    """Measured against simulated TTFT and TPOT (log-log), one row of panels per engine."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = table[table.expressible & (table.kernels == kernels)]
    engines = [e for e in ENGINES if e in set(ok.backend)]
    fig, axes = plt.subplots(len(engines), 2, figsize=(11, 4.4 * len(engines)), squeeze=False)
    for row, engine in zip(axes, engines):
        mine = ok[ok.backend == engine]
        for ax, m, unit in zip(row, ("ttft", "tpot"), ("TTFT (ms)", "TPOT (ms)")):
            vs.scatter_panel(ax, mine, m, unit, size=10)
            ax.set(title=f"{engine} {m.upper()}: median |error| "
                   f"{100 * mine[f'{m}_error'].abs().median():.0f} % ({len(mine)} rows)")
        row[1].legend(fontsize=6, ncol=2, loc="upper left")
    fig.suptitle(f"SGLang and TensorRT-LLM silicon rows (H100/H200), {kernels} kernels")
    fig.tight_layout()
    path = Path(out) / "engines_silicon.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def main(argv=None) -> pd.DataFrame:
    """Print and write the summary, groups and term check; return the per-row table
    (``attrs``: ``summary``, ``groups``, ``terms``, ``coverage``)."""
    parser = make_parser("engine_silicon", __doc__,
                         f"one row per (GPU, model, layout), C <= {vs.QUICK_MAX_CONCURRENCY}")
    parser.add_argument("--img", default=None, help="also copy the plot here (docs/img)")
    parser.add_argument("--kernels", default=",".join(KERNELS),
                        help=f"kernel choices (comma-separated, of {list(KERNELS)})")
    parser.add_argument("--no-overlap", dest="overlap", action="store_false",
                        help="without the engines' overlap schedulers "
                             "(scheduler.async_scheduling=False; on by default)")
    args, engines, rows = vs.engine_cli(parser, argv, "engine_silicon", ENGINES)
    kernels = tuple(k for k in args.kernels.split(",") if k)
    if not kernels or any(k not in KERNELS for k in kernels):
        parser.error(f"--kernels: {args.kernels!r}; choose from {list(KERNELS)}")
    if rows is None:
        return pd.DataFrame()
    out, start = Path(args.out), time.perf_counter()
    table = run(rows, engines, args.quick, kernels, args.overlap)
    summ, grp, terms = summary(table), groups(table), term_check(table)
    cov = pd.concat([vs.coverage(table[table.kernels == kernels[0]], e).assign(engine=e)
                     for e in engines], ignore_index=True)
    print("coverage per engine")
    print_table(cov)
    print("\nmedian absolute error % (bias: signed median), per engine and kernels")
    print_table(summ, digits=3)
    print("\nper (GPU, model, precision, layout)")
    print_table(grp, digits=3)
    print("\none named per-engine term fitted (first order), median |error| %: before, "
          "in-sample, leaving one (GPU, model) group out")
    print_table(terms, digits=3)
    print(f"({time.perf_counter() - start:.0f} s)")
    table.to_csv(out / "rows.csv", index=False)
    for name, frame in (("summary", summ), ("groups", grp), ("terms", terms),
                        ("coverage", cov)):
        frame.to_csv(out / f"{name}.csv", index=False)
    paths = try_plots(lambda: [plot(table, out, kernels[0])])
    if args.img:
        Path(args.img).mkdir(parents=True, exist_ok=True)
        for p in paths:
            shutil.copy(p, Path(args.img) / p.name)
    table.attrs.update(summary=summ, groups=grp, terms=terms, coverage=cov)
    return table


if __name__ == "__main__":
    main()
