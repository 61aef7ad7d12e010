"""Fit the prefill, all-reduce and fused-MoE terms of :mod:`simsched.cost.vllm_silicon` on the
Hopper vLLM rows of the silicon set, and report them leaving one (GPU, model) group out.

    python -m experiments.fit_silicon_terms [--quick] [--update] [--out DIR]
    python -m experiments.fit_silicon_terms --check-vllm015

The rows are ``experiments.validate_silicon``'s (read its docstring and the data README; the
Blackwell rows are never read). The terms (:data:`simsched.cost.vllm_silicon.TERMS`: per step,
layer and kernel class, never per model) are fitted as follows:

1. every expressible row is simulated with neutral terms (the ``vllm_v1`` profile) and
   once per fitted term with that term alone at its probe value (:data:`PROBES`; ``--baseline``
   and ``--passes`` read passes already run by ``validate_silicon`` instead);
2. each row's simulated TTFT and TPOT are taken as linear in each term between its neutral and
   probe values (a surrogate: exact for a lone prefill step, while queueing bends the real
   response curve, which the final passes below measure);
3. the terms minimise the mean absolute log error of TTFT and TPOT over the rows, each
   (GPU, model) group weighted equally, by coordinate descent over a grid per term
   (:data:`GRID`);
4. two more passes simulate every row with the terms fitted on all rows (in-sample) and with
   the terms fitted without the row's own (GPU, model) group (leave-one-group-out, the
   headline: how a model or GPU no row was fitted on would fare).

Printed and written to ``--out``: ``rows.csv`` (every row's measured and simulated TTFT and
TPOT under the ``vllm_v1`` profile (neutral terms; ``shipped`` in the tables and the record),
in-sample and leave-one-group-out), ``groups.csv`` (median
absolute errors per (GPU, model) group under each), ``folds.csv`` (each fold's terms) and
``summary.csv``. ``--update`` writes the in-sample terms and these figures to
``simsched/cost/data/vllm_silicon_terms.json``, which :func:`simsched.cost.vllm_silicon.terms`
reads (the default profile, ``vllm_silicon``). ``--check-vllm015``: the real vLLM 0.15 runs
with and without the fitted terms. ``--quick``: the rows at concurrency <= 16 only (the fit and its figures are then of
those rows; never used for ``--update``).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from simsched.cost import vllm_silicon, vllm_v1
from experiments import validate_silicon as vs
from experiments._common import print_table
from experiments._common import parser as make_parser

PROBES = {"prefill_gemm_scale": 2.0, "prefill_expert_scale": 3.0, "large_allreduce_scale": 0.5,
          "decode_expert_scale": 2.0}
# Terms not fitted here, held at their neutral value: prefill_layer_time (the device script
# measures a few ms per 80-layer step at most, under the rows' noise).
FITTED = tuple(PROBES)
GRID = {"prefill_gemm_scale": np.round(np.arange(1.0, 3.001, 0.025), 4),
        "prefill_expert_scale": np.round(np.arange(1.0, 8.001, 0.05), 4),
        "prefill_layer_time": np.round(np.arange(0.0, 500.1e-6, 10e-6), 9),
        # At most 1: vLLM's paths for large all-reduces (symmetric memory, else NCCL itself)
        # are never slower than NCCL; a fit above 1 would stand for other missing prefill time.
        "large_allreduce_scale": np.round(np.arange(0.2, 1.001, 0.025), 4),
        "decode_expert_scale": np.round(np.arange(0.5, 4.001, 0.05), 4)}
QUICK_MAX_CONCURRENCY = 16
GROUP = ["gpu", "model"]
METRICS = ("ttft", "tpot")


def _engine(terms) -> vs.Engine:
    return dataclasses.replace(vs.ENGINES["vllm"], engine_terms=terms)


def _pass(rows: pd.DataFrame, terms) -> pd.DataFrame:
    """validate_silicon's table of ``rows`` simulated with ``terms`` (a dict or a function of
    the row), indexed by row id."""
    table = vs.validate(rows, _engine(terms))
    return table[table.expressible].set_index("id")


def _with(**changes) -> dict:
    return {**vllm_silicon.neutral(), **changes}


def sensitivities(base: pd.DataFrame, probes: dict[str, pd.DataFrame]) -> dict:
    """Per metric: (rows' simulated value under neutral terms, rows x terms change of the
    value from neutral to each term's probe), ms."""
    out = {}
    for m in METRICS:
        y0 = base[f"sim_{m}_ms"].to_numpy()
        d = np.column_stack([probes[name].loc[base.index, f"sim_{m}_ms"].to_numpy() - y0
                             for name in FITTED])
        out[m] = (y0, d)
    return out


def _units(name: str, values) -> np.ndarray:
    """How far ``values`` of a term are from neutral, in units of its probe's distance."""
    return (np.asarray(values, dtype=float) - vllm_silicon.NEUTRAL[name]) \
        / (PROBES[name] - vllm_silicon.NEUTRAL[name])


def fit(base: pd.DataFrame, sens: dict, keep: np.ndarray) -> dict:
    """The terms minimising the mean absolute log error of TTFT and TPOT over the rows ``keep``
    (boolean), each (GPU, model) group weighted equally, under the surrogate (each term's
    effect on a row's value linear between neutral and its probe): coordinate descent over
    each term's grid (:data:`GRID`) until no term moves."""
    rows = base[keep]
    sizes = rows.groupby(GROUP)[GROUP[0]].transform("size").to_numpy()
    w = (1.0 / sizes) / (1.0 / sizes).sum()
    meas = {m: np.log(rows[f"{m}_ms"].to_numpy()) for m in METRICS}
    theta = dict(vllm_silicon.NEUTRAL)
    for _ in range(50):
        moved = False
        for j, name in enumerate(FITTED):
            loss = np.zeros(len(GRID[name]))
            for m in METRICS:
                y0, d = sens[m]
                u = np.array([_units(t, theta[t]) for t in FITTED])
                u[j] = 0.0
                rest = y0[keep] + d[keep] @ u
                pred = rest[:, None] + d[keep][:, j][:, None] * _units(name, GRID[name])[None, :]
                # (a value the surrogate drives below 1 % of the neutral one counts as that)
                pred = np.log(np.maximum(pred, 0.01 * y0[keep][:, None]))
                loss += (np.abs(pred - meas[m][:, None]) * w[:, None]).sum(axis=0)
            best = float(GRID[name][int(np.argmin(loss))])
            moved |= best != theta[name]
            theta[name] = best
        if not moved:
            break
    return theta


def _group_key(row) -> tuple:
    return (row.gpu, row.model)


class FoldTerms:
    """A row's engine terms in the leave-one-group-out pass: those fitted without its
    (GPU, model) group (picklable: the passes run in worker processes)."""

    def __init__(self, folds: dict) -> None:
        self.folds = folds

    def __call__(self, row) -> dict:
        return _with(**self.folds[_group_key(row)])


def errors(table: pd.DataFrame) -> dict:
    """Median absolute error % of TTFT and TPOT, and the worst (GPU, model) group's."""
    g = table.groupby(GROUP).agg(ttft=("ttft_error", lambda e: 100 * e.abs().median()),
                                 tpot=("tpot_error", lambda e: 100 * e.abs().median()))
    return {"rows": int(len(table)),
            "ttft_error": float(100 * table.ttft_error.abs().median()),
            "tpot_error": float(100 * table.tpot_error.abs().median()),
            "worst_ttft_group": float(g.ttft.max()), "worst_tpot_group": float(g.tpot.max())}


def group_errors(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Median absolute (and signed) error % per (GPU, model) group under each run."""
    parts = []
    for name, t in tables.items():
        g = t.groupby(GROUP).agg(
            rows=("ttft_error", "size"),
            ttft=("ttft_error", lambda e: 100 * e.abs().median()),
            ttft_bias=("ttft_error", lambda e: 100 * e.median()),
            tpot=("tpot_error", lambda e: 100 * e.abs().median()),
            tpot_bias=("tpot_error", lambda e: 100 * e.median()))
        parts.append(g.add_prefix(f"{name}_").rename(columns={f"{name}_rows": "rows"})
                     if not parts else g.drop(columns="rows").add_prefix(f"{name}_"))
    return pd.concat(parts, axis=1).reset_index()


def vllm015_check() -> pd.DataFrame:
    """The real vLLM 0.15 runs (``experiments.validate_vllm``'s 13 dense runs and
    ``experiments.validate_moe``'s four Llama-4-Scout FP8 runs, shipped ``vllm_v1`` terms)
    simulated again with the fitted silicon terms added: median absolute error % of mean TTFT,
    mean E2E and the engine's time per token, and each run's E2E error (``moe``: whether the
    run is one of the MoE ones)."""
    from experiments import validate_moe as vm
    from experiments import validate_vllm as vv

    rows = []
    # Apart, not concatenated: only the MoE runs carry a model_spec.
    runs = [*vllm_v1.load_runs().assign(moe=False).itertuples(),
            *vm.load_runs().assign(moe=True).itertuples()]
    for run in runs:
        meas = vv.measured(run)
        for name, terms in (("vllm_v1", None), ("silicon", vllm_silicon.terms())):
            sim = vv.metrics(vv.simulate_run(run, "vllm_v1", None, 0, terms), run.output_tokens)
            rows.append({"run": run.experiment, "moe": run.moe, "terms": name,
                         **{f"{m}_error": 100 * (sim[m] / meas[m] - 1)
                            for m in ("ttft_mean", "e2e_mean", "itl")}})
    return pd.DataFrame(rows)


def main(argv=None) -> pd.DataFrame:
    """Fit, report, write (module docstring); return the summary table (``attrs``: ``terms``,
    ``folds``, ``groups``, ``rows``)."""
    parser = make_parser("fit_silicon_terms", __doc__,
                         f"the rows at concurrency <= {QUICK_MAX_CONCURRENCY} only")
    parser.add_argument("--data", default=str(vs.DATA), help="the silicon CSV (hopper.csv)")
    parser.add_argument("--baseline", default=None,
                        help="rows.csv of a validate_silicon run with --terms neutral (the "
                             "neutral pass, not simulated again)")
    parser.add_argument("--passes", default=None,
                        help="folder with a probe pass per term already run "
                             "(TERM/rows.csv from `validate_silicon --terms TERM=PROBE`)")
    parser.add_argument("--update", action="store_true",
                        help="write the fitted terms to the package data")
    parser.add_argument("--check-vllm015", action="store_true",
                        help="only simulate the real vLLM 0.15 runs with and without the "
                             "fitted terms and print the errors")
    args = parser.parse_args(argv)
    if args.check_vllm015:
        t = vllm015_check()
        cols = ["ttft_mean_error", "e2e_mean_error", "itl_error"]
        print("vLLM 0.15 runs, median absolute error % (vllm_v1 / with the silicon terms, "
              "the default vllm_silicon), dense and MoE runs apart")
        print_table(t.groupby(["moe", "terms"])[cols].agg(lambda e: e.abs().median())
                    .reset_index(), digits=3)
        print_table(t.pivot(index=["run", "moe"], columns="terms", values="e2e_mean_error")
                    .reset_index(), digits=3)
        return t
    if args.update and args.quick:
        parser.error("--update fits on every row: drop --quick")
    # One serving pool only: the terms and the prefill split are of aggregated steps.
    rows = vs.one_pool_vllm_rows(args.data, "fit_silicon_terms")
    if rows is None:
        return pd.DataFrame()
    if args.quick:
        rows = rows[rows.concurrency <= QUICK_MAX_CONCURRENCY]
    if args.baseline:
        base = pd.read_csv(args.baseline)
        base = base[base.expressible & base.id.isin(rows.id)].set_index("id")
    else:
        base = _pass(rows, _with())
    probes = {}
    for name, value in PROBES.items():
        done = Path(args.passes or "/nonexistent") / name / "rows.csv"
        if done.exists():
            t = pd.read_csv(done)
            probes[name] = t[t.expressible].set_index("id")
        else:
            probes[name] = _pass(rows, _with(**{name: value}))
    ok = np.isfinite(base.sim_ttft_ms) & np.isfinite(base.sim_tpot_ms)
    for p in probes.values():
        ok &= np.isfinite(p.reindex(base.index).sim_ttft_ms) \
            & np.isfinite(p.reindex(base.index).sim_tpot_ms)
    base = base[ok]
    sens = sensitivities(base, probes)
    key_of = [_group_key(r) for r in base.itertuples()]
    everything = fit(base, sens, np.ones(len(base), dtype=bool))
    folds = {}
    for key in sorted(set(key_of)):
        folds[key] = fit(base, sens, np.array([k != key for k in key_of]))
    # The in-sample pass runs in a second process while this one runs the folds' pass.
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "experiments.validate_silicon", "--quiet", "--data", args.data,
            "--out", str(out / "insample"), "--terms",
            ",".join(f"{k}={v!r}" for k, v in everything.items())]
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    logo = _pass(rows.loc[rows.id.isin(base.index)], FoldTerms(folds))
    if child.wait() != 0:
        raise RuntimeError(f"the in-sample pass failed: {' '.join(argv)}")
    insample = pd.read_csv(out / "insample" / "rows.csv")
    insample = insample[insample.expressible & insample.id.isin(base.index)].set_index("id")
    tables = {"shipped": base, "insample": insample, "logo": logo}
    summary = pd.DataFrame([{"terms": name, **errors(t)} for name, t in tables.items()])
    groups = group_errors(tables)
    fold_table = pd.DataFrame([{"gpu": k[0], "model": k[1], **v} for k, v in folds.items()])
    per_row = base[["gpu", "model", "layout", "isl", "osl", "concurrency", "ttft_ms",
                    "tpot_ms", "sim_ttft_ms", "sim_tpot_ms"]].copy()
    for name in ("insample", "logo"):
        for m in METRICS:
            per_row[f"sim_{m}_ms_{name}"] = tables[name].loc[per_row.index, f"sim_{m}_ms"]
    print("terms fitted on every row: " + ", ".join(
        f"{k} {v * vllm_silicon.UNITS[k][1]:.3g} {vllm_silicon.UNITS[k][0]}"
        for k, v in everything.items()))
    print("\nmedian absolute error %: vllm_v1 (shipped: neutral terms), in-sample, "
          "leave-one-group-out")
    print_table(summary, digits=3)
    print("\nper (GPU, model) group")
    print_table(groups, digits=3)
    print("\nleave-one-group-out folds (terms fitted without the group)")
    print_table(fold_table, digits=4)
    per_row.to_csv(out / "rows.csv")
    groups.to_csv(out / "groups.csv", index=False)
    fold_table.to_csv(out / "folds.csv", index=False)
    summary.to_csv(out / "summary.csv", index=False)
    if args.update:
        record = {"terms": everything,
                  "fitted_on": f"{len(base)} vLLM rows of {Path(args.data).name} (H100-SXM, "
                               f"H200), {len(folds)} (GPU, model) groups",
                  "fitted_at": datetime.date.today().isoformat(),
                  "refit_command": "python -m experiments.fit_silicon_terms --update",
                  "errors": {r.terms: {k: getattr(r, k) for k in summary.columns
                                       if k != "terms"} for r in summary.itertuples()},
                  "folds": fold_table.to_dict(orient="records"),
                  "groups": groups.to_dict(orient="records")}
        vllm_silicon.DATA.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        vllm_silicon.shipped.cache_clear()
        print(f"wrote {vllm_silicon.DATA}")
    summary.attrs.update(terms=everything, folds=fold_table, groups=groups, rows=per_row)
    return summary


if __name__ == "__main__":
    main()
