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
    float64, or int64 for counts), quiet decode runs kept compactly.

    The engine appends ``pack(*row)`` to ``values`` once per iteration, its values held in
    variables named as the columns, in their order (tests/test_iteration_log.py checks the
    engine's calls against :data:`ITERATION_COLUMNS` by name); one C call packs the row, where a
    growing array per column took a call per value and parsed each value's type on the way in
    (about five times the cost).

    A run of quiet decode steps (:mod:`simsched.engine.scheduler.quiet`) is logged by :meth:`add_run`: its
    first row is packed as any other, with ``num_prefill_tokens`` set to minus the number of
    steps after it, whose rows differ from the first only in ``started_at``, ``duration``,
    ``num_waiting`` and ``kv_blocks_used``; those go to ``runs``, one packed block per run
    (start times, durations, KV growths, and waiting counts only where some request waits:
    the first row's ``num_preempted`` is then -1). It replaces a packed row per step, a Python
    loop turn per decode step (most of a busy fleet's rows; a run's block is one C call). Every
    reader (:meth:`fill`, :meth:`columns_arrays`, iteration) expands the runs back into rows,
    so what comes out is the same rows in the same order.

    The frame's columns are filled from the end of the log backwards, a chunk at a time, and
    the buffer shrinks as they fill, so building them needs little more memory than the log
    itself.
    """

    def __init__(self, columns: tuple = ITERATION_COLUMNS) -> None:
        self.columns = columns
        self.dtype = np.dtype([(col, "<i8" if _is_count(col) else "<f8") for col in columns])
        self.pack = struct.Struct("<" + "".join("q" if _is_count(col) else "d"
                                                for col in columns)).pack
        self.values = bytearray()
        # The rows after each quiet run's first: a block of columns per run (see add_run).
        self.runs = bytearray()
        self.num_run_rows = 0
        self._tail = (0,) * (len(columns) - len(ITERATION_COLUMNS))

    def append(self, row: tuple) -> None:
        """Record one iteration (values in ``self.columns`` order; counts must be integers)."""
        if len(row) != len(self.columns):
            raise ValueError(f"an iteration row has {len(self.columns)} values "
                             f"({', '.join(self.columns)}), got {len(row)}")
        self.values += self.pack(*row)

    def add_run(self, started_at: list, duration: list, num_steps: int, num_decode_tokens: int,
                num_waiting, kv_blocks_used: int, kv_growth: list) -> None:
        """Record ``num_steps`` decode-only iterations of ``num_decode_tokens`` sequences each,
        nothing preempted or swapped: their start times and durations (the first ``num_steps``
        of each list), waiting requests (a list of ``num_steps``, or 0 for none), and KV blocks
        used before the first (``kv_blocks_used``) and taken by each (``kv_growth``,
        ``num_steps`` of them)."""
        k = num_steps - 1
        # A block with a waiting column says so in its first row (num_preempted -1).
        flag = -1 if num_waiting and k else 0
        self.values += self.pack(started_at[0], duration[0], -k, num_decode_tokens,
                                 num_decode_tokens, num_waiting[0] if num_waiting else 0,
                                 kv_blocks_used + kv_growth[0], flag, 0.0, *self._tail)
        if not k:
            return
        self.num_run_rows += k
        if flag:
            self.runs += _run_block(k, 4)(*started_at[1:num_steps], *duration[1:num_steps],
                                          *kv_growth[1:], *num_waiting[1:])
        else:
            # _run_block(k, 3), its packer looked up here: once per run
            pack = _BLOCKS3[k] if k < len(_BLOCKS3) else _run_block(k, 3)
            self.runs += pack(*started_at[1:num_steps], *duration[1:num_steps], *kv_growth[1:])

    @property
    def nbytes(self) -> int:
        """Bytes the log holds."""
        return len(self.values) + len(self.runs)

    def __len__(self) -> int:
        return len(self.values) // self.dtype.itemsize + self.num_run_rows

    def __iter__(self):
        """The rows as tuples, oldest first."""
        columns = self.columns_arrays(empty=False)
        return zip(*(columns[col].tolist() for col in self.columns))

    def fill(self, columns: dict, start: int = 0, empty: bool = True) -> int:
        """Move the rows into ``columns`` (arrays by column name, rows from ``start`` on) and
        empty the log (``empty``); return the number of rows."""
        size = self.dtype.itemsize
        values, runs = self.values, self.runs
        n = len(values) // size
        total = n + self.num_run_rows
        # From the end backwards; a chunk of packed rows expands to at most the longest run's
        # rows each, so chunks are shorter where there are runs.
        step = max(1, _CHUNK_ROWS // 16) if runs else _CHUNK_ROWS
        hi, out_hi, word_hi = n, start + total, len(runs) // 8
        while hi > 0:
            lo = max(0, hi - step)
            chunk = np.frombuffer(values, dtype=self.dtype, offset=lo * size, count=hi - lo)
            # Rows after each packed row (its quiet run) and their block's 8-byte words.
            after = np.maximum(-chunk["num_prefill_tokens"], 0)
            words = after * np.where(chunk["num_preempted"] < 0, 4, 3)
            word_lo = word_hi - int(words.sum())
            expanded = _expand(chunk, after, words, np.frombuffer(
                runs, dtype=np.uint8, offset=8 * word_lo, count=8 * (word_hi - word_lo)))
            num_after = int(after.sum())
            out_lo = out_hi - (hi - lo) - num_after
            for col in self.columns:
                columns[col][out_lo:out_hi] = expanded[col]
            del chunk, expanded
            if empty:
                del values[lo * size:]              # gives the memory back as the log empties
                del runs[8 * word_lo:]
                self.num_run_rows -= num_after
            hi, out_hi, word_hi = lo, out_lo, word_lo
        return total        # values is empty now, and still the one the engine appends to

    def columns_arrays(self, empty: bool = True) -> dict:
        """The columns as numpy arrays; empties the log (``empty``)."""
        columns = {col: np.empty(len(self), dtype=self.dtype[col]) for col in self.columns}
        self.fill(columns, empty=empty)
        return columns

    def frame(self) -> pd.DataFrame:
        """The rows as a DataFrame (count columns are integers); empties the log."""
        return pd.DataFrame(_fill([self])[1], copy=False)


def _expand(chunk: np.ndarray, after: np.ndarray, words: np.ndarray, runs: np.ndarray) -> dict:
    """Packed rows ``chunk`` as columns, each followed by its ``after`` rows of a quiet run,
    whose own values are the bytes ``runs``: a block of ``words`` 8-byte values per run (start
    times, durations, KV growths, then waiting counts if its first row's ``num_preempted`` is
    -1; see :meth:`IterationLog.add_run`)."""
    names = chunk.dtype.names
    if not len(runs):
        return {col: chunk[col] for col in names}
    # Each packed row repeated over its run, then the runs' own values where they differ.
    counts = after + 1
    rest = np.ones(int(counts.sum()), dtype=bool)
    rest[np.cumsum(counts) - counts] = False        # where each packed row goes
    first = np.cumsum(after) - after                # each run's first row among the others
    k = np.repeat(after, after)                     # each other row's run length, less one
    at = np.arange(len(k)) - np.repeat(first, after) + np.repeat(np.cumsum(words) - words, after)
    floats, ints = runs.view(np.float64), runs.view(np.int64)
    growth = np.cumsum(ints[at + 2 * k])            # blocks taken, summed within each run
    before = np.concatenate(([0], growth))[first]   # ... and before each run
    waiting = np.zeros(len(k), dtype=np.int64)
    flagged = np.repeat(chunk["num_preempted"] < 0, after)
    waiting[flagged] = ints[(at + 3 * k)[flagged]]
    own = {"started_at": floats[at], "duration": floats[at + k], "num_waiting": waiting,
           "kv_blocks_used": growth - np.repeat(before, after)}
    out = {}
    for col in names:
        column = np.repeat(chunk[col], counts)
        if col == "num_prefill_tokens" or col == "num_preempted":
            np.maximum(column, 0, out=column)
        elif col == "kv_blocks_used":
            column[rest] += own[col]
        elif col in own:
            column[rest] = own[col]
        out[col] = column
    return out


def _run_block(k: int, width: int):
    """The packer of a run block of ``k`` rows: ``k`` start times, ``k`` durations, ``k`` KV
    growths, and (``width`` 4) ``k`` waiting counts."""
    blocks = _BLOCKS3 if width == 3 else _BLOCKS4
    if k >= len(blocks):
        blocks.extend(struct.Struct(f"<{2 * n}d{(width - 2) * n}q").pack
                      for n in range(len(blocks), k + 1))
    return blocks[k]


_BLOCKS3: list = []
_BLOCKS4: list = []


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


def _decode_ends(columns) -> tuple[np.ndarray, np.ndarray]:
    """(which rows decode, their end times) of iteration ``columns`` (a frame or arrays by
    name): a step ends when its iteration does, ``started_at + duration``, the same float sum
    the clock made."""
    decodes = np.asarray(columns["num_decode_tokens"]) > 0
    return decodes, (np.asarray(columns["started_at"]) + np.asarray(columns["duration"]))[decodes]


def log_step_ends(log: IterationLog) -> np.ndarray:
    """One replica's decode-step end times so far, read from its live ``log`` (left as it
    is), indexed by step as :func:`decode_step_ends` gives them at the end of a run."""
    return np.concatenate(([np.nan], _decode_ends(log.columns_arrays(empty=False))[1]))


def decode_step_ends(iterations: pd.DataFrame, num_replicas: int = 1) -> list[np.ndarray]:
    """Each replica's decode-step end times, indexed by step (index 0, before the first step,
    is NaN), from the iteration frame (``replica`` column when there are several).

    A replica's decode steps are its iterations with decodes, in order.
    """
    decodes, ends = _decode_ends(iterations)
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
