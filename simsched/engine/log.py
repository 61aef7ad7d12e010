"""The per-iteration log a replica keeps while it runs (packed rows in one byte buffer)."""

from __future__ import annotations

import struct

import numpy as np
import pandas as pd

ITERATION_COLUMNS = ("started_at", "duration", "num_prefill_tokens", "num_decode_tokens",
                     "num_seqs", "num_waiting", "kv_blocks_used", "num_preempted", "swap_time")
# With a prefix cache the log has three more columns: prompt tokens the iteration's admissions
# took from the cache, cached blocks its allocations evicted, and cached blocks nobody holds
# (evictable, free for allocation; kv_blocks_used then counts a shared block once).
PREFIX_COLUMNS = ("num_cached_tokens", "num_evicted_blocks", "kv_blocks_cached")

# Rows converted into the frame's columns at a time (the log shrinks as the columns fill).
_CHUNK_ROWS = 1 << 16


def _is_count(col: str) -> bool:
    return col.startswith("num_") or col.startswith("kv_blocks_")


class IterationLog:
    """One row per GPU iteration, packed into one growing byte buffer (8 bytes per value:
    float64, or int64 for counts).

    The engine appends ``pack(*row)`` to ``values`` once per iteration, its values held in
    variables named as the columns, in their order (tests/test_iteration_log.py checks the
    engine's calls against :data:`ITERATION_COLUMNS` by name); one C call packs the row, where a growing array per column took a call per value and parsed each value's type on
    the way in (about five times the cost). The frame's columns are filled from the end of the
    log backwards, a chunk at a time, and the buffer shrinks as they fill, so building them
    needs little more memory than the log itself.
    """

    def __init__(self, columns: tuple = ITERATION_COLUMNS) -> None:
        self.columns = columns
        self.dtype = np.dtype([(col, "<i8" if _is_count(col) else "<f8") for col in columns])
        self.pack = struct.Struct("<" + "".join("q" if _is_count(col) else "d"
                                                for col in columns)).pack
        self.values = bytearray()

    def append(self, row: tuple) -> None:
        """Record one iteration (values in ``self.columns`` order; counts must be integers)."""
        if len(row) != len(self.columns):
            raise ValueError(f"an iteration row has {len(self.columns)} values "
                             f"({', '.join(self.columns)}), got {len(row)}")
        self.values += self.pack(*row)

    def __len__(self) -> int:
        return len(self.values) // self.dtype.itemsize

    def __iter__(self):
        """The rows as tuples, oldest first."""
        return iter(np.frombuffer(bytes(self.values), dtype=self.dtype).tolist())

    def fill(self, columns: dict, start: int = 0) -> int:
        """Move the rows into ``columns`` (arrays by column name, rows from ``start`` on) and
        empty the log; return the number of rows."""
        size = self.dtype.itemsize
        values = self.values
        n = len(values) // size
        hi = n
        while hi > 0:
            lo = max(0, hi - _CHUNK_ROWS)
            chunk = np.frombuffer(values, dtype=self.dtype, offset=lo * size, count=hi - lo)
            for col in self.columns:
                columns[col][start + lo:start + hi] = chunk[col]
            del chunk
            del values[lo * size:]                  # gives the memory back as the log empties
            hi = lo
        return n                # values is empty now, and still the one the engine appends to

    def columns_arrays(self) -> dict:
        """The columns as numpy arrays; empties the log."""
        columns = {col: np.empty(len(self), dtype=self.dtype[col]) for col in self.columns}
        self.fill(columns)
        return columns

    def frame(self) -> pd.DataFrame:
        """The rows as a DataFrame (count columns are integers); empties the log."""
        return pd.DataFrame(_fill([self])[1], copy=False)


def _fill(logs: list[IterationLog]) -> tuple[np.ndarray, dict]:
    """(each row's log index, column arrays) of ``logs`` one after another; empties them.

    A column some logs lack (a replica without a prefix cache) is 0 in their rows.
    """
    names = max((log.columns for log in logs), key=len, default=ITERATION_COLUMNS)
    if len(logs) == 1:
        columns = logs[0].columns_arrays()
        total = len(next(iter(columns.values())))
        return np.zeros(total, dtype=np.int64), columns
    total = sum(len(log) for log in logs)
    owner = np.empty(total, dtype=np.int64)
    columns = {col: np.zeros(total, dtype=np.int64 if _is_count(col) else float)
               for col in names}
    pos = 0
    for index, log in enumerate(logs):
        n = log.fill(columns, pos)
        owner[pos:pos + n] = index
        pos += n
    return owner, columns


def decode_step_ends(iterations: pd.DataFrame, num_replicas: int = 1) -> list[np.ndarray]:
    """Each replica's decode-step end times, indexed by step (index 0, before the first step,
    is NaN), from the iteration frame (``replica`` column when there are several).

    A replica's decode steps are its iterations with decodes, in order; a step ends when its
    iteration does (``started_at + duration``, the same float sum the clock made).
    """
    decodes = iterations["num_decode_tokens"].to_numpy() > 0
    ends = (iterations["started_at"].to_numpy() + iterations["duration"].to_numpy())[decodes]
    if num_replicas == 1:
        return [np.concatenate(([np.nan], ends))]
    # Rows come replica after replica: each replica's steps are one slice.
    owner = iterations["replica"].to_numpy()[decodes]
    bounds = np.searchsorted(owner, np.arange(num_replicas + 1))
    return [np.concatenate(([np.nan], ends[lo:hi])) for lo, hi in zip(bounds[:-1], bounds[1:])]


def concat_frames(logs: list[IterationLog], column: str = "replica") -> pd.DataFrame:
    """Several replicas' logs as one frame (replica after replica) with a leading ``column``
    holding each row's log index; empties the logs.

    Columns are allocated once and filled chunk by chunk, so the frame of a large cluster run
    needs little more memory than the frame itself (no per-replica frames, no concatenation).
    """
    owner, columns = _fill(logs)
    return pd.DataFrame({column: owner, **columns}, copy=False)
