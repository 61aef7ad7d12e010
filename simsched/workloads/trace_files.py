"""Reading a trace file's table and checking its values, with errors that name file and line.

The low-level half of :mod:`simsched.workloads.traces`: the formats' columns, reading CSV or JSONL
(gzipped or not) into a raw table with each row's line number, recognising the format from the
header, and parsing token counts and times column by column. Every bad value raises
:class:`TraceFormatError` naming the file, the line of the first bad row and how many rows are bad.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

FORMAT_COLUMNS = {  # format -> (time column, prompt column, output column)
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "generic": ("arrival_at", "num_prompt_tokens", "num_output_tokens"),
    "sharegpt": (None, "num_prefill_tokens", "num_decode_tokens"),
    "mooncake": ("timestamp", "input_length", "output_length"),
}
EXPECTED = {  # format -> the columns it expects, as error messages state them
    "azure": "TIMESTAMP, ContextTokens, GeneratedTokens",
    "generic": "arrival_at, num_prompt_tokens, num_output_tokens[, priority][, tenant]",
    "sharegpt": "num_prefill_tokens, num_decode_tokens (lengths only)",
    "mooncake": "timestamp (ms), input_length, output_length, hash_ids (JSONL)",
}


class TraceFormatError(ValueError):
    """A trace file is malformed; the message names the file and the line."""


class TraceWarning(UserWarning):
    """A trace was changed while loading (sorted, prompts clipped or dropped)."""


def fail(path, line, message: str, num_bad: int = 1) -> None:
    """Raise :class:`TraceFormatError` naming ``path``, ``line`` (if known) and the bad rows."""
    more = f" ({num_bad} bad rows in total)" if num_bad > 1 else ""
    where = f"{path}, line {line}" if line is not None else str(path)
    raise TraceFormatError(f"{where}: {message}{more}")


def expected_columns(fmt: str) -> str:
    """What format ``fmt`` expects, for error messages."""
    return f"{fmt} format, expected columns: {EXPECTED[fmt]}"


def _all_formats() -> str:
    return "; ".join(f"{fmt}: {cols}" for fmt, cols in EXPECTED.items())


def _lines(path: Path) -> list[bytes]:
    """The file's raw lines (decompressed), for locating errors only."""
    opener = gzip.open if path.suffix.lower() == ".gz" else open
    with opener(path, "rb") as f:
        return f.read().split(b"\n")


def _not_utf8(path: Path, exc: UnicodeDecodeError) -> None:
    for number, raw in enumerate(_lines(path), 1):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as bad:
            fail(path, number, f"not UTF-8 text (byte 0x{raw[bad.start]:02x} at column "
                  f"{bad.start + 1}); save the trace as UTF-8")
    fail(path, None, f"not UTF-8 text ({exc.reason}); save the trace as UTF-8")


def _field_counts(path: Path) -> None:
    """Name the first row whose field count differs upwards from the header's (error path)."""
    text = io.StringIO(b"\n".join(_lines(path)).decode("utf-8"))
    reader = csv.reader(text)
    header = [c.strip() for c in next(reader, [])]
    fmt = next((f for f, cols in FORMAT_COLUMNS.items()
                if all(c in header for c in cols if c)), None)
    expected = f" [{expected_columns(fmt)}]" if fmt else ""
    for row in reader:
        if len(row) > len(header):
            fail(path, reader.line_num, f"{len(row)} fields, but the header has {len(header)} "
                  f"({', '.join(header)}){expected}")


def _is_jsonl(path: Path) -> bool:
    suffixes = [s.lower() for s in path.suffixes if s.lower() != ".gz"]
    return bool(suffixes) and suffixes[-1] in (".jsonl", ".json", ".ndjson")


