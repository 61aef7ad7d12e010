"""Running many independent simulations: serially, on local processes, or on a Ray cluster.

A job is a :class:`~simsched.config.SimConfig` (plus the SLOs to judge it by); a worker returns a
small :class:`RunOutput` (one summary row and the run's frames). Each run draws its randomness
from its own config's seed, so results do not depend on which executor or worker ran it, nor on
the order.
"""

from __future__ import annotations

import math
import os
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import pandas as pd

from simsched.analysis.progress import progress_bar
from simsched.analysis.ray_connect import connect
from simsched.analysis.slo import summarize
from simsched.config import SimConfig

EXECUTORS = ("local", "serial", "ray")
# When a config has no max_sim_time, a sweep stops each run at this multiple of its last arrival
# plus this margin, so that an overloaded run still ends and reports what was left waiting.
TIME_LIMIT_FACTOR = 2.0
TIME_LIMIT_MARGIN = 60.0


@dataclass
class RunOutput:
    """What a worker sends back: the summary row and, if kept, the run's frames."""

    row: dict[str, Any]
    requests: pd.DataFrame | None = None
    iterations: pd.DataFrame | None = None
    preemptions: pd.DataFrame | None = None
    warnings: tuple = ()
    replicas: pd.DataFrame | None = None


@dataclass(frozen=True)
class Job:
    """One run to make: a config, the SLOs for goodput, and whether to return the frames;
    ``terms``: deployment terms (:mod:`simsched.cost.deployment`) correcting the config's cost
    model, one draw of an ensemble (None: the config's own cost model)."""

    config: SimConfig
    slos: Any = None
    keep_frames: bool = True
    terms: dict | None = None


def _last_arrival(table: pd.DataFrame) -> float:
    """The latest arrival; for closed-loop sessions, a start plus the session's think times."""
    if not len(table):
        return 0.0
    times = table["arrival_at"]
    if "session_id" in table.columns and "think_time" in table.columns:
        times = times + table.groupby("session_id", sort=False)["think_time"].cumsum()
    return float(times.max())


def run_config(config: SimConfig, slos: Any = None, progress: bool = False,
               record_steps: bool = False, terms: dict | None = None, **sharding):
    """Simulate one config (applying the default time limit); return its Results and summary row.

    Without a ``max_sim_time`` the run stops at ``TIME_LIMIT_FACTOR`` times its last arrival plus
    ``TIME_LIMIT_MARGIN`` seconds, so an overloaded run still ends and reports what was left.
    ``progress`` as :func:`~simsched.analysis.runner.simulate`'s.
    ``record_steps`` also records the per-step frame (``Results.steps``). ``terms`` corrects
    the cost model by deployment terms (an ensemble's draw). ``sharding`` (``shards``,
    ``shard_workers``, ``ray_address``) runs it sharded, as ``simulate`` does.
    """
    from simsched.analysis.runner import run, workload_requests
    from simsched.cost.factory import adjusted_cost_model

    cost_model = None if terms is None else adjusted_cost_model(config.hardware, terms)

    table = workload_requests(config)
    if math.isinf(config.max_sim_time):
        last = _last_arrival(table)
        config = config.replace(max_sim_time=TIME_LIMIT_FACTOR * last + TIME_LIMIT_MARGIN)
    # simulate() draws the workload from the same seed: passing the table is identical.
    results = run(config, requests=table, cost_model=cost_model, from_workload=True,
                  progress=progress, record_steps=record_steps, **sharding)[0]
    row = summarize(results, slos)
    row["max_sim_time"] = config.max_sim_time
    row["num_blocks"] = results.info.get("num_blocks")
    return results, row


def run_job(job: Job) -> RunOutput:
    """Run one job (see :func:`run_config`) and pack its row, frames and warnings."""
    # Workers collect warnings (e.g. clipped prompts) so the caller can show each once.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results, row = run_config(job.config, job.slos, terms=job.terms)
    notes = tuple((w.category, str(w.message)) for w in caught)
    if not job.keep_frames:
        return RunOutput(row, warnings=notes)
    return RunOutput(row, results.requests, results.iterations, results.preemptions, notes,
                     replicas=results.replicas)


