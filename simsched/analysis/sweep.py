"""Parameter sweeps: the Cartesian product of config fields, run in parallel, as tidy frames.

``sweep(base, rate=[1, 2, 4], policy=["fcfs", "spf"], seed=[0, 1])`` makes 12 runs and returns a
:class:`SweepResult` whose ``runs`` frame has one row per run (its ``run_id``, the varied fields
and the summary metrics, goodput and saturation label) and whose ``requests``, ``iterations`` and
``preemptions`` and ``replicas`` frames concatenate every run's frame with its ``run_id`` and varied
fields.

``sweep(base, ensemble=N, rate=[...])`` (``base`` with ``hardware.profile``, a calibrated
profile) runs every point N times, each with a coefficient set drawn from the profile and its
own seed (:mod:`simsched.analysis.ensemble`), and carries intervals: ``runs`` keeps one row per
point, each summary metric ``m`` as ``m`` (the mean over the draws), ``m_lo`` and ``m_hi`` (its
prediction interval at ``confidence``), with ``num_draws``; ``draws`` has one row per draw
(``run_id``, ``draw``, ``seed``, the drawn ``term_*``, the metrics), and the per-run frames are
led by ``run_id`` and ``draw``.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import pandas as pd

from simsched.analysis.executors import Job, RunOutput, execute, reraise_warnings
from simsched.analysis.export import plain, resolved_config, write_frames, write_json
from simsched.analysis.runner import return_freed_buffers
from simsched.analysis.slo import SLO
from simsched.config import SimConfig

FRAMES = ("runs", "requests", "iterations", "preemptions", "replicas")
# Summary columns that describe a run's setup rather than measure it: no interval.
SETUP_COLUMNS = ("max_sim_time", "num_blocks")


class SweepResult:
    """The outcome of a sweep: one row per run, plus every run's per-request/iteration frames."""

    def __init__(self, runs: pd.DataFrame, configs: list[SimConfig], factors: dict[str, list],
                 outputs: Sequence[RunOutput], points: Sequence[dict] | None = None,
                 draws: pd.DataFrame | None = None, confidence: float | None = None,
                 leads: Sequence[dict] | None = None) -> None:
        self.runs = runs
        self.configs = configs
        self.factors = factors
        self.points = list(points) if points is not None else [{} for _ in configs]
        #: One row per ensemble draw (``sweep(..., ensemble=N)``), else None.
        self.draws = draws
        #: The prediction intervals' confidence of an ensemble sweep, else None.
        self.confidence = confidence
        self._outputs = outputs
        # The columns leading each output's frames (run_id, draw, the varied fields).
        self._leads = list(leads) if leads is not None else [
            {"run_id": i, **p} for i, p in enumerate(self.points)]
        self._kept = not outputs or outputs[0].requests is not None
        self._frames: dict[str, pd.DataFrame] = {}

    def _concat(self, name: str) -> pd.DataFrame:
        if name not in self._frames:
            if not self._kept:
                raise ValueError(f"this sweep did not keep per-run frames "
                                 f"(keep_frames=False); {name!r} is unavailable")
            parts = []
            for k, out in enumerate(self._outputs):
                frame = getattr(out, name)
                lead = {c: v for c, v in self._leads[k].items()
                        if c in ("run_id", "draw") or c not in frame.columns}
                parts.append(_with_leading(frame, lead))
                # The combined frame is the one copy kept: let the run's own frame go.
                setattr(out, name, None)
                del frame
            self._frames[name] = (pd.concat(parts, ignore_index=True) if parts
                                  else pd.DataFrame({"run_id": []}))
        return self._frames[name]

    @property
    def requests(self) -> pd.DataFrame:
        """Every run's requests frame, concatenated, led by ``run_id`` and the varied fields."""
        return self._concat("requests")

    @property
    def iterations(self) -> pd.DataFrame:
        """Every run's iterations frame, concatenated, led by ``run_id`` and the varied fields."""
        return self._concat("iterations")

    @property
    def preemptions(self) -> pd.DataFrame:
        """Every run's preemption causes, concatenated, led by ``run_id`` and the varied
        fields."""
        return self._concat("preemptions")

    @property
    def replicas(self) -> pd.DataFrame:
        """Every run's per-replica frame, concatenated, led by ``run_id`` and the varied fields."""
        return self._concat("replicas")

    def frames(self) -> dict[str, pd.DataFrame]:
        """``runs`` and, if kept, the concatenated per-run frames, by name."""
        out = {"runs": self.runs}
        if self.draws is not None:
            out["draws"] = self.draws
        if self._outputs and self._kept:
            out.update(requests=self.requests, iterations=self.iterations,
                       preemptions=self.preemptions, replicas=self.replicas)
        return out

    def resolved_configs(self) -> dict:
        """The sweep's factors and each run's resolved config (with ``derived`` values: the
        KV blocks used and the time limit applied), as JSON data."""
        runs = []
        for run_id, config in enumerate(self.configs):
            row = self.runs.iloc[run_id] if run_id < len(self.runs) else {}
            info = {"num_blocks": row.get("num_blocks")} if "num_blocks" in row else None
            extra = {"max_sim_time": row["max_sim_time"]} if "max_sim_time" in row else {}
            runs.append({"run_id": run_id, "point": plain(self.points[run_id]),
                         "config": resolved_config(config, info, **extra)})
        return {"factors": plain(self.factors), "runs": runs}

    def _write(self, directory, fmt: str) -> list[Path]:
        written = write_frames(self.frames(), directory, fmt)
        written.append(write_json(self.resolved_configs(), Path(directory) / "config.json"))
        return written

    def to_csv(self, directory) -> list[Path]:
        """Write every frame as ``NAME.csv`` and the runs' resolved configs as ``config.json``
        into ``directory``; return the paths."""
        return self._write(directory, "csv")

    def to_parquet(self, directory) -> list[Path]:
        """As :meth:`to_csv`, as ``NAME.parquet`` files (needs pyarrow)."""
        return self._write(directory, "parquet")

    def intervals(self, over: str = "seed", confidence: float = 0.95) -> pd.DataFrame:
        """Each summary metric's mean and Student-t interval over the values of factor ``over``
        (seeds), per combination of the other factors: one row per (group, metric) with the
        group's factor values, ``metric``, ``mean``, ``std``, ``ci_low``, ``ci_high``,
        ``num_seeds`` and ``confidence``."""
        from simsched.analysis.replicate import intervals_of

        if over not in self.runs.columns:
            raise ValueError(f"intervals over {over!r}: the sweep did not vary it "
                             f"(factors: {list(self.factors)})")
        others = [k for k in self.factors if k != over and k in self.runs.columns]
        skip = set(others) | {over, "run_id"}
        metrics = self.runs[[c for c in self.runs.columns if c not in skip]]
        parts = []
        groups = self.runs.groupby(others, sort=False) if others else [((), self.runs)]
        for key, group in groups:
            frame = intervals_of(metrics.loc[group.index], confidence)
            key = key if isinstance(key, tuple) else (key,)
            for name, value in zip(others, key):
                frame[name] = value
            parts.append(frame)
        out = pd.concat(parts, ignore_index=True)
        return out[others + [c for c in out.columns if c not in others]]

    def __len__(self) -> int:
        return len(self.runs)

    def __repr__(self) -> str:
        return f"SweepResult({len(self.runs)} runs, factors={list(self.factors)})"


