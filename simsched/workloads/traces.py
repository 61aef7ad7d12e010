"""Reading request traces: the Azure 2023 format, a generic CSV/JSONL format, and length files.

Formats, recognised from the header (CSV) or field names (JSONL, one object per line):

* **azure**: ``TIMESTAMP, ContextTokens, GeneratedTokens`` as published in Azure's LLM inference
  traces (timestamps like ``2023-11-16 18:17:03.9799600``). Times are made relative to the first
  request.
* **generic**: ``arrival_at`` (seconds, >= 0, kept as given), ``num_prompt_tokens``,
  ``num_output_tokens``, optional ``priority`` (integer), ``tenant`` (string), ``hash_ids``,
  ``session_id`` (integer >= 0), ``think_time`` (seconds >= 0; see below) and ``adapter`` (a
  LoRA adapter id, integer >= 0; empty: the base model).
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

import functools
import math
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from simsched.workloads import arrivals
from simsched.workloads.hash_ids import parse_hash_ids
from simsched.workloads.trace_files import (FORMAT_COLUMNS, TraceFormatError, TraceWarning,
                                            detect_format, expected_columns, fail,
                                            fail_first_bad, read_table, time_column,
                                            token_column)

DATA_DIR = Path(__file__).parent / "data" / "traces"
BUNDLED = {
    "azure-code": DATA_DIR / "azure-llm-2023" / "AzureLLMInferenceTrace_code.csv.gz",
    "azure-conv": DATA_DIR / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv.gz",
    "sharegpt": DATA_DIR / "sharegpt-lengths" / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv.gz",
    "mooncake": DATA_DIR / "mooncake-synthetic" / "synthetic_trace.jsonl.gz",
}
LONG_PROMPT_POLICIES = ("clip", "drop", "error")


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


def _optional_columns(path, table: pd.DataFrame, lines, out: pd.DataFrame) -> None:
    """Parse ``hash_ids``, ``session_id``, ``think_time`` and ``adapter`` into ``out`` when the
    file has them."""
    if "hash_ids" in table.columns:
        raw = table["hash_ids"]
        ids = [parse_hash_ids(v) for v in raw.tolist()]
        bad = np.array([i is None for i in ids])
        fail_first_bad(path, lines, bad, raw,
                       "hash_ids must be a non-empty list of integers >= 0")
        out["hash_ids"] = pd.Series(ids, dtype=object)
    for column, integer in (("session_id", True), ("think_time", False), ("adapter", True)):
        if column not in table.columns:
            continue
        raw = table[column]
        values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float)
        given = raw.notna().to_numpy()
        bad = given & (~np.isfinite(values) | (values < 0))
        if integer:
            bad |= given & (values != np.floor(values))
        what = "an integer >= 0" if integer else "a number of seconds >= 0"
        fail_first_bad(path, lines, bad, raw, f"{column} must be {what}")
        out[column] = (np.where(given, values, -1).astype(np.int64) if integer
                       else np.where(given, values, 0.0))


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
    table, lines = read_table(path)
    if table.empty:
        fail(path, None, "no requests in the file")
    fmt = detect_format(path, table.columns, require_times)
    try:
        return _parse(path, table, lines, fmt)
    except TraceFormatError as exc:
        raise TraceFormatError(f"{exc} [{expected_columns(fmt)}]") from None


def _parse(path: Path, table: pd.DataFrame, lines: np.ndarray,
           fmt: str) -> tuple[pd.DataFrame, LoadReport]:
    t_col, p_col, o_col = FORMAT_COLUMNS[fmt]
    out = pd.DataFrame({
        "num_prompt_tokens": token_column(path, table, lines, p_col, "prompt"),
        "num_output_tokens": token_column(path, table, lines, o_col, "output"),
    })
    if t_col is not None and t_col in table.columns:
        out.insert(0, "arrival_at", time_column(path, table, lines, t_col, fmt))
    else:
        out.insert(0, "arrival_at", np.nan)
    out["priority"] = 0
    if "priority" in table.columns:
        raw = table["priority"]
        values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float)
        given = raw.notna().to_numpy()
        bad = given & (~np.isfinite(values) | (values != np.floor(values)))
        fail_first_bad(path, lines, bad, raw, "priority must be an integer")
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