def reraise_warnings(outputs: Sequence[RunOutput], limit: int = 3) -> None:
    """Re-emit the workers' warnings here, each distinct message once (at most ``limit``)."""
    seen: dict[str, type] = {}
    for out in outputs:
        for category, message in out.warnings:
            seen.setdefault(message, category)
    for message, category in list(seen.items())[:limit]:
        warnings.warn(message, category, stacklevel=3)
    if len(seen) > limit:
        warnings.warn(f"... and {len(seen) - limit} more distinct warnings from the runs",
                      UserWarning, stacklevel=3)


def _run_chunk(jobs: Sequence[Job]) -> list[RunOutput]:
    return [run_job(job) for job in jobs]


def _chunks(items: Sequence, size: int) -> list[Sequence]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _progress(total: int, enabled: bool, desc: str):
    # A bar on a terminal; plain periodic lines in a log (no carriage returns).
    return progress_bar(total, desc, "runs") if enabled else None


def execute(jobs: Sequence[Job], executor: str = "local", max_workers: int | None = None,
            progress: bool = True, ray_address: str | None = None,
            desc: str = "simsched") -> list[RunOutput]:
    """Run ``jobs`` and return their outputs in the same order.

    ``executor="local"`` uses a process pool of ``max_workers`` (default: all cores), sending jobs
    in chunks; it falls back to serial for one job or one worker. ``"serial"`` runs in this
    process. ``"ray"`` runs on a Ray cluster (see :func:`ray_execute`).
    """
    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {list(EXECUTORS)}, got {executor!r}")
    if max_workers is not None and (isinstance(max_workers, bool) or not isinstance(
            max_workers, int) or max_workers < 1):
        raise ValueError(f"max_workers must be an integer >= 1 or None, got {max_workers!r}")
    jobs = list(jobs)
    bar = _progress(len(jobs), bool(progress) and len(jobs) > 1, desc)
    try:
        if executor == "ray":
            return ray_execute(jobs, ray_address, bar)
        workers = min(max_workers or os.cpu_count() or 1, len(jobs))
        if executor == "serial" or workers <= 1:
            return list(_iterate(map(run_job, jobs), bar, 1))
        # Several chunks per worker balance uneven run times; chunks cut per-job overhead.
        size = max(1, math.ceil(len(jobs) / (workers * 4)))
        with ProcessPoolExecutor(max_workers=workers) as pool:
            out: list[RunOutput] = []
            for chunk in _iterate(pool.map(_run_chunk, _chunks(jobs, size)), bar, None):
                out.extend(chunk)
            return out
    finally:
        if bar is not None:
            bar.close()


def _iterate(results: Iterator, bar, step: int | None) -> Iterator:
    for item in results:
        if bar is not None:
            bar.update(step if step is not None else len(item))
        yield item


def ray_execute(jobs: Sequence[Job], address: str | None = None, bar=None) -> list[RunOutput]:
    """Run ``jobs`` as Ray tasks, in chunks, and return their outputs in order.

    Connects to the cluster at ``address`` if given (simsched must be importable on its nodes),
    otherwise to the Ray instance already initialised in this process, otherwise starts a local
    one with ``ray.init(num_cpus=2, include_dashboard=False)``. A Ray instance started here is
    left running for later sweeps; call ``ray.shutdown()`` to stop it.
    """
    ray = connect(address)
    remote = ray.remote(_run_chunk)
    num_cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    size = max(1, math.ceil(len(jobs) / (num_cpus * 4)))
    chunks = _chunks(list(jobs), size)
    refs = [remote.remote(chunk) for chunk in chunks]
    index = {ref: i for i, ref in enumerate(refs)}
    done: list[list[RunOutput] | None] = [None] * len(refs)
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        for ref in ready:
            done[index[ref]] = ray.get(ref)
            if bar is not None:
                bar.update(len(chunks[index[ref]]))
    return [out for chunk in done for out in chunk]