def _with_leading(frame: pd.DataFrame, lead: Mapping) -> pd.DataFrame:
    """``frame`` with constant columns ``lead`` put first."""
    extra = pd.DataFrame({k: [v] * len(frame) if not isinstance(v, (list, tuple, dict))
                          else pd.Series([v] * len(frame), dtype=object)
                          for k, v in lead.items()}, index=frame.index)
    return pd.concat([extra, frame], axis=1)


def grid(base_config: SimConfig, factors: Mapping[str, Iterable]) -> tuple[list[SimConfig],
                                                                             list[dict]]:
    """Every combination of ``factors`` applied to ``base_config`` (first factor varies slowest).

    Returns the configs and, for each, the ``{field: value}`` it varied. A bad field name or value
    raises ``ValueError`` before anything runs.
    """
    if not isinstance(base_config, SimConfig):
        raise ValueError(f"base_config must be a SimConfig, got {type(base_config).__name__}")
    names, values = [], []
    for name, vals in factors.items():
        if isinstance(vals, (str, bytes)) or not isinstance(vals, Iterable):
            vals = [vals]
        vals = list(vals)
        if not vals:
            raise ValueError(f"sweep factor {name!r} has no values")
        names.append(name)
        values.append(vals)
    configs, points = [], []
    for combo in itertools.product(*values):
        point = dict(zip(names, combo))
        try:
            configs.append(base_config.replace(**point))
        except TypeError as exc:
            raise ValueError(f"bad sweep point {point}: {exc}") from None
        points.append(point)
    return configs, points


