"""Read Prometheus metrics as an engine exposes them: the text exposition format (what vLLM's
``/metrics`` serves) and OpenMetrics (what :mod:`simsched.analysis.openmetrics` writes).

:func:`parse` turns one scrape (or a file of timestamped samples) into samples; :func:`scrapes`
groups a file's timestamped samples into one scrape per timestamp; :func:`run_metrics` takes a
scrape before and one after a run (or the last of a series, with nothing before) and gives the
run's means and histogram quantiles in seconds, under the names ``vllm bench serve`` uses
(``ttft_mean``, ``itl_mean``, ``e2el_mean``, ``queue_time_mean``, ``prefill_time_mean``,
``decode_time_mean``, ``ttft_p50``/``_p90``/``_p99`` as PromQL's ``histogram_quantile`` would
answer them), plus token and request counts. A line it cannot read is an error naming the
source and line.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from pathlib import Path

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(?:\s+(\S+))?\s*$')
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')

# vLLM histogram families -> the run metric their mean gives (seconds).
MEANS = {"vllm:time_to_first_token_seconds": "ttft_mean",
         "vllm:inter_token_latency_seconds": "itl_mean",
         "vllm:e2e_request_latency_seconds": "e2el_mean",
         "vllm:request_queue_time_seconds": "queue_time_mean",
         "vllm:request_prefill_time_seconds": "prefill_time_mean",
         "vllm:request_decode_time_seconds": "decode_time_mean",
         "vllm:request_time_per_output_token_seconds": "tpot_mean"}
QUANTILES = {"vllm:time_to_first_token_seconds": "ttft",
             "vllm:inter_token_latency_seconds": "itl",
             "vllm:e2e_request_latency_seconds": "e2el"}
COUNTERS = {"vllm:prompt_tokens_total": "num_prompt_tokens",
            "vllm:generation_tokens_total": "num_generated_tokens",
            "vllm:request_success_total": "num_finished",
            "vllm:num_preemptions_total": "num_preemptions",
            "vllm:prefix_cache_queries_total": "prefix_cache_queries",
            "vllm:prefix_cache_hits_total": "prefix_cache_hits"}


def _unescape(value: str) -> str:
    return value.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")


def _labels(text: str, where: str) -> tuple:
    out, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if not m:
            raise ValueError(f"{where}: cannot read the labels {{{text}}}")
        out.append((m.group(1), _unescape(m.group(2))))
        pos = m.end()
    return tuple(sorted(out))


def _number(text: str, where: str) -> float:
    try:
        return float(text.replace("+Inf", "inf").replace("-Inf", "-inf"))
    except ValueError:
        raise ValueError(f"{where}: {text!r} is not a number") from None


def parse(text: str, source: str = "metrics") -> list[tuple[str, tuple, float, float | None]]:
    """Every sample of ``text``: ``(name, labels, value, timestamp_seconds or None)``.

    Comments (``# HELP``, ``# TYPE``, ``# EOF``) are skipped. A timestamp in the text format is
    in milliseconds (an integer); in OpenMetrics in seconds (it has a decimal point or is
    written after ``# EOF``-style files' convention): an integer above 1e11 is read as
    milliseconds, anything else as seconds.
    """
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}, line {number}"
        m = _SAMPLE.match(line)
        if not m:
            raise ValueError(f"{where}: not a Prometheus sample: {line[:80]!r}")
        name, _, labels, value, stamp = m.groups()
        ts = None
        if stamp is not None:
            ts = _number(stamp, where)
            if "." not in stamp and ts > 1e11:
                ts /= 1000.0
        out.append((name, _labels(labels or "", where), _number(value, where), ts))
    return out


def read(path) -> list:
    """:func:`parse` of a file, naming it in errors."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such metrics file")
    return parse(path.read_text(), str(path))


def scrapes(samples: list) -> list[list]:
    """The samples grouped by timestamp, oldest first (one scrape each); samples without a
    timestamp form a single scrape."""
    groups: dict = defaultdict(list)
    for s in samples:
        groups[s[3]].append(s)
    if None in groups and len(groups) > 1:
        raise ValueError("metrics mix samples with and without timestamps")
    return [groups[k] for k in sorted(groups, key=lambda t: -math.inf if t is None else t)]


def _totals(samples: list) -> dict:
    """Sums over series (replicas, engines) by (name, le)."""
    out: dict = defaultdict(float)
    for name, labels, value, _ in samples:
        le = dict(labels).get("le")
        out[(name, le)] += value
    return out


def _quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """PromQL's ``histogram_quantile`` over cumulative (le, count) buckets."""
    buckets = sorted(buckets)
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return math.nan
    rank = q * total
    lower_le, lower_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower_le
            if count == lower_count:
                return le
            return lower_le + (le - lower_le) * (rank - lower_count) / (count - lower_count)
        lower_le, lower_count = le, count
    return buckets[-1][0]


def run_metrics(after: list, before: list | None = None) -> dict:
    """A run's figures from the scrape ``after`` it (minus the scrape ``before`` it, if given):
    histogram means and quantiles in seconds, counter deltas. Families absent from the scrape
    are absent from the result."""
    a, b = _totals(after), _totals(before or [])
    delta = {k: v - b.get(k, 0.0) for k, v in a.items()}
    for key, v in delta.items():
        if v < -1e-9 and key[0].endswith(("_total", "_count", "_sum", "_bucket")):
            raise ValueError(f"{key[0]} fell from {b[key]} to {a[key]} between the scrapes "
                             "(the server restarted?): give scrapes of one server's life")
    out = {}
    for family, name in MEANS.items():
        count = delta.get((f"{family}_count", None))
        if count:
            out[name] = delta[(f"{family}_sum", None)] / count
    for family, stem in QUANTILES.items():
        buckets = [(_number(le, family), v) for (n, le), v in delta.items()
                   if n == f"{family}_bucket" and le is not None]
        if buckets:
            for q in (50, 90, 99):
                out[f"{stem}_p{q}"] = _quantile(q / 100, buckets)
    for family, name in COUNTERS.items():
        if (family, None) in delta:
            out[name] = delta[(family, None)]
    return out