def read_table(path: Path) -> tuple[pd.DataFrame, np.ndarray]:
    """The raw table and the file line number of each of its rows (blank lines skipped)."""
    if _is_jsonl(path):
        opener = gzip.open if path.suffix.lower() == ".gz" else open
        try:
            with opener(path, "rt", encoding="utf-8") as f:
                text = f.read().splitlines()
        except UnicodeDecodeError as exc:
            _not_utf8(path, exc)
        lines = np.array([i + 1 for i, s in enumerate(text) if s.strip()], dtype=np.int64)
        body = "\n".join(s for s in text if s.strip())
        try:
            table = pd.read_json(io.StringIO(body), lines=True, dtype=False) if body else \
                pd.DataFrame()
        except ValueError:
            # Error path only: find the first line json cannot parse.
            for number, s in zip(lines, (s for s in text if s.strip())):
                try:
                    if not isinstance(json.loads(s), dict):
                        fail(path, number, "expected a JSON object")
                except json.JSONDecodeError as exc:
                    fail(path, number, f"invalid JSON ({exc.msg})")
            raise
        return table, lines
    try:
        # Numeric columns parse in C; only a column with a bad value falls back to strings.
        # index_col=False: a first row with an extra field must not become an index column.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", pd.errors.ParserWarning)
            table = pd.read_csv(path, dtype={"tenant": str, "TIMESTAMP": str},
                                skip_blank_lines=False, index_col=False, encoding="utf-8")
        if any(issubclass(w.category, pd.errors.ParserWarning) for w in caught):
            _field_counts(path)
    except UnicodeDecodeError as exc:
        _not_utf8(path, exc)
    except pd.errors.ParserError as exc:
        _field_counts(path)
        raise TraceFormatError(f"{path}: malformed CSV: {str(exc).strip()}") from None
    except pd.errors.EmptyDataError:
        raise TraceFormatError(f"{path}: empty file (expected a header line)") from None
    table.columns = [str(c).strip() for c in table.columns]
    blank = table.isna().all(axis=1).to_numpy()
    lines = np.arange(2, len(table) + 2, dtype=np.int64)[~blank]
    return table[~blank].reset_index(drop=True), lines


def detect_format(path: Path, columns, require_times: bool) -> str:
    """The format whose columns the header has (or an error naming the closest one)."""
    have = set(columns)
    missing = {}
    for fmt, (t, p, o) in FORMAT_COLUMNS.items():
        need = [c for c in (t, p, o) if c is not None and (c != t or require_times)]
        missing[fmt] = [c for c in need if c not in have]
        if not missing[fmt]:
            if require_times and t is None:
                fail(path, 1, f"has lengths only ({p}, {o}), no timestamps to replay")
            return fmt
    # Blame a format only if the header has some of its columns.
    known = {fmt: len([c for c in FORMAT_COLUMNS[fmt] if c is not None]) - len(missing[fmt])
             for fmt in FORMAT_COLUMNS}
    closest = max(known, key=lambda f: known[f])
    if known[closest] > 0:
        fail(path, 1, f"missing column(s) {missing[closest]} for the {closest} format; header "
              f"has {list(columns)} ({expected_columns(closest)})")
    separator = next((sep for sep in (";", "\t", "|") if any(sep in str(c) for c in columns)),
                     None)
    hint = (f"; the header contains {separator!r}: traces are comma-separated" if separator
            else "")
    fail(path, 1, f"unrecognised header {list(columns)}{hint}; expected the columns of one "
          f"format: {_all_formats()}")
    raise AssertionError  # unreachable


def fail_first_bad(path, lines: np.ndarray, bad: np.ndarray, raw: pd.Series,
                   message: str) -> None:
    """If any row is ``bad``, raise naming the first one's line and value and the count."""
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        value = raw.iloc[i]
        value = value.item() if isinstance(value, np.generic) else value
        fail(path, int(lines[i]), f"{message}, got {value!r}", int(bad.sum()))


def token_column(path, table: pd.DataFrame, lines, column: str, name: str) -> np.ndarray:
    """Token counts of ``column`` (integers >= 1) as int64."""
    raw = table[column]
    values = (raw if pd.api.types.is_numeric_dtype(raw) else
              pd.to_numeric(raw, errors="coerce")).to_numpy(dtype=float)
    missing = raw.isna().to_numpy()
    fail_first_bad(path, lines, missing, raw, f"missing value for {column} ({name})")
    bad = ~np.isfinite(values) | (values < 1) | (values != np.floor(values))
    fail_first_bad(path, lines, bad, raw, f"{column} ({name}) must be an integer >= 1")
    return values.astype(np.int64)


def time_column(path, table: pd.DataFrame, lines, column: str, fmt: str) -> np.ndarray:
    """Arrival times of ``column`` in seconds (Azure's timestamps relative to the first)."""
    raw = table[column]
    fail_first_bad(path, lines, raw.isna().to_numpy(), raw, f"missing value for {column}")
    if fmt == "azure":
        stamps = pd.to_datetime(raw, format="ISO8601", errors="coerce")
        fail_first_bad(path, lines, stamps.isna().to_numpy(), raw, f"unparseable timestamp in {column}")
        ns = stamps.to_numpy().astype("datetime64[ns]").astype(np.int64)
        return (ns - ns.min()) / 1e9
    values = (raw if pd.api.types.is_numeric_dtype(raw) else
              pd.to_numeric(raw, errors="coerce")).to_numpy(dtype=float)
    bad = ~np.isfinite(values) | (values < 0)
    unit = "milliseconds" if fmt == "mooncake" else "seconds"
    fail_first_bad(path, lines, bad, raw, f"{column} must be a finite number of {unit} >= 0")
    return values / 1000.0 if fmt == "mooncake" else values
