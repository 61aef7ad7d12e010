"""Runs that stream their records to Parquet as they go (``simulate(..., stream_to=PATH)``).

A big run (a fleet over a day: tens of millions of requests, hundreds of millions of GPU
iterations) does not fit in memory as frames. Streaming writes, every ``chunk`` ended requests:

- ``PATH/iterations/part-*.parquet``: the GPU iterations logged since the last chunk (every
  replica's log is emptied into it, with a ``replica`` column; also whenever the logs hold
  :data:`ITERATION_BYTES`);
- ``PATH/requests/part-*.parquet``: the ended requests' rows, built by the same code as the
  in-memory request frame (:func:`~simsched.analysis.frames.build_requests_frame`), so the
  streamed frames equal the in-memory ones row for row once sorted by ``request_id``
  (iterations: stably by ``replica``);
- ``PATH/preemptions/part-*.parquet``: their preemption causes;

and at the end ``PATH/windows.parquet`` (per-window summaries accumulated chunk by chunk),
``PATH/replicas.parquet``, ``PATH/fleet_units.parquet`` and ``PATH/fleet_timeline.parquet`` (an
autoscaled run), and ``PATH/info.json``. Only requests in flight are objects; of the decode
steps' end times (per-token gaps are rebuilt from them) only those an in-flight request may
still need are kept. What stays per request is the workload's columns: arrival (8 bytes),
lengths and priority in the narrowest integers that hold them, tenants only if some request
has one (13 bytes a request for 16-bit lengths and one priority).

:func:`read_stream` reads a streamed run back (pandas frames, or pyarrow datasets to scan
without loading). Plain workloads only: no prefix-cache content, no closed-loop sessions, no
disaggregation, no invariant checks or step recording (they read every request object).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from array import array
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from simsched.analysis.export import require_pyarrow
from simsched.analysis.fleet_metrics import migrations_column
from simsched.analysis.frames import _STR, _TEXT_COLUMNS, build_requests_frame
from simsched.cluster.lazy import LazyRequests
from simsched.engine.log import _is_count, concat_frames
from simsched.engine.log import decode_step_ends as frame_step_ends
from simsched.engine.log import log_step_ends
from simsched.request import Request, awaits_release

CHUNK = 65536
WINDOW = 600.0
# Iteration logs are also drained when they hold this many bytes (checked every 1,024 ended
# requests): a busy fleet logs ~20 iterations per request, and one drain holds a few copies.
ITERATION_BYTES = 16 << 20


SUBDIRS = ("requests", "iterations", "preemptions")


def prepare_target(path) -> Path:
    """Check ``stream_to`` before anything runs and make its directories; the path.

    A non-path, an existing file, a path under a file, or a place where no directory can be
    made or written raises one ValueError naming the path and the problem (pathlib's own
    errors came from deep inside the run once it had started: issue 40, defect 14).
    """
    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"stream_to must be a directory path (str or os.PathLike), got "
                         f"{type(path).__name__} {path!r}")
    require_pyarrow("stream_to (it writes Parquet)")
    target = Path(path)
    if str(path) == "":
        raise ValueError("stream_to must be a directory path, got an empty string")
    if target.exists() and not target.is_dir():
        raise ValueError(f"stream_to {str(target)!r} is a file, not a directory")
    above = next((p for p in target.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise ValueError(f"stream_to {str(target)!r} is under {str(above)!r}, which is a file")
    try:
        for sub in SUBDIRS:
            (target / sub).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"stream_to {str(target)!r}: cannot make the directory there "
                         f"({exc.strerror or exc})") from None
    try:
        with tempfile.TemporaryFile(dir=target / SUBDIRS[0]):
            pass                                    # the run can write its parts there
    except OSError as exc:
        raise ValueError(f"stream_to {str(target)!r}: cannot write in the directory "
                         f"({exc.strerror or exc})") from None
    return target


class StreamingRequests:
    """The run's requests, created at arrival from workload columns and written out in chunks
    when they end (the :class:`~simsched.cluster.lazy.LazyRequests` interface the cluster
    uses: iteration, ``record``, ``len``). Integer columns are held in the narrowest type
    that holds them (:func:`_narrow`); :meth:`taking` also copies columns that view a table."""

    __iter__ = LazyRequests.__iter__
    part_prefix = ""        # (a sharded run's shards write parts of their own: shard_workers)

    def __init__(self, path: Path, arrival, prompt, output, priority, tenant, prefix: bool,
                 chunk: int | None = None, window: float = WINDOW) -> None:
        require_pyarrow("stream_to (it writes Parquet)")   # before the run, not at a write
        self.arrival = np.asarray(arrival, dtype=float)
        self.prompt = _narrow(prompt)
        self.output = _narrow(output)
        self.priority = _narrow(priority)
        self.tenant = tenant
        self.n = len(self.arrival)
        self.live: dict = {}
        self.done: list = []
        self.max_recorded = -1
        self.path, self.prefix, self.window = Path(path), prefix, window
        self.chunk = chunk if chunk is not None else CHUNK
        self.cluster = None
        self.steps: list[array] = []        # per replica: decode step end times kept
        self.kept_from: list[int] = []      # per replica: the step number of steps[r][0]
        self.num_steps: list[int] = []      # per replica: decode steps so far
        self.parts = 0
        self.iteration_parts = 0
        self.since_check = 0
        self.windows: dict[int, np.ndarray] = {}
        for sub in SUBDIRS:
            (self.path / sub).mkdir(parents=True, exist_ok=True)

    @classmethod
    def taking(cls, path: Path, columns: list, prefix: bool) -> "StreamingRequests":
        """A store of ``columns`` (arrival, prompt, output, priority, tenant), which may be
        views of a request table: each is copied compactly and its entry replaced before the
        next (a fleet's day holds its table's columns and their copies one at a time)."""
        for k in (1, 2, 3):
            columns[k] = _narrow(columns[k])
        columns[0] = np.array(columns[0], dtype=float)
        return cls(path, *columns, prefix=prefix)

    def __len__(self) -> int:
        return self.n

    def bind(self, cluster) -> None:
        """Attach the cluster whose replicas' logs and routing this store reads."""
        self.cluster = cluster

    def record(self, req) -> None:
        """``req``'s process has ended: write it out with the next chunk."""
        del self.live[req.id]
        self.done.append(req)
        if req.id > self.max_recorded:
            self.max_recorded = req.id
        if len(self.done) >= self.chunk:
            self.flush()
        else:
            self.since_check += 1
            if self.since_check >= 1024:
                self.since_check = 0
                if sum(r.iteration_rows.nbytes for r in self.cluster.replicas) \
                        > ITERATION_BYTES:
                    self._drain_iterations()

    def step_ends(self, r: int, log) -> tuple[int, np.ndarray]:
        """Replica ``r``'s decode step end times that a request in flight may need: ``(first
        step, its end and every later one's)``, those written out (kept) then those still in
        its iteration ``log`` (a removed replica's requests turn their runs into gaps with
        them: :func:`simsched.engine.removal.remove_requests`)."""
        self._track_replicas()
        logged = log_step_ends(log)[1:]          # without its NaN before the first step
        return self.kept_from[r], np.concatenate(
            [np.frombuffer(self.steps[r], dtype=float), logged])

    # ------------------------------------------------------------- chunks
    def _track_replicas(self) -> None:
        while len(self.steps) < len(self.cluster.replicas):   # replicas added by an autoscaler
            self.steps.append(array("d"))
            self.kept_from.append(1)
            self.num_steps.append(0)

    def _drain_iterations(self) -> None:
        self._track_replicas()
        owners, logs = [], []
        for r, replica in enumerate(self.cluster.replicas):
            if replica.iteration_rows.values:
                owners.append(r)
                logs.append(replica.iteration_rows)
        if not logs:
            return
        # One frame of the logs (emptied in place: the GPU loops append to them), replica after
        # replica; a replica without a prefix cache holds 0 in its columns.
        frame = concat_frames(logs)
        for r, ends in zip(owners, frame_step_ends(frame, len(logs))):
            self.steps[r].frombytes(ends[1:].tobytes())     # without the NaN before step 1
            self.num_steps[r] += len(ends) - 1
        frame["replica"] = np.asarray(owners, dtype=np.int64)[frame["replica"].to_numpy()]
        name = f"part-{self.part_prefix}{self.iteration_parts:06d}.parquet"
        # Dictionary encoding only where it pays (counts).
        _write_parquet(frame, self.path / "iterations" / name,
                       use_dictionary=[c for c in frame.columns
                                       if c == "replica" or _is_count(c)])
        self.iteration_parts += 1
        _release_arrow_memory()

    def flush(self, final: bool = False) -> None:
        """Write the iterations logged so far and the ended requests' rows, then forget them
        (until ``final``, those that still await their release,
        :func:`~simsched.request.awaits_release`, wait for the next chunk)."""
        self._drain_iterations()
        done, self.done = self.done, []
        if not final and any(awaits_release(r) for r in done):
            self.done = [r for r in done if awaits_release(r)]
            done = [r for r in done if not awaits_release(r)]
        if done:
            self._write_requests(done)
        self.parts += 1
        self._prune()

    def _write_requests(self, done: list) -> None:
        cluster = self.cluster
        ids = np.fromiter((r.id for r in done), dtype=np.int64, count=len(done))
        if cluster.replica_of is None:
            owner = np.zeros(len(done), dtype=np.int64)
        else:
            owners = np.frombuffer(cluster.replica_of, dtype=np.int32)
            owner = owners[ids].astype(np.int64)
        # Every replica's kept step ends after a NaN placeholder, in one array (no pieces).
        step_end = np.empty(sum(len(steps) + 1 for steps in self.steps))
        starts, pos = [], 0
        for r, steps in enumerate(self.steps):
            step_end[pos] = np.nan
            step_end[pos + 1:pos + 1 + len(steps)] = np.frombuffer(steps, dtype=float)
            starts.append(pos - (self.kept_from[r] - 1))
            pos += len(steps) + 1
        offset = np.asarray(starts, dtype=np.int64)[np.maximum(owner, 0)]
        delays = np.array([float(getattr(s.cost_model, "output_delay", 0.0))
                           for s in cluster.specs])
        delay = delays[np.maximum(owner, 0)] if delays.any() else None
        frame, _, causes = build_requests_frame(done, step_end, step_offset=offset,
                                                prefix=self.prefix, replica=owner,
                                                output_delay=delay)
        fleet = getattr(cluster, "fleet", None)
        remover = getattr(fleet, "remover", None)
        if remover is not None and remover.mode == "migrate":     # as the in-memory frame
            moves = remover.moves
            chunk = {i: moves[i] for i in ids.tolist() if i in moves}
            frame["num_migrations"] = migrations_column(frame["request_id"].to_numpy(), chunk)
        name = f"part-{self.part_prefix}{self.parts:05d}.parquet"
        _write_parquet(frame, self.path / "requests" / name)
        if len(causes):
            _write_parquet(causes, self.path / "preemptions" / name)
        _release_arrow_memory()
        self._summarise(frame)

    def _prune(self) -> None:
        """Drop the decode step ends no request in flight (or held back unwritten) can still
        need."""
        replica_of = self.cluster.replica_of
        need = list(self.num_steps)
        for req in (*self.live.values(), *self.done):
            runs, start = req.runs, req.run_start_step
            first = runs[1] if runs else (start if start >= 0 else None)
            if first is None:
                continue
            r = replica_of[req.id] if replica_of is not None else 0
            if r >= 0 and first < need[r]:
                need[r] = int(first)
        for r, steps in enumerate(self.steps):
            drop = need[r] - self.kept_from[r]
            if drop > 0:
                del steps[:drop]
                self.kept_from[r] += drop

    def _summarise(self, frame: pd.DataFrame) -> None:
        """Add a chunk to the per-window sums: requests, finished, rejected, TTFT, E2EL, TPOT
        and output tokens (by arrival window)."""
        k = np.floor(frame["arrival_at"].to_numpy() / self.window).astype(np.int64)
        finished = (frame["status"] == "finished").to_numpy()
        rejected = (frame["status"] == "rejected").to_numpy()
        ttft = np.nan_to_num(frame["ttft"].to_numpy(float))
        e2el = np.where(finished, np.nan_to_num(frame["e2el"].to_numpy(float)), 0.0)
        tpot = frame["tpot"].to_numpy(float)
        has_tpot = finished & ~np.isnan(tpot)
        values = np.stack([np.ones(len(k)), finished, rejected, ttft,
                           ~np.isnan(frame["ttft"].to_numpy(float)), e2el,
                           np.where(has_tpot, tpot, 0.0), has_tpot,
                           np.where(finished, frame["num_generated_tokens"].to_numpy(), 0)])
        for w in np.unique(k):
            sums = values[:, k == w].sum(axis=1)
            self.windows[int(w)] = self.windows.get(int(w), 0) + sums

    def windows_frame(self) -> pd.DataFrame:
        """Per arrival window: counts, means of TTFT, E2EL and TPOT, output tokens."""
        keys = sorted(self.windows)
        v = np.array([self.windows[w] for w in keys]).reshape(-1, 9)
        with np.errstate(invalid="ignore", divide="ignore"):
            return pd.DataFrame({
                "start": np.asarray(keys, dtype=float) * self.window,
                "num_requests": v[:, 0].astype(np.int64), "num_finished": v[:, 1].astype(np.int64),
                "num_rejected": v[:, 2].astype(np.int64), "ttft_mean": v[:, 3] / v[:, 4],
                "e2el_mean": v[:, 5] / v[:, 1], "tpot_mean": v[:, 6] / v[:, 7],
                "num_output_tokens": v[:, 8].astype(np.int64)})

    def created(self, n: int) -> None:
        """Requests ``0..n-1`` were made (a sharded run's shards recorded most of them)."""
        self.max_recorded = max(self.max_recorded, n - 1)

    def finish(self) -> None:
        """After the run: record the requests in flight as they stand and those that never
        arrived (status pending), then write the last chunk."""
        created = max(self.max_recorded, max(self.live, default=-1)) + 1
        self.done.extend(self.live.values())
        self.live.clear()
        tenant = self.tenant
        for rid in range(created, self.n):
            self.done.append(Request(rid, self.arrival[rid], int(self.prompt[rid]),
                                     int(self.output[rid]), int(self.priority[rid]),
                                     tenant[rid] if tenant is not None else None))
        self.flush(final=True)


