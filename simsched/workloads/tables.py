"""Checking a request table's columns: each bad value raises ValueError naming row and column.

A request table (a DataFrame given to ``simulate``, or a closed-loop session table) is checked
column by column, vectorised; the first bad row is named as ``requests[i].column`` (``i`` its
position in the table) with its value. Nothing is coerced: a fraction in an integer column, a
string, a boolean or a value out of range is refused, never truncated or ignored.
"""

from __future__ import annotations

import numbers as _real_numbers

import numpy as np
import pandas as pd

INT64_MAX = 2**63 - 1
# The columns that give requests a prefix identity (see :func:`prefix_columns`).
PREFIX_COLUMNS = ("hash_ids", "prefix_group", "prefix_len", "session_id")


def reject_row(df: pd.DataFrame, column: str, bad: np.ndarray, what: str) -> None:
    """Raise ValueError naming the first ``bad`` row of ``column``: it must be ``what``."""
    i = int(np.argmax(bad))
    got = df[column].iloc[i]
    got = got.item() if isinstance(got, np.generic) else got
    raise ValueError(f"requests[{i}].{column} must be {what}, got {got!r}")


def numbers(df: pd.DataFrame, column: str, integer: bool, low: float,
            what: str | None = None, copy: bool = True) -> np.ndarray:
    """A numeric column as float64 (int64 if ``integer``); the first bad row raises ValueError
    naming row and field (``what`` it must be, by default said from the checks). With ``copy``
    False a column already of that type is returned in place (a view of the table's column: not
    to be written to).

    Rejected: non-numbers (strings too, even ``"1e3"``: the CLI's files are numbers, and a
    string here is a table read without its types), NaN and infinities, values below ``low``,
    booleans (``True`` is not a token count), and in integer columns fractions and values outside
    int64.
    """
    raw = df[column]
    bound = f" >= {low:g}" if low > -INT64_MAX else ""
    if what is None:
        what = (f"an integer{bound} within int64" if integer else f"a finite number{bound}")
    if raw.dtype == bool:
        reject_row(df, column, np.ones(len(raw), dtype=bool), what)
    if raw.dtype != object and raw.dtype.kind not in "iuf":
        # Text (pandas' str dtype), dates, categories: not numbers, whatever they spell.
        given = raw.notna().to_numpy()
        reject_row(df, column, given if given.any() else np.ones(len(raw), dtype=bool), what)
    if raw.dtype == object:
        items = raw.tolist()
        # bool is an int subclass: pandas would read True as 1. Strings would be parsed.
        flags = np.fromiter((v is not None and (isinstance(v, (bool, np.bool_))
                                                or not isinstance(v, _real_numbers.Real))
                             for v in items), bool, len(items))
        if flags.any():
            reject_row(df, column, flags, what)
        if integer:
            # Python ints beyond int64 would wrap or lose digits as floats: check them exactly.
            huge = np.fromiter((isinstance(v, int) and not -INT64_MAX - 1 <= v <= INT64_MAX
                                for v in items), bool, len(items))
            if huge.any():
                reject_row(df, column, huge, what)
    if integer and raw.dtype.kind in "iu":
        values = raw.to_numpy()
        bad = values < low
        if raw.dtype.kind == "u":
            bad |= values > INT64_MAX
        if bad.any():
            reject_row(df, column, bad, what)
        return values.astype(np.int64, copy=copy)
    if not copy and isinstance(raw.dtype, np.dtype) and raw.dtype.kind == "f":
        values = raw.to_numpy(dtype=float)          # NaN is NaN already: the same checks follow
    else:
        values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    bad = ~np.isfinite(values) | (values < low)
    if integer:
        # 2**63 is the first float above int64's range.
        bad |= (values != np.round(values)) | (np.abs(values) >= 2.0**63)
    if bad.any():
        reject_row(df, column, bad, what)
    return values.astype(np.int64) if integer else values


def _optional_integers(df: pd.DataFrame, column: str, low: int, missing: int,
                       what: str) -> np.ndarray:
    """An integer column whose missing values (None, NaN) read as ``missing``; every given value
    must be an integer >= ``low`` (ValueError naming the first bad row)."""
    raw = df[column]
    given = raw.notna().to_numpy()
    # Missing values stand in as ``low`` for the check (rows keep their positions).
    filled = df if given.all() else pd.DataFrame({column: raw.where(given, low)})
    values = numbers(filled, column, True, low, what)
    values[~given] = missing
    return values


def prefix_columns(df: pd.DataFrame) -> dict[str, np.ndarray]:
    """The checked prefix-identity columns of a request table, in table order.

    ``prefix_group``: an integer >= 0 naming a shared system prompt (-1 or missing: none);
    ``prefix_len``: its length in tokens, an integer >= 0, which a row with a group must give
    (missing: 0); ``session_id``: an integer >= 0 (-1 or missing: none). A ``prefix_len``
    column without ``prefix_group`` (or the reverse) is refused: it would be ignored. Returns the
    columns the table has, as int64 arrays with missing values filled in.
    """
    out: dict[str, np.ndarray] = {}
    has_group, has_len = "prefix_group" in df.columns, "prefix_len" in df.columns
    if has_group != has_len:
        given, lacking = ("prefix_group", "prefix_len") if has_group else \
            ("prefix_len", "prefix_group")
        raise ValueError(f"requests table has a {given} column but no {lacking} column: a "
                         "shared system prompt needs both (its group and its length in tokens)")
    if has_group:
        group = _optional_integers(df, "prefix_group", -1, -1,
                                   "an integer >= 0 (-1 or missing: no shared prefix)")
        length = _optional_integers(df, "prefix_len", 0, -1, "an integer >= 0 (tokens)")
        lacking = (group >= 0) & (length < 0)
        if lacking.any():
            reject_row(df, "prefix_len", lacking,
                       "given (an integer >= 0) where prefix_group is given")
        out["prefix_group"] = group
        out["prefix_len"] = np.maximum(length, 0)
    if "session_id" in df.columns:
        out["session_id"] = _optional_integers(df, "session_id", -1, -1,
                                               "an integer >= 0 (-1 or missing: none)")
    return out


def session_columns(df: pd.DataFrame) -> dict[str, np.ndarray]:
    """A closed-loop table's checked ``session_id`` (an integer >= 0 on every row) and
    ``think_time`` (a finite number of seconds >= 0 on every row), with :func:`prefix_columns`'
    other columns."""
    sessions = numbers(df, "session_id", True, 0,
                       "an integer >= 0 (every row of a closed-loop table, one with think_time, "
                       "belongs to a session)")
    think = numbers(df, "think_time", False, 0, "a finite number of seconds >= 0")
    out = prefix_columns(df.drop(columns="session_id"))
    out["session_id"], out["think_time"] = sessions, think
    return out


def adapter_column(df: pd.DataFrame) -> np.ndarray:
    """A request table's checked ``adapter`` column (LoRA adapter ids, int64): an integer >= 0
    names an adapter, -1 or missing the base model."""
    return _optional_integers(df, "adapter", -1, -1,
                              "an integer >= 0 (-1 or missing: the base model)")
