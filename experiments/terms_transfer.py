"""vLLM's fitted silicon terms carried to SGLang and TensorRT-LLM, judged on their rows.

    python -m experiments.terms_transfer [--quick] [--engines sglang,trtllm] [--out DIR]
                                         [--jobs N]

The five prefill, all-reduce and fused-MoE terms of :mod:`simsched.cost.vllm_silicon` are fitted
on the vLLM rows of ``../shared/data/real-serving/silicon/hopper.csv`` only
(``experiments.fit_silicon_terms``). This experiment applies them, unchanged, to the SGLang and
TensorRT-LLM rows (as ``experiments.engine_silicon`` simulates them, default kernels), so those
rows judge them held out, and reports per engine the median absolute and signed TTFT and TPOT
errors, overall and per (GPU, model, layout), with:

* ``without``: the engine's profile without them (``hardware.engine_overhead`` ``sglang`` /
  ``trtllm``: the ``vllm_v1`` terms, assumed);
* ``vllm terms``: the same with vLLM's fitted terms on top: for SGLang the profile
  ``sglang_silicon`` (:mod:`simsched.cost.engine_profiles`; its preset's default), for
  TensorRT-LLM the same terms passed as ``engine_terms`` (no profile is registered for it, and
  its default stays ``trtllm``: see docs/engines.md).

Nothing is fitted here. Written to ``--out``: ``rows.csv`` (every row and variant),
``summary.csv`` and ``groups.csv``. ``--quick``: one row per (GPU, model, layout), C <= 64.
``--jobs``: (engine, variant) runs in parallel processes (default: the CPUs, at most 4).
"""

from __future__ import annotations

import dataclasses
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd

from experiments import validate_silicon as vs
from experiments._silicon_report import figures_by, report
from experiments._common import parser as make_parser
from simsched.cost import engine_profiles

ENGINES = ("sglang", "trtllm")
VARIANTS = ("without", "vllm terms")
# Engine -> its profile carrying vLLM's terms, where one is registered.
PROFILE = {engine: name for name, engine in engine_profiles.CARRIED.items()}


def variant_engine(engine: str, variant: str) -> vs.Engine:
    """The registered ``engine`` of ``validate_silicon`` under ``variant``."""
    base = vs.ENGINES[engine]
    if variant == "without":
        return dataclasses.replace(base, engine_overhead=engine)
    if variant != "vllm terms":
        raise ValueError(f"variant must be one of {list(VARIANTS)}, got {variant!r}")
    if engine in PROFILE:
        return dataclasses.replace(base, engine_overhead=PROFILE[engine])
    return dataclasses.replace(base, engine_terms=engine_profiles.with_silicon_terms(engine))


def _one(job: tuple) -> pd.DataFrame:
    rows, engine, variant, quick = job
    part = vs.validate(rows[rows.backend == engine], variant_engine(engine, variant), quick)
    return part.assign(variant=variant)


def run(rows: pd.DataFrame, engines=ENGINES, quick: bool = False,
        jobs: int = 1) -> pd.DataFrame:
    """Every row of ``engines`` under each variant (column ``variant``); ``jobs`` > 1 runs the
    (engine, variant) pairs in that many processes (same results)."""
    work = [(rows, e, v, quick) for e in engines for v in VARIANTS]
    if jobs > 1 and len(work) > 1:
        with ProcessPoolExecutor(max_workers=min(jobs, len(work))) as pool:
            parts = list(pool.map(_one, work))
    else:
        parts = [_one(w) for w in work]
    return pd.concat(parts, ignore_index=True)


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per (engine, variant): simulated rows, median |error| and signed median (%)."""
    return figures_by(table, ["backend", "variant"], ["engine", "variant"])


def groups(table: pd.DataFrame) -> pd.DataFrame:
    """Per (engine, GPU, model, layout): the signed median errors (%) of each variant side by
    side (``ttft <variant>``, ``tpot <variant>``)."""
    ok = table[table.expressible]
    keys = ["backend", "gpu", "model", "layout"]
    wide = ok.pivot_table(index=keys, columns="variant", values=["ttft_error", "tpot_error"],
                          aggfunc="median") * 100
    wide.columns = [f"{m.split('_')[0]} {v}" for m, v in wide.columns]
    order = [f"{m} {v}" for m in ("ttft", "tpot") for v in VARIANTS if f"{m} {v}" in wide]
    counts = ok[ok.variant == VARIANTS[0]].groupby(keys).size().rename("rows")
    return wide[order].join(counts).reset_index()


def main(argv=None) -> pd.DataFrame:
    """Print and write the summary and groups; return the per-row table (``attrs``: ``summary``,
    ``groups``)."""
    parser = make_parser("terms_transfer", __doc__, "one row per (GPU, model, layout), C <= 64")
    parser.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1),
                        help="parallel processes (default: the CPUs, at most 4)")
    args, engines, rows = vs.engine_cli(parser, argv, "terms_transfer", ENGINES)
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    if rows is None:
        return pd.DataFrame()
    start = time.perf_counter()
    table = run(rows, engines, args.quick, args.jobs)
    return report(Path(args.out), table, summary(table), groups(table),
                  ("vLLM's fitted silicon terms on the other engines' rows: median absolute "
                   "error % (bias: signed median)",
                   "signed median error % per (engine, GPU, model, layout)"),
                  time.perf_counter() - start)


if __name__ == "__main__":
    main()
