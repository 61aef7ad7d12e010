"""AIConfigurator's own silicon runs under each assumption about how they were served.

    python -m experiments.aic_runs [--quick] [--engines vllm,sglang,trtllm] [--out DIR]

The ``aic-auto-gap-analysis`` rows of ``../shared/data/real-serving/silicon/hopper.csv`` (an
aggregated worker each; about a third of the file) publish neither their client nor their launch
flags, so how ``experiments.validate_silicon`` reproduces them is an assumption. This experiment
simulates those rows of each engine several ways and reports the median absolute and signed TTFT
and TPOT errors, overall and per (GPU, model):

* ``generator``: AIConfigurator's generator (:mod:`experiments._silicon_aic`; the default of
  ``validate_silicon`` and ``engine_silicon``): its limits on batch size and batched tokens,
  aiperf with fixed lengths, SGLang's ``--enable-mixed-chunk`` by version;
* ``generator, mixed chunk on`` / ``off`` (SGLang only): the same with the flag forced, to show
  what the version rule decides;
* ``generator, 100 prompts reused``: the generator with aiperf's default dataset, 100 prompts
  reused in shuffled passes, which a prefix cache serves (:mod:`experiments._silicon_aic`);
* ``inferencex``: InferenceX's client (lengths uniform in [0.8 L, L]) and the engine's defaults,
  what was assumed before.

The engines' shipped profiles and default kernels throughout. Nothing is fitted. Written to
``--out``: ``rows.csv`` (every row and variant) and ``summary.csv``, ``groups.csv``.
``--quick``: the rows at C <= 16.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pandas as pd

from experiments import validate_silicon as vs
from experiments._silicon_report import figures_by, report
from experiments._common import parser as make_parser

ENGINES = ("vllm", "sglang", "trtllm")
QUICK_MAX_CONCURRENCY = 16
# Variant -> (Engine.aic_recipe, Engine.aic_mixed, Engine.aic_reused, engines it applies to).
VARIANTS = {
    "generator": ("generator", None, False, ENGINES),
    "generator, mixed chunk on": ("generator", True, False, ("sglang",)),
    "generator, mixed chunk off": ("generator", False, False, ("sglang",)),
    "generator, 100 prompts reused": ("generator", None, True, ENGINES),
    "inferencex": ("inferencex", None, False, ENGINES),
}


def aic_rows(rows: pd.DataFrame, quick: bool = False) -> pd.DataFrame:
    """The aggregated AIConfigurator runs (C <= 16 with ``quick``)."""
    mine = rows[rows.aic_run & (rows["mode"] == "agg")]
    return mine[mine.concurrency <= QUICK_MAX_CONCURRENCY] if quick else mine


def run(rows: pd.DataFrame, engines=ENGINES, quick: bool = False) -> pd.DataFrame:
    """Every AIConfigurator row of ``engines`` under each variant (column ``variant``)."""
    mine, parts = aic_rows(rows, quick), []
    for engine in engines:
        base = vs.ENGINES[engine]
        for name, (recipe, mixed, reused, applies) in VARIANTS.items():
            if engine not in applies:
                continue
            variant = dataclasses.replace(base, aic_recipe=recipe, aic_mixed=mixed,
                                          aic_reused=reused)
            part = vs.validate(mine[mine.backend == engine], variant)
            parts.append(part.assign(variant=name))
    return pd.concat(parts, ignore_index=True)


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per (engine, variant): simulated rows, median |error| and signed median (%)."""
    return figures_by(table, ["backend", "variant"], ["engine", "variant"])


def groups(table: pd.DataFrame) -> pd.DataFrame:
    """Per (engine, variant, GPU, model): the same figures."""
    return figures_by(table, ["backend", "variant", "gpu", "model"])


def main(argv=None) -> pd.DataFrame:
    """Print and write the summary and groups; return the per-row table (``attrs``: ``summary``,
    ``groups``)."""
    parser = make_parser("aic_runs", __doc__, f"the rows at C <= {QUICK_MAX_CONCURRENCY}")
    args, engines, rows = vs.engine_cli(parser, argv, "aic_runs", ENGINES)
    if rows is None:
        return pd.DataFrame()
    start = time.perf_counter()
    table = run(rows, engines, args.quick)
    return report(Path(args.out), table, summary(table), groups(table),
                  ("AIConfigurator's own runs: median absolute error % (bias: signed median)",
                   "per (engine, variant, GPU, model)"), time.perf_counter() - start)


if __name__ == "__main__":
    main()