def _narrow(values) -> np.ndarray:
    """Integers in the smallest signed type that holds them all (token counts fit 16 or 32
    bits, priorities often 8: a streamed day holds its requests' columns the whole run)."""
    values = np.asarray(values)
    if values.dtype.kind not in "iu" or not len(values):
        return values.astype(np.int64)
    low, high = int(values.min()), int(values.max())
    for kind in (np.int8, np.int16, np.int32):
        info = np.iinfo(kind)
        if info.min <= low and high <= info.max:
            return values.astype(kind, copy=False)
    return values.astype(np.int64)


def _write_parquet(frame: pd.DataFrame, path: Path, **options) -> None:
    """``frame.to_parquet(path, **options)``, its columns converted on this thread: pandas has
    pyarrow convert a large frame's columns on a pool of threads, which a run meant to use one
    core should not do (the file is the same)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    table = pa.Table.from_pandas(frame, nthreads=1)
    if frame.attrs:                 # kept as pandas keeps them, for read_parquet to restore
        table = table.replace_schema_metadata({**table.schema.metadata,
                                               "PANDAS_ATTRS": json.dumps(frame.attrs)})
    pq.write_table(table, path, **options)


def _release_arrow_memory() -> None:
    """Have pyarrow's allocator hand the pages of the part just written back to the OS.

    Its default allocator (mimalloc or jemalloc) keeps freed pages for reuse, and the Parquet
    writer's buffers come from it (whatever pool Python code sets), so a streamed run would
    also hold what its biggest writes needed: a 1 h fleet run peaked 30 MiB lower with this.
    """
    import pyarrow as pa            # there: a store is only made with it (require_pyarrow)
    pa.default_memory_pool().release_unused()


@dataclass
class StreamedRun:
    """A streamed run on disk: ``path``, what it derived (``info``) and per-window sums."""

    path: Path
    info: dict
    windows: pd.DataFrame

    def frames(self) -> dict[str, pd.DataFrame]:
        """The run's frames read back (see :func:`read_stream`)."""
        return read_stream(self.path)

    def dataset(self, name: str):
        """``requests``, ``iterations`` or ``preemptions`` as a pyarrow dataset (lazy scans)."""
        import pyarrow.dataset as ds
        return ds.dataset(self.path / name, format="parquet")


