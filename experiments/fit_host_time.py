"""The vLLM rows measured without async scheduling, simulated as they ran: the host-time terms
of :mod:`simsched.cost.host_time` fitted on them, and leaving one (GPU, model) group out.

    python -m experiments.fit_host_time [--quick] [--all-reduce fitted|measured] [--out DIR]

vLLM made async scheduling its default after 0.12; the silicon rows of vLLM 0.11-0.12 (and the
2025 runs without a version: ``experiments._silicon_recipes.vllm_async_default``) ran without
it, so each step also waited for the engine's host work. ``experiments.validate_silicon`` runs
every row with async scheduling (simsched's default); this study runs those rows
with it off (``--async-by-version``) and fits the two host-time terms, each per step
(``sync_step_time``, ``sync_seq_time``), on top of the default profile's terms, as
``experiments.fit_silicon_terms`` fits its own:

1. the rows are simulated with the host time 0 and once per term at its probe value
   (:data:`PROBES`), and each row's TPOT taken as linear in each term between them;
2. the terms minimise the mean absolute log error of TPOT, each (GPU, model) group weighted
   equally, over a grid (:data:`GRID`): they are time per step, fitted on the time per token
   as ``vllm_v1``'s step terms are (its TTFT has parts they do not model, such as the output
   path; it is reported, not fitted);
3. two more passes simulate the rows with the terms fitted on all of them (in sample) and with
   those fitted without each row's (GPU, model) group (leave-one-group-out).

``--all-reduce measured`` runs everything with ``hardware.all_reduce="measured"``. The other
rows (async scheduling on by their version's default) are simulated once, as
``validate_silicon`` has them, for the whole set's medians. Nothing is shipped: the terms
stay 0 in every profile (docs/validation_silicon.md says what they would change).
Written to ``--out``: ``rows.csv``, ``summary.csv``, ``groups.csv``, ``folds.csv``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from simsched.cost import host_time, vllm_silicon
from simsched.cost.profile_names import ALL_REDUCE_CHOICES
from experiments import validate_silicon as vs
from experiments._common import print_table
from experiments._common import parser as make_parser

PROBES = {"sync_step_time": 1e-3, "sync_seq_time": 50e-6}
GRID = {"sync_step_time": np.round(np.arange(0.0, 2.001e-3, 0.05e-3), 8),
        "sync_seq_time": np.round(np.arange(0.0, 100.1e-6, 2.5e-6), 9)}
GROUP = ["gpu", "model"]
METRICS = ("ttft", "tpot")      # reported
FIT_METRICS = ("tpot",)         # fitted on
QUICK_MAX_CONCURRENCY = 16


class Terms:
    """A row's engine terms: the default profile's with host-time terms, the same for every row
    or per (GPU, model) group (picklable: the passes run in worker processes)."""

    def __init__(self, host: dict | None = None, folds: dict | None = None) -> None:
        self.host, self.folds = host or {}, folds

    def __call__(self, row) -> dict:
        host = self.folds[(row.gpu, row.model)] if self.folds is not None else self.host
        return {**vllm_silicon.terms(), **host}


def _pass(rows: pd.DataFrame, engine: vs.Engine, terms) -> pd.DataFrame:
    table = vs.validate(rows, dataclasses.replace(engine, engine_terms=terms))
    table = table[table.expressible].set_index("id")
    return table[np.isfinite(table.sim_ttft_ms) & np.isfinite(table.sim_tpot_ms)]


def fit(base: pd.DataFrame, probes: dict, keep: np.ndarray) -> dict:
    """The grid point of both terms minimising the mean absolute log error of TPOT over the rows
    ``keep``, groups weighted equally, each row's value linear in each term between 0 and its
    probe."""
    rows = base[keep]
    sizes = rows.groupby(GROUP)[GROUP[0]].transform("size").to_numpy()
    w = (1.0 / sizes) / (1.0 / sizes).sum()
    a, b = np.meshgrid(GRID["sync_step_time"], GRID["sync_seq_time"], indexing="ij")
    loss = np.zeros(a.shape)
    for m in FIT_METRICS:
        y0 = rows[f"sim_{m}_ms"].to_numpy()
        da = probes["sync_step_time"].loc[rows.index, f"sim_{m}_ms"].to_numpy() - y0
        db = probes["sync_seq_time"].loc[rows.index, f"sim_{m}_ms"].to_numpy() - y0
        pred = (y0[:, None, None] + da[:, None, None] * (a / PROBES["sync_step_time"])
                + db[:, None, None] * (b / PROBES["sync_seq_time"]))
        err = np.abs(np.log(np.maximum(pred, 0.01 * y0[:, None, None]))
                     - np.log(rows[f"{m}_ms"].to_numpy())[:, None, None])
        loss += np.tensordot(w, err, axes=1)
    i, j = np.unravel_index(int(np.argmin(loss)), loss.shape)
    return {"sync_step_time": float(a[i, j]), "sync_seq_time": float(b[i, j])}


def _medians(table: pd.DataFrame) -> dict:
    return {f"{m}_error": float(100 * table[f"{m}_error"].abs().median()) for m in METRICS}


def main(argv=None) -> pd.DataFrame:
    """Fit, report, write (module docstring); return the summary (``attrs``: ``terms``,
    ``folds``, ``groups``, ``rows``)."""
    parser = make_parser("fit_host_time", __doc__,
                         f"the rows at concurrency <= {QUICK_MAX_CONCURRENCY} only")
    parser.add_argument("--data", default=str(vs.DATA), help="the silicon CSV (hopper.csv)")
    parser.add_argument("--all-reduce", default="fitted", choices=ALL_REDUCE_CHOICES,
                        help="hardware.all_reduce of every row")
    args = parser.parse_args(argv)
    rows = vs.one_pool_vllm_rows(args.data, "fit_host_time")
    if rows is None:
        return pd.DataFrame()
    if args.quick:
        rows = rows[rows.concurrency <= QUICK_MAX_CONCURRENCY]
    sync = np.array([not vs.vllm_async_default(r) for r in rows.itertuples()])
    engine = dataclasses.replace(vs.ENGINES["vllm"], all_reduce=args.all_reduce)
    versioned = dataclasses.replace(engine, async_by_version=True)
    default = _pass(rows, engine, Terms())          # simsched's recipe: async scheduling on
    base = _pass(rows[sync], versioned, Terms())
    probes = {name: _pass(rows[sync], versioned, Terms({name: value}))
              for name, value in PROBES.items()}
    for p in probes.values():
        base = base[base.index.isin(p.index)]
    keys = [(r.gpu, r.model) for r in base.itertuples()]
    everything = fit(base, probes, np.ones(len(base), dtype=bool))
    folds = {key: fit(base, probes, np.array([k != key for k in keys]))
             for key in sorted(set(keys))}
    insample = _pass(rows[rows.id.isin(base.index)], versioned, Terms(everything))
    logo = _pass(rows[rows.id.isin(base.index)], versioned, Terms(folds=folds))
    others = default[~default.index.isin(rows.id[sync])]
    tables = {"async on (simsched's recipe)": default.loc[default.index.isin(base.index)],
              "async off, host time 0": base, "async off, in sample": insample,
              "async off, leave-one-group-out": logo}
    summary = pd.DataFrame([{"run": name, "rows": len(t), **_medians(t),
                             **{f"all_{k}": v for k, v in _medians(pd.concat([others, t]))
                                .items()}} for name, t in tables.items()])
    groups = pd.concat({name: t.groupby(GROUP).agg(
        rows=("ttft_error", "size"),
        ttft_bias=("ttft_error", lambda e: 100 * e.median()),
        tpot_bias=("tpot_error", lambda e: 100 * e.median())) for name, t in tables.items()},
        names=["run"]).reset_index()
    fold_table = pd.DataFrame([{"gpu": k[0], "model": k[1], **v} for k, v in folds.items()])
    print(f"sync rows: {len(base)} of {len(rows)} vLLM rows; all-reduce {args.all_reduce}; "
          "terms fitted on every sync row: " + ", ".join(
              f"{k} {v * host_time.UNITS[k][1]:.3g} {host_time.UNITS[k][0]}"
              for k, v in everything.items()))
    print("\nmedian absolute error % on the sync rows, and (all_) on every vLLM row")
    print_table(summary, digits=3)
    print("\nper (GPU, model) group, signed median error %")
    print_table(groups, digits=3)
    print("\nleave-one-group-out folds")
    print_table(fold_table, digits=4)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    per_row = pd.concat({name: t[["gpu", "model", "layout", "concurrency", "ttft_error",
                                  "tpot_error"]] for name, t in tables.items()}, names=["run"])
    per_row.to_csv(out / "rows.csv")
    summary.to_csv(out / "summary.csv", index=False)
    groups.to_csv(out / "groups.csv", index=False)
    fold_table.to_csv(out / "folds.csv", index=False)
    summary.attrs.update(terms=everything, folds=fold_table, groups=groups, rows=per_row)
    return summary


if __name__ == "__main__":
    main()
