"""The per-iteration log a replica keeps while it runs (packed floats, one row per iteration)."""

from __future__ import annotations

import numpy as np
import pandas as pd

ITERATION_COLUMNS = ("started_at", "duration", "num_prefill_tokens", "num_decode_tokens",
                     "num_seqs", "num_waiting", "kv_blocks_used", "num_preempted", "swap_time")
# With a prefix cache the log has three more columns: prompt tokens the iteration's admissions
# took from the cache, cached blocks its allocations evicted, and cached blocks nobody holds
# (evictable, free for allocation; kv_blocks_used then counts a shared block once).
PREFIX_COLUMNS = ("num_cached_tokens", "num_evicted_blocks", "kv_blocks_cached")


class IterationLog:
    """One row per GPU iteration, buffered as tuples and packed into a float array every
    ``CHUNK`` rows, so a run of millions of iterations keeps 8 bytes per value."""

    CHUNK = 65536

    def __init__(self, columns: tuple = ITERATION_COLUMNS) -> None:
        self.columns = columns
        self.rows: list[tuple] = []
        self._chunks: list[np.ndarray] = []

    def append(self, row: tuple) -> None:
        """Record one iteration (values in ``self.columns`` order)."""
        self.rows.append(row)
        if len(self.rows) >= self.CHUNK:
            self.pack()

    def pack(self) -> None:
        """Pack the buffered rows into a float array (the engine appends to ``rows`` itself and
        calls this every ``CHUNK`` rows)."""
        self._chunks.append(np.array(self.rows, dtype=float))
        self.rows.clear()

    def __len__(self) -> int:
        return sum(len(c) for c in self._chunks) + len(self.rows)

    def __iter__(self):
        for chunk in self._chunks:
            yield from chunk
        yield from self.rows

    def frame(self) -> pd.DataFrame:
        """The rows as a DataFrame (count columns are integers); empties the log.

        Each packed chunk is dropped as soon as it is copied, so building the frame of a run of
        millions of iterations needs little more memory than the frame itself.
        """
        return pd.DataFrame(_fill([self])[1], copy=False)


def _fill(logs: list[IterationLog]) -> tuple[np.ndarray, dict]:
    """(each row's log index, column arrays) of ``logs`` one after another; empties them.

    A column some logs lack (a replica without a prefix cache) is 0 in their rows.
    """
    names = max((log.columns for log in logs), key=len, default=ITERATION_COLUMNS)
    total = sum(len(log) for log in logs)
    owner = np.empty(total, dtype=np.int64)
    columns = {col: np.zeros(total) for col in names}
    pos = 0
    for index, log in enumerate(logs):
        chunks = log._chunks + ([np.array(log.rows, dtype=float)] if log.rows else [])
        log._chunks, log.rows = [], []
        start = pos
        while chunks:
            chunk = chunks.pop(0)
            for j, col in enumerate(log.columns):
                columns[col][pos:pos + len(chunk)] = chunk[:, j]
            pos += len(chunk)
        owner[start:pos] = index
    for col in names:
        if col.startswith("num_") or col.startswith("kv_blocks_"):
            columns[col] = columns[col].astype(np.int64)
    return owner, columns


def concat_frames(logs: list[IterationLog], column: str = "replica") -> pd.DataFrame:
    """Several replicas' logs as one frame (replica after replica) with a leading ``column``
    holding each row's log index; empties the logs.

    Columns are allocated once and filled chunk by chunk, so the frame of a large cluster run
    needs little more memory than the frame itself (no per-replica frames, no concatenation).
    """
    owner, columns = _fill(logs)
    return pd.DataFrame({column: owner, **columns}, copy=False)
