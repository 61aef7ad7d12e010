"""Parameter sweeps: the Cartesian product of config fields, run in parallel, as tidy frames.

``sweep(base, rate=[1, 2, 4], policy=["fcfs", "spf"], seed=[0, 1])`` makes 12 runs and returns a
:class:`SweepResult` whose ``runs`` frame has one row per run (its ``run_id``, the varied fields
and the summary metrics, goodput and saturation label) and whose ``requests``, ``iterations`` and
``preemptions`` and ``replicas`` frames concatenate every run's frame with its ``run_id``.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import pandas as pd

from simsched.analysis.slo import SLO
from simsched.config import SimConfig
from simsched.analysis.executors import Job, RunOutput, execute, reraise_warnings

FRAMES = ("runs", "requests", "iterations", "preemptions", "replicas")


class SweepResult:
    """The outcome of a sweep: one row per run, plus every run's per-request/iteration frames."""

    def __init__(self, runs: pd.DataFrame, configs: list[SimConfig], factors: dict[str, list],
                 outputs: Sequence[RunOutput]) -> None:
        self.runs = runs
        self.configs = configs
        self.factors = factors
        self._outputs = outputs
        self._frames: dict[str, pd.DataFrame] = {}

    def _concat(self, name: str) -> pd.DataFrame:
        if name not in self._frames:
            parts = []
            for run_id, out in enumerate(self._outputs):
                frame = getattr(out, name)
                if frame is None:
                    raise ValueError(f"this sweep did not keep per-run frames "
                                     f"(keep_frames=False); {name!r} is unavailable")
                parts.append(frame.assign(run_id=run_id)[["run_id", *frame.columns]])
            self._frames[name] = (pd.concat(parts, ignore_index=True) if parts
                                  else pd.DataFrame({"run_id": []}))
        return self._frames[name]

    @property
    def requests(self) -> pd.DataFrame:
        """Every run's requests frame, concatenated, with a leading ``run_id`` column."""
        return self._concat("requests")

    @property
    def iterations(self) -> pd.DataFrame:
        """Every run's iterations frame, concatenated, with a leading ``run_id`` column."""
        return self._concat("iterations")

    @property
    def preemptions(self) -> pd.DataFrame:
        """Every run's preemption causes, concatenated, with a leading ``run_id`` column."""
        return self._concat("preemptions")

    @property
    def replicas(self) -> pd.DataFrame:
        """Every run's per-replica frame, concatenated, with a leading ``run_id`` column."""
        return self._concat("replicas")

    def frames(self) -> dict[str, pd.DataFrame]:
        """``runs`` and, if kept, the concatenated per-run frames, by name."""
        out = {"runs": self.runs}
        if self._outputs and self._outputs[0].requests is not None:
            out.update(requests=self.requests, iterations=self.iterations,
                       preemptions=self.preemptions, replicas=self.replicas)
        return out

    def to_csv(self, directory) -> list[Path]:
        """Write every frame as ``NAME.csv`` into ``directory``; return the paths."""
        return _write(self.frames(), directory, "csv")

    def to_parquet(self, directory) -> list[Path]:
        """Write every frame as ``NAME.parquet`` (needs pyarrow) into ``directory``."""
        return _write(self.frames(), directory, "parquet")

    def __len__(self) -> int:
        return len(self.runs)

    def __repr__(self) -> str:
        return f"SweepResult({len(self.runs)} runs, factors={list(self.factors)})"


def _write(frames: Mapping[str, pd.DataFrame], directory, fmt: str) -> list[Path]:
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    written = []
    for name, frame in frames.items():
        target = path / f"{name}.{fmt}"
        if fmt == "csv":
            frame.to_csv(target, index=False)
        else:
            try:
                import pyarrow  # noqa: F401
            except ImportError:
                raise ImportError("Parquet export needs pyarrow: pip install pyarrow") from None
            _parquet_safe(frame).to_parquet(target, index=False)
        written.append(target)
    return written


def _parquet_safe(frame: pd.DataFrame) -> pd.DataFrame:
    # Object columns mixing None with strings/numbers (tenant, varied fields) must be one type.
    out = frame.copy()
    for col in out.columns:
        if out[col].dtype == object:
            out[col] = out[col].map(lambda v: None if v is None else str(v))
    return out


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
          ray_address: str | None = None, **factors: Iterable) -> SweepResult:
    """Run the Cartesian product of ``factors`` over ``base_config``; one row per run.

    Each factor is a config field (flat, e.g. ``rate``, ``policy``, ``seed``, or dotted via
    ``**{"cache.num_blocks": [512, 1024]}``) with a list of values. Runs execute on local cores
    (``executor="local"``, a process pool of ``max_workers``), in this process (``"serial"``) or
    on Ray (``"ray"``, connecting to ``ray_address`` or starting a local instance); the rows are
    identical whichever executor ran them. ``slos`` (an :class:`~simsched.analysis.slo.SLO` or a
    mapping of name to SLO) adds goodput and attainment columns. If a config has no
    ``max_sim_time``, each run stops at twice its last arrival time plus 60 s, so overloaded runs
    end and report their unfinished requests. ``keep_frames=False`` returns only the rows.
    """
    base_config = base_config or SimConfig()
    if slos is not None and not isinstance(slos, (SLO, Mapping)):
        raise ValueError(f"slos must be an SLO or a mapping of name to SLO, got {slos!r}")
    configs, points = grid(base_config, factors)
    jobs = [Job(cfg, slos, keep_frames) for cfg in configs]
    outputs = execute(jobs, executor=executor, max_workers=max_workers, progress=progress,
                      ray_address=ray_address, desc="sweep")
    reraise_warnings(outputs)
    rows = []
    for run_id, (point, out) in enumerate(zip(points, outputs)):
        rows.append({"run_id": run_id, **point, **out.row})
    runs = pd.DataFrame(rows)
    return SweepResult(runs, configs, {k: list(v) if isinstance(v, Iterable) and not isinstance(
        v, (str, bytes)) else [v] for k, v in factors.items()}, outputs)