def read_stream(path) -> dict[str, pd.DataFrame]:
    """A streamed run's frames: ``requests`` (by request id), ``iterations`` (replica after
    replica, each in time order), ``preemptions`` (by request), ``windows``, and where written
    ``replicas``, ``fleet_units``, ``fleet_timeline``. A missing directory raises ValueError."""
    path = Path(path)
    if not (path / "requests").is_dir():
        raise ValueError(f"{path}: not a streamed run (no requests/ directory)")
    out = {}
    for name, key in (("requests", "request_id"), ("iterations", "replica"),
                      ("preemptions", "request_id")):
        parts = sorted((path / name).glob("part-*.parquet"))
        frame = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True) if parts \
            else pd.DataFrame()
        if len(frame):
            frame = frame.sort_values(key, kind="stable", ignore_index=True)
        for col in _TEXT_COLUMNS:       # as the in-memory frames store their text
            if _STR is not None and col in frame.columns:
                frame[col] = frame[col].astype(_STR)
        out[name] = frame
    for name in ("windows", "replicas", "fleet_units", "fleet_timeline"):
        if (path / f"{name}.parquet").exists():
            out[name] = pd.read_parquet(path / f"{name}.parquet")
    return out


def write_end(store: StreamingRequests, extra: dict, info: dict) -> StreamedRun:
    """Write the end-of-run files (``extra`` frames, ``info``) and return the run's handle."""
    windows = store.windows_frame()
    _write_parquet(windows, store.path / "windows.parquet")
    for name, frame in extra.items():
        if frame is not None:
            _write_parquet(frame, store.path / f"{name}.parquet")
    plain = {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v))
             for k, v in info.items() if isinstance(v, (int, float, str, list))}
    (store.path / "info.json").write_text(json.dumps(plain, indent=1))
    return StreamedRun(store.path, info, windows)
