"""Reading request traces: the Azure 2023 format, a generic CSV/JSONL format, and length files.

Formats, recognised from the header (CSV) or field names (JSONL, one object per line):

* **azure**: ``TIMESTAMP, ContextTokens, GeneratedTokens`` as published in Azure's LLM inference
  traces (timestamps like ``2023-11-16 18:17:03.9799600``). Times are made relative to the first
  request.
* **generic**: ``arrival_at`` (seconds, >= 0, kept as given), ``num_prompt_tokens``,
  ``num_output_tokens``, optional ``priority`` (integer), ``tenant`` (string), ``hash_ids``,
  ``session_id`` (integer >= 0) and ``think_time`` (seconds >= 0; see below).
* **mooncake**: ``timestamp`` (milliseconds from the start), ``input_length``,
  ``output_length``, ``hash_ids`` (JSONL), as in Mooncake's released traces.

``hash_ids`` (any format; a JSON list, or in CSV a string such as ``"[1, 2, 3]"`` or ``"1 2 3"``)
name the prompt's blocks of ``hash_block_size`` tokens (512 in Mooncake's traces; the last block
may be partial): equal ids at equal positions mean equal tokens, which a prefix cache can share.
A file with ``session_id`` and ``think_time`` columns is a closed-loop conversation: rows of one
session are its turns in file order, and each turn after the first is sent ``think_time`` seconds
after the previous one finished (its ``arrival_at`` is then ignored).
* **lengths**: ``num_prefill_tokens, num_decode_tokens`` (the bundled ShareGPT length pairs) or a
  generic file without ``arrival_at``: usable for lengths only.

Files may be gzipped (``.gz``) and must be UTF-8 text. Loading is vectorised; a bad value raises
:class:`TraceFormatError` naming the file, the line of the first bad row, how many rows are bad,
the format detected and the columns it expects (an unrecognised header lists every format).
Unsorted timestamps are sorted and reported; long prompts are clipped, dropped or refused per
:func:`apply_long_prompt_policy`, with the count reported in a :class:`LoadReport` and a warning.
"""

from __future__ import annotations

import csv
import functools
import gzip
import io
import json
import math
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from simsched.workloads import arrivals