def sweep(base_config: SimConfig | None = None, executor: str = "local",
          max_workers: int | None = None, progress: bool = True,
          slos: "SLO | Mapping[str, SLO] | None" = None, keep_frames: bool = True,
          ray_address: str | None = None, ensemble: int | None = None,
          confidence: float = 0.9, **factors: Iterable) -> SweepResult:
    """Run the Cartesian product of ``factors`` over ``base_config``; one row per run.

    Each factor is a config field (flat, e.g. ``rate``, ``policy``, ``seed``, or dotted via
    ``**{"cache.num_blocks": [512, 1024]}``) with a list of values. Runs execute on local cores
    (``executor="local"``, a process pool of ``max_workers``), in this process (``"serial"``) or
    on Ray (``"ray"``, connecting to ``ray_address`` or starting a local instance); the rows are
    identical whichever executor ran them. ``slos`` (an :class:`~simsched.analysis.slo.SLO` or a
    mapping of name to SLO) adds goodput and attainment columns. If a config has no
    ``max_sim_time``, each run stops at twice its last arrival time plus 60 s, so overloaded runs
    end and report their unfinished requests. ``keep_frames=False`` returns only the rows.
    ``progress`` shows a progress bar (tqdm) when there is more than one run.
    ``ensemble`` (N >= 2; every point's config needs ``hardware.profile``) runs each point
    with N coefficient sets drawn from its calibrated profile and gives each metric a
    ``confidence`` prediction interval (see the module docstring); it varies the seed itself.
    """
    base_config = base_config or SimConfig()
    return_freed_buffers()   # the per-run frames this process receives and drops, too
    if slos is not None and not isinstance(slos, (SLO, Mapping)):
        raise ValueError(f"slos must be an SLO or a mapping of name to SLO, got {slos!r}")
    configs, points = grid(base_config, factors)
    factor_lists = {k: list(v) if isinstance(v, Iterable) and not isinstance(v, (str, bytes))
                    else [v] for k, v in factors.items()}
    if ensemble is not None:
        return _ensemble_sweep(configs, points, factor_lists, ensemble, confidence, slos,
                               keep_frames, dict(executor=executor, max_workers=max_workers,
                                                 progress=progress, ray_address=ray_address))
    jobs = [Job(cfg, slos, keep_frames) for cfg in configs]
    outputs = execute(jobs, executor=executor, max_workers=max_workers, progress=progress,
                      ray_address=ray_address, desc="sweep")
    reraise_warnings(outputs)
    rows = []
    for run_id, (point, out) in enumerate(zip(points, outputs)):
        rows.append({"run_id": run_id, **point, **out.row})
    runs = pd.DataFrame(rows)
    return SweepResult(runs, configs, factor_lists, outputs, points)


def _ensemble_sweep(configs, points, factors, num_draws, confidence, slos, keep_frames,
                    options) -> SweepResult:
    """:func:`sweep` with ``ensemble``: N drawn coefficient sets per point, intervals."""
    from simsched.analysis.ensemble import check_draws, draws_of, interval_columns

    check_draws(num_draws, confidence)
    if any(k.split(".")[-1] == "seed" for k in factors):
        raise ValueError("sweep: ensemble varies the seed itself (draw k runs seed + k); give "
                         "ensemble or a seed factor, not both")
    jobs, leads, profiles = [], [], []
    for run_id, (cfg, point) in enumerate(zip(configs, points)):
        draws, prof = draws_of(cfg, num_draws, f"sweep point {point}: ensemble")
        profiles.append(prof)
        for k, (seed, terms) in enumerate(draws):
            jobs.append(Job(cfg.replace(seed=seed), slos, keep_frames, terms))
            leads.append({"run_id": run_id, "draw": k, "seed": seed,
                          **{f"term_{t}": v for t, v in terms.items()}, **point})
    outputs = execute(jobs, desc="sweep", **options)
    reraise_warnings(outputs)
    draws_frame = pd.DataFrame([{**lead, **out.row} for lead, out in zip(leads, outputs)])
    rows = []
    for run_id, point in enumerate(points):
        mine = draws_frame[draws_frame["run_id"] == run_id]
        metrics = mine[[c for c in mine.columns if c not in point and c != "run_id"]]
        rows.append({"run_id": run_id, **point, **interval_columns(
            metrics, profiles[run_id].discrepancy, confidence, skip=SETUP_COLUMNS)})
    runs = pd.DataFrame(rows)
    for col in SETUP_COLUMNS:     # the same for every draw of a point: the first draw's
        if col in draws_frame:
            runs[col] = draws_frame.groupby("run_id", sort=True)[col].first().to_numpy()
    frame_leads = [{k: v for k, v in lead.items() if k not in ("seed",)
                    and not k.startswith("term_")} for lead in leads]
    return SweepResult(runs, configs, factors, outputs, points, draws_frame, confidence,
                       frame_leads)
