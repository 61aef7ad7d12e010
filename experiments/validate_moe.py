"""Sim-to-real for mixture-of-experts models: the real vLLM 0.15 Llama-4-Scout FP8 runs.

    python -m experiments.validate_moe [--quick] [--out DIR] [--quiet]

The four Llama-4-Scout-17B-16E runs bundled with the dense ones in
``simsched/cost/data/vllm_v1/`` (FP8 dynamic weights, bf16 KV, TP 2 on H100) are rebuilt and
simulated exactly as :mod:`experiments.validate_vllm` does the dense runs (same arrivals, shared
prompts and prefix cache, server settings, ``vllm_v1`` engine profile), with the model's shape
from the catalog and ``weight_dtype="fp8"``. Nothing is fitted on these runs: the MoE layer is
derived from the dense H200 GEMM fits (:mod:`simsched.cost.moe`) and the engine terms are the
shipped ``vllm_v1`` ones, fitted on the 13 dense runs only, so every figure is a held-out
prediction. Printed and written (``runs.csv``, ``summary.csv``): measured vs simulated TTFT,
E2E and ITL means per run, and the median absolute error over the four.

``--quick`` simulates the first 20 s of each stage of one run. ``--data DIR`` validates the MoE
runs of another folder in the same format (``runs.csv``, ``measured.csv``), e.g. held-out
Mixtral runs: a run's ``model`` must start with a catalog MoE model's name (``mixtral-8x7b``,
``mixtral-8x22b``, ...) and its ``precision`` be one of :data:`PRECISIONS`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from simsched.cost import vllm_v1
from simsched.cost.hardware import MODELS
from experiments import validate_vllm as vv
from experiments._common import parser as make_parser

# vLLM's --quantization names in runs.csv's precision column -> simsched weight dtypes.
PRECISIONS = {"fp8-dynamic": "fp8", "fp8": "fp8", "bf16/fp16": "auto"}
HEADLINE = ("e2e_mean", "itl", "ttft_mean")


def base_model(name: str) -> str:
    """The catalog name of a runs.csv model entry (its first word: ``"llama-4-scout-17b-16e
    (MoE, 16 experts, top-1)"`` -> ``"llama-4-scout-17b-16e"``)."""
    return str(name).split()[0].lower()


def load_runs(data_dir=None) -> pd.DataFrame:
    """The MoE runs of the bundled vLLM 0.15 data (or of ``data_dir``, a folder with the same
    ``runs.csv`` and ``measured.csv``): rows whose model is an MoE model of the catalog, with a
    ``model_spec`` column (the catalog shape in the run's weight dtype) and simsched model
    names (``llama-4-scout-17b-16e-fp8``)."""
    runs = vllm_v1.load_runs(include_moe=True, data_dir=data_dir)
    base = runs.model.map(base_model)
    moe = base.map(lambda b: b in MODELS and MODELS[b].num_experts > 0)
    maybe = runs.model.str.contains("moe|mixtral|expert", case=False, regex=True)
    unknown = sorted(set(runs.model[maybe & ~moe]))
    if unknown:
        raise ValueError(f"runs.csv: MoE models not in the catalog: {unknown}; known MoE "
                         f"models: {sorted(m for m, s in MODELS.items() if s.num_experts)}")
    runs, base = runs[moe].reset_index(drop=True), base[moe].reset_index(drop=True)
    bad = sorted(set(runs.precision) - set(PRECISIONS))
    if bad:
        raise ValueError(f"runs.csv: unknown precision(s) {bad}; known: {sorted(PRECISIONS)}")
    dtype = runs.precision.map(PRECISIONS)
    runs["model"] = [b if d == "auto" else f"{b}-{d}" for b, d in zip(base, dtype)]
    runs["model_spec"] = [dataclasses.replace(MODELS[b], weight_dtype=d)
                          for b, d in zip(base, dtype)]
    return runs


def run(quick: bool = False, out=None, quiet: bool = False,
        data_dir=None) -> dict[str, pd.DataFrame]:
    """Validate every MoE run (``quick``: one run, 20 s per stage; ``data_dir``: another folder
    of runs, e.g. held-out Mixtral runs)."""
    runs = load_runs(data_dir)
    if quick:
        runs = runs.head(1)
    table = vv.validate(runs, profiles=("vllm_v1",),
                        seconds=vv.QUICK_SECONDS if quick else None)
    summary = vv.summary(table)
    if not quiet:
        cols = ["experiment"] + [f"{m}_{k}" for m in HEADLINE
                                 for k in ("measured", "simulated", "error")]
        with pd.option_context("display.width", 200, "display.max_columns", 20):
            print(table[cols].round(4).to_string(index=False))
            print(summary.round(1).to_string())
    if out is not None:
        table.to_csv(out / "runs.csv", index=False)
        summary.to_csv(out / "summary.csv")
    return {"runs": table, "summary": summary}


def main(argv=None) -> dict[str, pd.DataFrame]:
    """Run from the command line (``--quick``, ``--out``, ``--quiet``)."""
    parser = make_parser("validate_moe", __doc__, "one run, first 20 s of each stage")
    parser.add_argument("--data", default=None,
                        help="a folder with runs.csv and measured.csv in the bundled format "
                             "(default: the bundled vLLM 0.15 runs)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return run(args.quick, out, args.quiet, args.data)


if __name__ == "__main__":
    main()