DATA_DIR = Path(__file__).parent / "data" / "traces"
BUNDLED = {
    "azure-code": DATA_DIR / "azure-llm-2023" / "AzureLLMInferenceTrace_code.csv.gz",
    "azure-conv": DATA_DIR / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv.gz",
    "sharegpt": DATA_DIR / "sharegpt-lengths" / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv.gz",
    "mooncake": DATA_DIR / "mooncake-synthetic" / "synthetic_trace.jsonl.gz",
}
LONG_PROMPT_POLICIES = ("clip", "drop", "error")
_COLUMNS = {  # format -> (time column, prompt column, output column)
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


@dataclass(frozen=True)
class LoadReport:
    """What loading a trace did: rows read, sorted, windowed, long prompts handled, returned."""

    source: str
    format: str = "generic"
    num_rows: int = 0
    num_unsorted: int = 0
    num_in_window: int = 0
    max_prompt_tokens: int | None = None
    long_prompt_policy: str = "error"
    num_long_prompts: int = 0
    num_clipped: int = 0
    num_dropped: int = 0
    num_returned: int = 0
    speedup: float = 1.0

    def __str__(self) -> str:
        parts = [f"{self.source} ({self.format}): {self.num_rows} rows read"]
        if self.num_unsorted:
            parts.append(f"{self.num_unsorted} out of order (sorted)")
        if self.num_in_window != self.num_rows:
            parts.append(f"{self.num_in_window} in window")
        if self.num_long_prompts:
            parts.append(f"{self.num_long_prompts} prompts > {self.max_prompt_tokens} tokens "
                         f"({self.num_clipped} clipped, {self.num_dropped} dropped)")
        parts.append(f"{self.num_returned} returned")
        if self.speedup != 1.0:
            parts.append(f"time compressed x{self.speedup:.4g}")
        return ", ".join(parts)


def bundled_path(name: str) -> Path:
    """Path of a bundled trace: ``azure-code``, ``azure-conv``, ``sharegpt`` or ``mooncake``."""
    if name not in BUNDLED:
        raise ValueError(f"no bundled trace {name!r}; bundled: {sorted(BUNDLED)}")
    return BUNDLED[name]


def _fail(path, line, message: str, num_bad: int = 1) -> None:
    more = f" ({num_bad} bad rows in total)" if num_bad > 1 else ""
    where = f"{path}, line {line}" if line is not None else str(path)
    raise TraceFormatError(f"{where}: {message}{more}")


def _expected(fmt: str) -> str:
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
            _fail(path, number, f"not UTF-8 text (byte 0x{raw[bad.start]:02x} at column "
                  f"{bad.start + 1}); save the trace as UTF-8")
    _fail(path, None, f"not UTF-8 text ({exc.reason}); save the trace as UTF-8")


def _field_counts(path: Path) -> None:
    """Name the first row whose field count differs upwards from the header's (error path)."""
    text = io.StringIO(b"\n".join(_lines(path)).decode("utf-8"))
    reader = csv.reader(text)
    header = [c.strip() for c in next(reader, [])]
    fmt = next((f for f, cols in _COLUMNS.items() if all(c in header for c in cols if c)), None)
    expected = f" [{_expected(fmt)}]" if fmt else ""
    for row in reader:
        if len(row) > len(header):
            _fail(path, reader.line_num, f"{len(row)} fields, but the header has {len(header)} "
                  f"({', '.join(header)}){expected}")


def _is_jsonl(path: Path) -> bool:
    suffixes = [s.lower() for s in path.suffixes if s.lower() != ".gz"]
    return bool(suffixes) and suffixes[-1] in (".jsonl", ".json", ".ndjson")


def _read_table(path: Path) -> tuple[pd.DataFrame, np.ndarray]:
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
                        _fail(path, number, "expected a JSON object")
                except json.JSONDecodeError as exc:
                    _fail(path, number, f"invalid JSON ({exc.msg})")
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


def _detect(path: Path, columns, require_times: bool) -> str:
    have = set(columns)
    missing = {}
    for fmt, (t, p, o) in _COLUMNS.items():
        need = [c for c in (t, p, o) if c is not None and (c != t or require_times)]
        missing[fmt] = [c for c in need if c not in have]
        if not missing[fmt]:
            if require_times and t is None:
                _fail(path, 1, f"has lengths only ({p}, {o}), no timestamps to replay")
            return fmt
    # Blame a format only if the header has some of its columns.
    known = {fmt: len([c for c in _COLUMNS[fmt] if c is not None]) - len(missing[fmt])
             for fmt in _COLUMNS}
    closest = max(known, key=lambda f: known[f])
    if known[closest] > 0:
        _fail(path, 1, f"missing column(s) {missing[closest]} for the {closest} format; header "
              f"has {list(columns)} ({_expected(closest)})")
    separator = next((sep for sep in (";", "\t", "|") if any(sep in str(c) for c in columns)),
                     None)
    hint = (f"; the header contains {separator!r}: traces are comma-separated" if separator
            else "")
    _fail(path, 1, f"unrecognised header {list(columns)}{hint}; expected the columns of one "
          f"format: {_all_formats()}")
    raise AssertionError  # unreachable


def _first_bad(path, lines: np.ndarray, bad: np.ndarray, raw: pd.Series, message: str) -> None:
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        value = raw.iloc[i]
        value = value.item() if isinstance(value, np.generic) else value
        _fail(path, int(lines[i]), f"{message}, got {value!r}", int(bad.sum()))


def _tokens(path, table: pd.DataFrame, lines, column: str, name: str) -> np.ndarray:
    raw = table[column]
    values = (raw if pd.api.types.is_numeric_dtype(raw) else
              pd.to_numeric(raw, errors="coerce")).to_numpy(dtype=float)
    missing = raw.isna().to_numpy()
    _first_bad(path, lines, missing, raw, f"missing value for {column} ({name})")
    bad = ~np.isfinite(values) | (values < 1) | (values != np.floor(values))
    _first_bad(path, lines, bad, raw, f"{column} ({name}) must be an integer >= 1")
    return values.astype(np.int64)


def _times(path, table: pd.DataFrame, lines, column: str, fmt: str) -> np.ndarray:
    raw = table[column]
    _first_bad(path, lines, raw.isna().to_numpy(), raw, f"missing value for {column}")
    if fmt == "azure":
        stamps = pd.to_datetime(raw, format="ISO8601", errors="coerce")
        _first_bad(path, lines, stamps.isna().to_numpy(), raw, f"unparseable timestamp in {column}")
        ns = stamps.to_numpy().astype("datetime64[ns]").astype(np.int64)
        return (ns - ns.min()) / 1e9
    values = (raw if pd.api.types.is_numeric_dtype(raw) else
              pd.to_numeric(raw, errors="coerce")).to_numpy(dtype=float)
    bad = ~np.isfinite(values) | (values < 0)
    unit = "milliseconds" if fmt == "mooncake" else "seconds"
    _first_bad(path, lines, bad, raw, f"{column} must be a finite number of {unit} >= 0")
    return values / 1000.0 if fmt == "mooncake" else values


def parse_hash_ids(value):
    """One row's hash ids (a list, tuple, array or string) as a tuple of ints >= 0; None if bad."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = json.loads(text) if text.startswith("[") else text.replace(";", " ").split()
        except json.JSONDecodeError:
            return None
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not value:
        return None
    out = []
    for v in value:
        try:
            i = int(v)
        except (TypeError, ValueError):
            return None
        if i < 0 or isinstance(v, bool) or (isinstance(v, float) and v != i):
            return None
        out.append(i)
    return tuple(out)


def _optional_columns(path, table: pd.DataFrame, lines, out: pd.DataFrame) -> None:
    """Parse ``hash_ids``, ``session_id`` and ``think_time`` into ``out`` when the file has them."""
    if "hash_ids" in table.columns:
        raw = table["hash_ids"]
        ids = [parse_hash_ids(v) for v in raw.tolist()]
        bad = np.array([i is None for i in ids])
        _first_bad(path, lines, bad, raw, "hash_ids must be a non-empty list of integers >= 0")
        out["hash_ids"] = pd.Series(ids, dtype=object)
    for column, integer in (("session_id", True), ("think_time", False)):
        if column not in table.columns:
            continue
        raw = table[column]
        values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float)
        given = raw.notna().to_numpy()
        bad = given & (~np.isfinite(values) | (values < 0))
        if integer:
            bad |= given & (values != np.floor(values))
        what = "an integer >= 0" if integer else "a number of seconds >= 0"
        _first_bad(path, lines, bad, raw, f"{column} must be {what}")
        out[column] = (np.where(given, values, -1).astype(np.int64) if integer
                       else np.where(given, values, 0.0))


def hash_segments(hash_ids, num_tokens: int, block_tokens: int) -> tuple:
    """Prompt segments ``((hash_id, tokens), ...)`` of a prompt of ``num_tokens`` tokens.

    Each id names one block of ``block_tokens`` tokens, the last one partial; ids beyond the
    prompt are ignored. Raises ValueError if there are too few ids to cover the prompt.
    """
    need = -(-num_tokens // block_tokens)
    if len(hash_ids) < need:
        raise ValueError(f"{len(hash_ids)} hash_ids cover {len(hash_ids) * block_tokens} tokens "
                         f"of blocks of {block_tokens}, the prompt has {num_tokens}")
    last = num_tokens - (need - 1) * block_tokens
    return tuple((h, block_tokens) for h in hash_ids[:need - 1]) + ((hash_ids[need - 1], last),)


def merged_hash_segments(hash_ids, prompts, block_tokens: int) -> list:
    """:func:`hash_segments` of every row, with trace blocks merged where the data never branch.

    If every prompt that continues past a chain of blocks continues with the same next block,
    the two are one segment (the first block's id, the summed length): two prompts then still
    share exactly the tokens they shared before (a radix tree's path compression, done once for
    the whole table), and a prefix cache tracks a handful of segments per prompt instead of one
    per 512 tokens. Rows without ids (None) give None.
    """
    multi = object()
    follows: dict = {}
    cut = []
    for ids, p in zip(hash_ids, prompts):
        if ids is None:
            cut.append(None)
            continue
        need = -(-int(p) // block_tokens)
        if len(ids) < need:
            raise ValueError(f"{len(ids)} hash_ids cover {len(ids) * block_tokens} tokens of "
                             f"blocks of {block_tokens}, the prompt has {p}")
        ids = ids[:need]
        cut.append(ids)
        key = 0
        for t in range(need - 1):
            key = hash((key, ids[t]))
            nxt = ids[t + 1]
            if follows.setdefault(key, nxt) != nxt:
                follows[key] = multi
    out = []
    for ids, p in zip(cut, prompts):
        if ids is None:
            out.append(None)
            continue
        segments = []
        head, length, key = ids[0], 0, 0
        last = len(ids) - 1
        for t, h in enumerate(ids):
            length += block_tokens
            key = hash((key, h))
            if t < last and follows[key] is multi:
                segments.append((head, length))
                head, length = ids[t + 1], 0
        segments.append((head, length - (last + 1) * block_tokens + int(p)))
        out.append(tuple(segments))
    return out


def check_hash_ids(table: pd.DataFrame, block_tokens: int, source) -> None:
    """Raise ValueError naming the first row whose ``hash_ids`` do not match its prompt length.

    A prompt of ``n`` tokens needs exactly ``ceil(n / block_tokens)`` ids (fewer cannot cover it;
    more mean a wrong ``hash_block_size``).
    """
    if "hash_ids" not in table.columns or table.empty:
        return
    have = np.fromiter((len(h) for h in table["hash_ids"]), dtype=np.int64, count=len(table))
    need = -(-table["num_prompt_tokens"].to_numpy() // block_tokens)
    bad = have != need
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        where = (f"line {table['line'].iloc[i]}" if "line" in table.columns else f"row {i}")
        raise TraceFormatError(
            f"{source}, {where}: {have[i]} hash_ids for a {table['num_prompt_tokens'].iloc[i]}-"
            f"token prompt; blocks of hash_block_size={block_tokens} tokens need {need[i]} "
            f"({int(bad.sum())} rows disagree)")


def _read(path: Path, require_times: bool) -> tuple[pd.DataFrame, LoadReport]:
    table, lines = _read_table(path)
    if table.empty:
        _fail(path, None, "no requests in the file")
    fmt = _detect(path, table.columns, require_times)
    try:
        return _parse(path, table, lines, fmt)
    except TraceFormatError as exc:
        raise TraceFormatError(f"{exc} [{_expected(fmt)}]") from None


def _parse(path: Path, table: pd.DataFrame, lines: np.ndarray,
           fmt: str) -> tuple[pd.DataFrame, LoadReport]:
    t_col, p_col, o_col = _COLUMNS[fmt]
    out = pd.DataFrame({
        "num_prompt_tokens": _tokens(path, table, lines, p_col, "prompt"),
        "num_output_tokens": _tokens(path, table, lines, o_col, "output"),
    })
    if t_col is not None and t_col in table.columns:
        out.insert(0, "arrival_at", _times(path, table, lines, t_col, fmt))
    else:
        out.insert(0, "arrival_at", np.nan)
    out["priority"] = 0
    if "priority" in table.columns:
        raw = table["priority"]
        values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float)
        given = raw.notna().to_numpy()
        bad = given & (~np.isfinite(values) | (values != np.floor(values)))
        _first_bad(path, lines, bad, raw, "priority must be an integer")
        out["priority"] = np.where(given, values, 0).astype(np.int64)
    out["tenant"] = None
    if "tenant" in table.columns:
        tenant = table["tenant"].astype(object)
        given = tenant.notna()
        tenant = tenant.where(given, None)
        tenant[given] = tenant[given].astype(str)
        out["tenant"] = pd.Series(tenant.to_numpy(dtype=object), dtype=object)
    _optional_columns(path, table, lines, out)
    out["line"] = lines
    num_unsorted = 0
    if out["arrival_at"].notna().all():
        t = out["arrival_at"].to_numpy()
        num_unsorted = int((np.diff(t) < 0).sum())
        if num_unsorted:
            out = out.iloc[np.argsort(t, kind="stable")].reset_index(drop=True)
    report = LoadReport(source=str(path), format=fmt, num_rows=len(out),
                        num_unsorted=num_unsorted, num_in_window=len(out), num_returned=len(out))
    return out, report


@functools.lru_cache(maxsize=16)
def _read_cached(path: str, mtime_ns: int, size: int, require_times: bool):
    return _read(Path(path), require_times)


def read_trace(path, require_times: bool = True) -> tuple[pd.DataFrame, LoadReport]:
    """Read and validate a whole trace file (cached by path and modification time).

    Returns the request table (``REQUEST_COLUMNS`` plus ``line``, the file line of each row,
    sorted by arrival; ``arrival_at`` is NaN for lengths-only files) and its :class:`LoadReport`.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trace file not found: {path}")
    stat = path.stat()
    table, report = _read_cached(str(path.resolve()), stat.st_mtime_ns, stat.st_size,
                                 require_times)
    report = replace(report, source=str(path))
    if report.num_unsorted:
        warnings.warn(f"{path}: {report.num_unsorted} timestamps out of order; sorted by arrival",
                      TraceWarning, stacklevel=3)
    return table.copy(), report


def apply_long_prompt_policy(requests: pd.DataFrame, max_prompt_tokens: int | None,
                             policy: str, source: str,
                             max_total_tokens: int | None = None,
                             hash_block_size: int | None = None) -> tuple[pd.DataFrame, dict]:
    """Clip, drop or refuse requests whose prompt exceeds ``max_prompt_tokens`` or whose prompt
    plus output exceeds ``max_total_tokens`` (a model's context length).

    Clipping shortens the prompt so that both limits hold (the output too, if the output alone
    leaves no room for a one-token prompt), and cuts ``hash_ids`` to the blocks (of
    ``hash_block_size`` tokens) that remain. Returns the new table and the counts
    ``num_long_prompts`` (requests over a limit), ``num_clipped``, ``num_dropped``. Never
    silent: any affected request triggers a :class:`TraceWarning`, and ``error`` raises a
    ``ValueError`` naming the source and the first offending line (or request index).
    """
    if policy not in LONG_PROMPT_POLICIES:
        raise ValueError(f"long_prompt_policy must be one of {list(LONG_PROMPT_POLICIES)}, "
                         f"got {policy!r}")
    counts = {"num_long_prompts": 0, "num_clipped": 0, "num_dropped": 0}
    if (max_prompt_tokens is None and max_total_tokens is None) or requests.empty:
        return requests, counts
    prompt = requests["num_prompt_tokens"].to_numpy()
    output = requests["num_output_tokens"].to_numpy()
    long = np.zeros(len(requests), dtype=bool)
    if max_prompt_tokens is not None:
        long |= prompt > max_prompt_tokens
    if max_total_tokens is not None:
        long |= prompt + output > max_total_tokens
    num_long = int(long.sum())
    counts["num_long_prompts"] = num_long
    if not num_long:
        return requests, counts
    i = int(np.flatnonzero(long)[0])
    where = (f"line {requests['line'].iloc[i]}" if "line" in requests.columns
             else f"request {i}")
    if max_total_tokens is None:
        message = (f"{source}: {num_long} prompt(s) longer than max_prompt_tokens="
                   f"{max_prompt_tokens} (first at {where}: {prompt[i]} tokens)")
    else:
        limits = (f"max_prompt_tokens={max_prompt_tokens} or " if max_prompt_tokens else "")
        message = (f"{source}: {num_long} request(s) over {limits}prompt + output > "
                   f"{max_total_tokens} tokens (first at {where}: {prompt[i]} + {output[i]} "
                   "tokens)")
    if policy == "error":
        raise ValueError(message + "; set long_prompt_policy='clip' or 'drop' to load anyway")
    if policy == "clip":
        requests = requests.copy()
        new_prompt = prompt.copy()
        new_output = output.copy()
        if max_prompt_tokens is not None:
            new_prompt = np.minimum(new_prompt, max_prompt_tokens)
        if max_total_tokens is not None:
            new_prompt = np.maximum(np.minimum(new_prompt, max_total_tokens - output), 1)
            new_output = np.minimum(output, max_total_tokens - new_prompt)
        requests["num_prompt_tokens"] = new_prompt.astype(prompt.dtype)
        requests["num_output_tokens"] = new_output.astype(output.dtype)
        if "hash_ids" in requests.columns and hash_block_size:
            keep = (-(-np.asarray(new_prompt) // hash_block_size)).tolist()
            ids = requests["hash_ids"].tolist()
            requests["hash_ids"] = pd.Series(
                [h[:k] if cut and h is not None else h for h, k, cut in zip(ids, keep, long)],
                dtype=object, index=requests.index)
        counts["num_clipped"] = num_long
    else:
        requests = requests[~long].reset_index(drop=True)
        counts["num_dropped"] = num_long
    warnings.warn(f"{message}; {policy}ped", TraceWarning, stacklevel=3)
    return requests, counts


def load_trace(path, *, start: float = 0.0, duration: float | None = None,
               num_requests: int | None = None, speedup: float = 1.0, rate: float | None = None,
               max_prompt_tokens: int | None = None,
               long_prompt_policy: str = "error", hash_block_size: int = 512) -> pd.DataFrame:
    """Load a trace for replay: window, long-prompt policy, request limit, then time scaling.

    ``start`` and ``duration`` select the window ``[start, start + duration)`` in the trace's
    own clock (seconds from its first request). Of the requests in the window, long prompts are
    handled per ``long_prompt_policy``, the first ``num_requests`` are kept, and their times are
    shifted to the window start and divided by ``speedup`` (or scaled to mean ``rate`` req/s).
    The result has ``REQUEST_COLUMNS`` plus ``line``; ``result.attrs["load_report"]`` is the
    :class:`LoadReport`.
    """
    table, report = read_trace(path, require_times=True)
    t = table["arrival_at"].to_numpy()
    end = math.inf if duration is None else start + duration
    table = table[(t >= start) & (t < end)].reset_index(drop=True)
    check_hash_ids(table, hash_block_size, path)
    table, counts = apply_long_prompt_policy(table, max_prompt_tokens, long_prompt_policy,
                                             str(path), hash_block_size=hash_block_size)
    num_in_window = len(table) + counts["num_dropped"]
    if num_requests is not None:
        table = table.iloc[:num_requests].copy()
    times = table["arrival_at"].to_numpy()
    if rate is not None:
        if len(times) < 2 or times[-1] <= times[0]:
            raise ValueError(f"{path}: cannot rescale {len(times)} request(s) in the window to "
                             f"rate={rate}: need two or more distinct timestamps")
        speedup = rate / arrivals.recorded_rate(times)
    table["arrival_at"] = arrivals.rescale(times, speedup=speedup, origin=start)
    report = replace(report, num_in_window=num_in_window, max_prompt_tokens=max_prompt_tokens,
                     long_prompt_policy=long_prompt_policy, num_returned=len(table),
                     speedup=float(speedup), **counts)
    table.attrs["load_report"] = report
    return table
