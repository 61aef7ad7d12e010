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


def ensemble(simulate, config, num_draws: int, confidence: float = 0.9, requests=None,
             **options):
    """Run ``config`` with ``simulate`` (:func:`simsched.analysis.runner.simulate`, passed in
    by it) once per coefficient set drawn from its ``hardware.profile``."""
    if isinstance(num_draws, bool) or not isinstance(num_draws, int) or num_draws < 2:
        raise ValueError(f"ensemble must be an integer >= 2 (draws), got {num_draws!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    hw = config.hardware
    if hw.profile is None:
        raise ValueError("ensemble needs hardware.profile (a calibrated profile: simsched "
                         "calibrate) to draw coefficient sets from")
    if config.cluster.replicas:
        raise ValueError("ensemble: per-replica overrides (cluster.replicas) are not supported; "
                         "every replica must run config.hardware")
    prof = deployment.check_for(hw.profile, hw.gpu, hw.engine_overhead)
    rows, first = [], None
    for k, terms in enumerate(prof.draw(num_draws, seed=config.seed)):
        seed = config.seed + k
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
