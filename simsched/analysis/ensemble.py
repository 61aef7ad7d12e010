"""A calibrated profile's uncertainty carried into a run: an ensemble of coefficient sets.

``simulate(cfg, ensemble=N)`` (``simsched run --ensemble N``) needs ``hardware.profile``: it
draws N coefficient sets from the profile's posterior (:func:`simsched.cost.deployment.draw`,
seeded by ``cfg.seed``) and runs each with its own seed (``cfg.seed + k``: the workload's
randomness too), and returns every summary metric with a central value (the mean over draws)
and a prediction interval (:func:`simsched.analysis.replicate.prediction_intervals`) that adds
what the calibration left unexplained (the profile's ``discrepancy``: relative scatter per
metric, applied to the metrics of its family: ``ttft_*`` and ``queue_time_*`` take TTFT's,
``e2el_*`` E2E's, ``tpot_*`` and ``itl_*`` TPOT's or ITL's; other metrics carry the draws'
spread only).

Sweeps and plans reuse the pieces: :func:`draws_of` (a config's draws), :func:`interval_columns`
(one point's draws as tidy ``m``, ``m_lo``, ``m_hi`` columns) and :func:`draw_columns`.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from simsched.analysis.stats import prediction_intervals
from simsched.cost import deployment, factory

FAMILIES = {"ttft": ("ttft_mean", "ttft_p90"), "queue_time": ("ttft_mean",),
            "e2el": ("e2el_mean", "e2el_p90"), "tpot": ("tpot_mean", "itl_mean", "e2el_mean"),
            "itl": ("itl_mean", "tpot_mean", "e2el_mean")}


@dataclass(frozen=True)
class Ensemble:
    """What ``simulate(cfg, ensemble=N)`` returns: ``runs`` (one row per draw: ``draw``,
    ``seed``, the drawn terms as ``term_*``, every summary metric), ``intervals`` (one row per
    metric: ``metric``, ``mean``, ``std``, ``low``, ``high``, ``num_draws``, ``confidence``)
    and ``first``, the first draw's Results."""

    runs: pd.DataFrame
    intervals: pd.DataFrame
    confidence: float
    first: object = None

    def interval(self, metric: str) -> tuple[float, float, float]:
        """(central, low, high) of one metric."""
        rows = self.intervals[self.intervals["metric"] == metric]
        if not len(rows):
            raise KeyError(f"no metric {metric!r}; known: {sorted(self.intervals['metric'])}")
        r = rows.iloc[0]
        return float(r["mean"]), float(r["low"]), float(r["high"])


def relative_sd(discrepancy: dict, metrics) -> dict:
    """Each metric's unexplained relative scatter, from its family's (see the module text)."""
    out = {}
    for m in metrics:
        family = next((f for f in FAMILIES if m.startswith(f + "_")), None)
        if family is None:
            continue
        own = discrepancy.get(m)
        known = [discrepancy[k] for k in FAMILIES[family] if k in discrepancy]
        if own is not None:
            out[m] = own
        elif known:
            out[m] = max(known)
    return out


def check_draws(num_draws, confidence: float = 0.9) -> None:
    """Refuse a number of draws below 2 (no interval) or a confidence outside (0, 1)."""
    if isinstance(num_draws, bool) or not isinstance(num_draws, int) or num_draws < 2:
        raise ValueError(f"ensemble must be an integer >= 2 (draws), got {num_draws!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")


def draws_of(config, num_draws: int, where: str = "ensemble"):
    """The ``num_draws`` (seed, terms) pairs of ``config``'s ensemble and its profile: draw k
    runs with seed ``config.seed + k`` and the k-th coefficient set drawn from the profile's
    posterior (seeded by ``config.seed``). ``where`` names the caller in errors."""
    hw = config.hardware
    if hw.profile is None:
        raise ValueError(f"{where} needs hardware.profile (a calibrated profile: simsched "
                         "calibrate) to draw coefficient sets from")
    if config.cluster.replicas:
        raise ValueError(f"{where}: per-replica overrides (cluster.replicas) are not supported; "
                         "every replica must run config.hardware")
    prof = deployment.check_for(hw.profile, hw.gpu, hw.engine_overhead)
    draws = [(config.seed + k, terms)
             for k, terms in enumerate(prof.draw(num_draws, seed=config.seed))]
    return draws, prof


def interval_columns(draws: pd.DataFrame, discrepancy: dict, confidence: float,
                     skip=()) -> dict:
    """One row of tidy interval columns from the rows of one point's draws: for each numeric
    metric ``m``, ``m`` (the mean over the draws), ``m_lo`` and ``m_hi`` (the ends of its
    ``confidence`` prediction interval, widened by the profile's ``discrepancy`` as
    :func:`ensemble`'s); a non-numeric column (a label) takes its most common value; plus
    ``num_draws``. ``skip``: columns left out."""
    skip = set(skip) | {"seed", "draw"} | {c for c in draws.columns if c.startswith("term_")}
    table = prediction_intervals(draws, confidence, relative_sd(discrepancy, draws.columns),
                                 tuple(skip))
    out = {}
    spans = {r.metric: r for r in table.itertuples()}
    for col in draws.columns:
        if col in skip:
            continue
        if col in spans:
            r = spans[col]
            out.update({col: r.mean, f"{col}_lo": r.low, f"{col}_hi": r.high})
        else:
            values = draws[col].dropna()
            out[col] = values.mode().iloc[0] if len(values) else None
    out["num_draws"] = len(draws)
    return out


def ensemble(simulate, config, num_draws: int, confidence: float = 0.9, requests=None,
             **options):
    """Run ``config`` with ``simulate`` (:func:`simsched.analysis.runner.simulate`, passed in
    by it) once per coefficient set drawn from its ``hardware.profile``."""
    check_draws(num_draws, confidence)
    hw = config.hardware
    draws, prof = draws_of(config, num_draws)
    rows, first = [], None
    for k, (seed, terms) in enumerate(draws):
        res = simulate(config.replace(seed=seed), requests=requests,
                       cost_model=factory.adjusted_cost_model(hw, terms), **options)
        rows.append({"draw": k, "seed": seed, **{f"term_{t}": v for t, v in terms.items()},
                     **res.summary()})
        first = res if first is None else first
    runs = pd.DataFrame(rows)
    metrics = [c for c in runs.columns if not c.startswith("term_")]
    skip = ("seed", "draw") + tuple(c for c in runs.columns if c.startswith("term_"))
    table = prediction_intervals(runs, confidence, relative_sd(prof.discrepancy, metrics), skip)
    return Ensemble(runs, table, confidence, first)


def draw_columns(draws, seed: int) -> dict:
    """The ``draw`` index and ``term_*`` values of the run with ``seed`` among ``draws``
    (:func:`draws_of`'s pairs: a draw's seed names it)."""
    k = next(i for i, (s, _) in enumerate(draws) if s == seed)
    return {"draw": k, **{f"term_{t}": v for t, v in draws[k][1].items()}}
