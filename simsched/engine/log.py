"""The per-iteration log a replica keeps while it runs (one growing array per column)."""

from __future__ import annotations

from array import array

import numpy as np
import pandas as pd

ITERATION_COLUMNS = ("started_at", "duration", "num_prefill_tokens", "num_decode_tokens",
                     "num_seqs", "num_waiting", "kv_blocks_used", "num_preempted", "swap_time")
# With a prefix cache the log has three more columns: prompt tokens the iteration's admissions
# took from the cache, cached blocks its allocations evicted, and cached blocks nobody holds
# (evictable, free for allocation; kv_blocks_used then counts a shared block once).
PREFIX_COLUMNS = ("num_cached_tokens", "num_evicted_blocks", "kv_blocks_cached")


def _is_count(col: str) -> bool:
    return col.startswith("num_") or col.startswith("kv_blocks_")


class IterationLog:
    """One row per GPU iteration, kept as one growing array per column (8 bytes per value:
    float64, or int64 for counts), which the frame then uses without a copy.

    The engine appends to the columns itself (``arrays``, in ``columns`` order): one append per
    value costs about what building a row tuple does, and nothing is buffered or re-read later.
    """

    def __init__(self, columns: tuple = ITERATION_COLUMNS) -> None:
        self.columns = columns
        self.arrays = [array("q" if _is_count(col) else "d") for col in columns]

    def append(self, row: tuple) -> None:
        """Record one iteration (values in ``self.columns`` order; counts must be integers)."""
        for arr, value in zip(self.arrays, row):
            arr.append(value)

    def __len__(self) -> int:
        return len(self.arrays[0]) if self.arrays else 0

    def __iter__(self):
        return zip(*self.arrays)

    def columns_arrays(self) -> dict:
        """The columns as numpy arrays (views of this log's storage); empties the log."""
        out = {col: np.frombuffer(arr, dtype=np.int64 if arr.typecode == "q" else float)
               for col, arr in zip(self.columns, self.arrays)}
        self.arrays = [array(arr.typecode) for arr in self.arrays]
        return out

    def frame(self) -> pd.DataFrame:
        """The rows as a DataFrame (count columns are integers); empties the log."""
        return pd.DataFrame(_fill([self])[1], copy=False)


def _fill(logs: list[IterationLog]) -> tuple[np.ndarray, dict]:
    """(each row's log index, column arrays) of ``logs`` one after another; empties them.

    A column some logs lack (a replica without a prefix cache) is 0 in their rows. One log's
    columns are its own arrays (no copy).
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
        own = log.columns_arrays()
        n = len(next(iter(own.values())))
        for col, values in own.items():
            columns[col][pos:pos + n] = values
        del own
        owner[pos:pos + n] = index
        pos += n
    return owner, columns


def concat_frames(logs: list[IterationLog], column: str = "replica") -> pd.DataFrame:
    """Several replicas' logs as one frame (replica after replica) with a leading ``column``
    holding each row's log index; empties the logs.

    Columns are allocated once and filled chunk by chunk, so the frame of a large cluster run
    needs little more memory than the frame itself (no per-replica frames, no concatenation).
    """
    owner, columns = _fill(logs)
    return pd.DataFrame({column: owner, **columns}, copy=False)
