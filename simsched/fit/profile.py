"""``simsched.calibrate(...)``: measured runs in, a calibrated profile (JSON) and its report out.

The profile document (:data:`simsched.cost.deployment.FORMAT`, version
:data:`~simsched.cost.deployment.VERSION`) holds the inputs (each run's source and the SHA-256 of
its file and of the metrics and settings read from it), the fitted ``terms``, their posterior
(``center``, ``covariance`` in the fit's coordinates, and ``intervals``: 90 % per term), the
per-metric ``discrepancy``, the ``residuals`` (measured, shipped and calibrated metric of every
run), the prior, the GPUs and models it was fitted on, and how many simulations the fit ran.
``hardware.profile = "path"`` (and ``--profile PATH``) loads it.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from simsched.analysis.measurements import Measured
from simsched.cost import deployment
from simsched.cost.deployment import TERMS, UNITS
from simsched.fit import calibrate as core
from simsched.fit import replay


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("simsched")
    except metadata.PackageNotFoundError:     # run from a source tree
        return "unknown"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def input_record(scenario) -> dict:
    """A replayed run's source and hashes: of its file (where the source names one; a run
    table's ``runs.csv:experiment`` names ``runs.csv``) and of the metrics and settings read."""
    meas = scenario.source
    src = meas.source if isinstance(meas, Measured) else scenario.name
    record = {"source": src}
    path = Path(src)
    if not path.is_file() and ":" in src:
        path = Path(src.rsplit(":", 1)[0])
    if path.is_file():
        record["file_sha256"] = _sha256(path.read_bytes())
    payload = json.dumps({"metrics": scenario.measured,
                          "settings": meas.settings if isinstance(meas, Measured) else {}},
                         sort_keys=True, default=str)
    record["read_sha256"] = _sha256(payload.encode())
    return record


@dataclass
class Calibration:
    """What :func:`calibrate` returns: the profile ``document`` (written to ``path`` if given),
    the per-run ``report`` (:func:`report_frame`), the ``terms`` table and the wall time."""

    document: dict
    report: pd.DataFrame
    terms: pd.DataFrame
    wall_time: float
    path: Path | None = None

    @property
    def profile(self) -> deployment.DeploymentProfile:
        """The document read back as :class:`~simsched.cost.deployment.DeploymentProfile`."""
        return deployment.parse(self.document, str(self.path or "calibration"))


def terms_frame(document: dict) -> pd.DataFrame:
    """One row per term: shipped (prior) value, fitted value, 90 % interval, unit."""
    rows = []
    prior = deployment.from_coordinates(document["prior"]["center"])
    for t in TERMS:
        unit, scale = UNITS[t]
        lo, hi = document["intervals"][t]
        rows.append({"term": t, "unit": unit, "shipped": prior[t] * scale,
                     "fitted": document["terms"][t] * scale, "low_90": lo * scale,
                     "high_90": hi * scale})
    return pd.DataFrame(rows)


def report_frame(document: dict) -> pd.DataFrame:
    """Measured vs simulated per run and metric, before (shipped) and after calibration, with
    signed errors (%) and the metric's unexplained scatter (``discrepancy``, %)."""
    df = pd.DataFrame(document["residuals"])
    df["shipped_error"] = (df["shipped"] / df["measured"] - 1) * 100
    df["calibrated_error"] = (df["calibrated"] / df["measured"] - 1) * 100
    df["discrepancy"] = df["metric"].map(document["discrepancy"]) * 100
    return df


def calibrate(runs, path=None, seed: int = 0, sigma: dict | None = None,
              cache: dict | None = None, components=None) -> Calibration:
    """Fit the deployment terms to measured ``runs`` (:class:`Measured` runs from the readers of
    :mod:`simsched.analysis.measurements`, or :class:`~simsched.fit.replay.Scenario`s) and
    return the :class:`Calibration`; ``path``: also write the profile there. ``seed`` seeds
    every replayed workload (the fit is deterministic given it); ``sigma`` overrides a
    metric's expected relative error (:data:`simsched.fit.calibrate.METRIC_SIGMA`); ``cache``:
    a dict of simulations shared between calibrations of overlapping runs (leave one out);
    ``components``: the prior's (name, sigma share, weight) triples (default
    :data:`simsched.fit.calibrate.COMPONENTS`)."""
    if isinstance(runs, (Measured, replay.Scenario)):
        runs = [runs]
    runs = list(runs)
    start = time.perf_counter()
    scenarios = [replay.scenario(r, seed) for r in runs]
    out = core.fit_scenarios(scenarios, sigma=sigma, cache=cache,
                             components=components or core.COMPONENTS)
    wall = time.perf_counter() - start

    center, cov = np.array(out["center"]), np.array(out["covariance"])
    document = {
        "format": deployment.FORMAT, "version": deployment.VERSION,
        "simsched_version": _version(), "engine_overhead": scenarios[0].hardware.engine_overhead,
        "gpus": sorted({s.hardware.gpu for s in scenarios}),
        "models": sorted({s.hardware.model for s in scenarios}),
        "inputs": [dict(input_record(s), run=s.name, notes=s.notes,
                        metrics=list(s.metrics)) for s in scenarios],
        "seed": seed, "terms": out["terms"], "center": out["center"],
        "covariance": out["covariance"],
        "intervals": {t: list(core.interval_of(center, cov, j)) for j, t in enumerate(TERMS)},
        "discrepancy": out["discrepancy"], "residuals": out["residuals"],
        "prior": out["prior"], "components": out["components"],
        "metric_sigma": {m: core.METRIC_SIGMA.get(m) for m in out["discrepancy"]},
        "num_simulations": out["num_simulations"],
    }
    written = None
    if path is not None:
        written = Path(path)
        written.parent.mkdir(parents=True, exist_ok=True)
        written.write_text(json.dumps(document, indent=1))
    return Calibration(document, report_frame(document), terms_frame(document), wall, written)
