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
        total = len(self)
        names = self.columns
        columns = {col: np.empty(total) for col in names}
        chunks = self._chunks + ([np.array(self.rows, dtype=float)] if self.rows else [])
        self._chunks, self.rows = [], []
        pos = 0
        while chunks:
            chunk = chunks.pop(0)
            for j, col in enumerate(names):
                columns[col][pos:pos + len(chunk)] = chunk[:, j]
            pos += len(chunk)
        for col in names:
            if col.startswith("num_") or col.startswith("kv_blocks_"):
                columns[col] = columns[col].astype(np.int64)
        return pd.DataFrame(columns, copy=False)
