"""A user's measurements of their own deployment, read as they already have them.

- :func:`read_vllm_bench`: a ``vllm bench serve --save-result`` JSON file (with
  ``--save-detailed`` its per-request ``input_lens``, ``output_lens``, ``ttfts``, ``itls``);
- :func:`read_serve_command`: the ``vllm serve`` command line the server ran with, and
  :func:`read_settings_toml`: the same settings as a small TOML table;
- :func:`read_run_tables`: runs in the two-file format of ``real-serving/vllm-0.15/``
  (``runs.csv`` + ``measured.csv``);
- Prometheus scrapes: :mod:`simsched.analysis.prometheus_text`.

Each gives :class:`Measured` runs: the metrics in seconds under the names simsched's summary
uses (``ttft_mean``, ``ttft_p99``, ``tpot_mean``, ``itl_mean``, ``e2el_mean``, ...), the
benchmark's settings, and the per-request table when the file has one. A missing key, a value
of the wrong kind or a unit it cannot read is an error naming the file and the key.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

# vllm bench serve's statistics -> simsched summary names (the file's values are milliseconds).
_STATS = {"mean": "mean", "median": "p50", "p90": "p90", "p95": "p95", "p99": "p99"}
_METRICS = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2el"}
BENCH_REQUIRED = ("completed", "duration", "mean_ttft_ms")


@dataclass(frozen=True)
class Measured:
    """One measured run: ``metrics`` (seconds, simsched's names), ``settings`` (the benchmark's
    and server's settings that were given), ``requests`` (per request: ``num_prompt_tokens``,
    ``num_output_tokens``, ``ttft``, ``itl_mean``; None without ``--save-detailed``) and where
    it came from."""

    source: str
    metrics: dict
    settings: dict = field(default_factory=dict)
    requests: pd.DataFrame | None = None


def _parsed(path: Path, loads, error, kind: str):
    """``loads`` of the file's text; a missing file or a parse ``error`` names the file."""
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    try:
        return loads(path.read_text())
    except error as exc:
        raise ValueError(f"{path}: not {kind} ({exc})") from None


def _load_json(path: Path) -> dict:
    data = _parsed(path, json.loads, json.JSONDecodeError, "JSON")
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _number(path, key, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ValueError(f"{path}: {key} must be a number, got {value!r}")
    return float(value)


def read_vllm_bench(path) -> Measured:
    """A ``vllm bench serve --save-result`` file as a :class:`Measured` run."""
    path = Path(path)
    data = _load_json(path)
    missing = [k for k in BENCH_REQUIRED if k not in data]
    if missing:
        raise ValueError(f"{path}: missing key {missing[0]!r} (a vllm bench serve --save-result "
                         f"file has {', '.join(BENCH_REQUIRED)}, ...)")
    metrics = {}
    for key, value in data.items():
        if not key.endswith("_ms") or value is None:
            continue
        stat, _, rest = key.partition("_")
        name = rest[:-3]
        if name not in _METRICS:
            continue
        if stat.startswith("p") and stat[1:].replace(".", "", 1).isdigit():
            label = f"p{stat[1:]}"
        elif stat in _STATS:
            label = _STATS[stat]
        elif stat == "std":
            label = "std"
        else:
            continue
        metrics[f"{_METRICS[name]}_{label}"] = _number(path, key, value) / 1000.0
    for key in ("completed", "duration", "request_throughput", "output_throughput",
                "total_input_tokens", "total_output_tokens"):
        if key in data and data[key] is not None:
            metrics[{"completed": "num_finished"}.get(key, key)] = _number(path, key, data[key])
    settings = {k: data[k] for k in ("model_id", "num_prompts", "request_rate", "burstiness",
                                     "max_concurrency", "backend") if data.get(k) is not None}
    requests = None
    if "input_lens" in data:
        requests = _detailed(path, data)
    return Measured(str(path), metrics, settings, requests)


def _detailed(path: Path, data: dict) -> pd.DataFrame:
    keys = ("input_lens", "output_lens", "ttfts", "itls")
    for k in keys:
        if k not in data:
            raise ValueError(f"{path}: a --save-detailed file has {', '.join(keys)}; {k!r} is "
                             "missing")
        if not isinstance(data[k], list):
            raise ValueError(f"{path}: {k} must be a list, got {type(data[k]).__name__}")
    n = len(data["input_lens"])
    for k in keys[1:]:
        if len(data[k]) != n:
            raise ValueError(f"{path}: {k} has {len(data[k])} entries, input_lens {n}")
    itl_mean = [float(np.mean(g)) if isinstance(g, list) and g else math.nan for g in data["itls"]]
    frame = pd.DataFrame({"num_prompt_tokens": data["input_lens"],
                          "num_output_tokens": data["output_lens"],
                          "ttft": data["ttfts"], "itl_mean": itl_mean})
    for col in ("num_prompt_tokens", "num_output_tokens", "ttft"):
        bad = pd.to_numeric(frame[col], errors="coerce").isna() & frame[col].notna()
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            source = {"num_prompt_tokens": "input_lens", "num_output_tokens": "output_lens",
                      "ttft": "ttfts"}[col]
            raise ValueError(f"{path}: {source}[{row}] = {frame[col].iloc[row]!r} is not a number")
    # vLLM writes TTFT in seconds in the detailed lists (its summary keys are milliseconds).
    return frame


# The vllm serve flags that set what simsched simulates (others are kept, not interpreted).
_SERVE_FLAGS = {"--tensor-parallel-size": ("tensor_parallel_size", int),
                "-tp": ("tensor_parallel_size", int),
                "--pipeline-parallel-size": ("pipeline_parallel_size", int),
                "--data-parallel-size": ("data_parallel_size", int),
                "--max-num-seqs": ("max_num_seqs", int),
                "--max-num-batched-tokens": ("max_num_batched_tokens", int),
                "--max-model-len": ("max_model_len", int),
                "--kv-cache-dtype": ("kv_cache_dtype", str),
                "--block-size": ("block_size", int),
                "--gpu-memory-utilization": ("gpu_memory_utilization", float),
                "--num-gpu-blocks-override": ("num_blocks", int),
                "--dtype": ("dtype", str), "--quantization": ("quantization", str)}
_SERVE_SWITCHES = {"--enable-prefix-caching": ("enable_prefix_caching", True),
                   "--no-enable-prefix-caching": ("enable_prefix_caching", False),
                   "--enable-expert-parallel": ("enable_expert_parallel", True),
                   "--async-scheduling": ("async_scheduling", True),
                   "--no-async-scheduling": ("async_scheduling", False),
                   "--enforce-eager": ("enforce_eager", True)}


def read_serve_command(command: str) -> dict:
    """The settings of a ``vllm serve MODEL --flag value ...`` command line (``--flag=value``
    too); unknown flags are returned under ``other``; a flag whose value cannot be read names
    the flag."""
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise ValueError(f"vllm serve command: {exc}") from None
    if words[:2] == ["vllm", "serve"]:
        words = words[2:]
    elif words[:1] == ["vllm"]:
        raise ValueError("vllm serve command: expected 'vllm serve MODEL ...'")
    out: dict = {"other": {}}
    k = 0
    while k < len(words):
        word = words[k]
        flag, eq, inline = word.partition("=")
        if not word.startswith("-"):
            if "model" in out:
                raise ValueError(f"vllm serve command: a second model name {word!r}")
            out["model"] = word
        elif flag in _SERVE_SWITCHES and not eq:
            key, value = _SERVE_SWITCHES[flag]
            out[key] = value
        elif flag in _SERVE_FLAGS or flag == "--model":
            if eq:
                value = inline
            else:
                if k + 1 >= len(words):
                    raise ValueError(f"vllm serve command: {flag} needs a value")
                k += 1
                value = words[k]
            if flag == "--model":
                out["model"] = value
            else:
                key, kind = _SERVE_FLAGS[flag]
                try:
                    out[key] = kind(value)
                except ValueError:
                    raise ValueError(f"vllm serve command: {flag} {value!r} is not "
                                     f"{'an integer' if kind is int else 'a number'}") from None
        else:
            value = True
            if eq:
                value = inline
            elif k + 1 < len(words) and not words[k + 1].startswith("-"):
                k += 1
                value = words[k]
            out["other"][flag] = value
        k += 1
    if "model" not in out:
        raise ValueError("vllm serve command: no model given")
    return out



SETTINGS_KEYS = {"model": str, "gpu": str, "tensor_parallel_size": int,
                 "pipeline_parallel_size": int, "data_parallel_size": int, "max_num_seqs": int,
                 "max_num_batched_tokens": int, "max_model_len": int, "kv_cache_dtype": str,
                 "block_size": int, "gpu_memory_utilization": float, "num_blocks": int,
                 "enable_prefix_caching": bool, "enable_expert_parallel": bool,
                 "async_scheduling": bool, "dtype": str, "quantization": str}


def read_settings_toml(path) -> dict:
    """Server settings as a TOML table (``[server]`` or the top level) with the keys of
    :data:`SETTINGS_KEYS` (``num_blocks``: the GPU KV blocks vLLM logged at start-up); an
    unknown key or a value of the wrong type names the file and key."""
    try:
        import tomllib
    except ModuleNotFoundError:     # Python 3.10
        import tomli as tomllib
    path = Path(path)
    data = _parsed(path, tomllib.loads, tomllib.TOMLDecodeError, "TOML")
    table = data.get("server", data)
    out = {}
    for key, value in table.items():
        if key not in SETTINGS_KEYS:
            raise ValueError(f"{path}: unknown key {key!r}; known: {sorted(SETTINGS_KEYS)}")
        kind = SETTINGS_KEYS[key]
        ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise ValueError(f"{path}: {key} must be {kind.__name__}, got {value!r}")
        out[key] = value
    if "model" not in out:
        raise ValueError(f"{path}: missing key 'model'")
    return out


def read_run_tables(runs_csv, measured_csv) -> list[Measured]:
    """Runs in the ``runs.csv`` + ``measured.csv`` format (one row per run; one row per run and
    metric, ``measured_ms``), as :class:`Measured` runs in ``runs.csv``'s order."""
    runs_csv, measured_csv = Path(runs_csv), Path(measured_csv)
    for p in (runs_csv, measured_csv):
        if not p.is_file():
            raise ValueError(f"{p}: no such file")
    runs = pd.read_csv(runs_csv)
    measured = pd.read_csv(measured_csv)
    for p, frame, cols in ((runs_csv, runs, ("experiment", "model", "gpu", "tp")),
                           (measured_csv, measured, ("experiment", "metric", "measured_ms"))):
        missing = [c for c in cols if c not in frame.columns]
        if missing:
            raise ValueError(f"{p}: missing column {missing[0]!r}")
    unknown = sorted(set(measured["experiment"]) - set(runs["experiment"]))
    if unknown:
        raise ValueError(f"{measured_csv}: experiment {unknown[0]!r} is not in {runs_csv}")
    names = {"e2e": "e2el"}
    out = []
    for row in runs.to_dict("records"):
        rows = measured[measured["experiment"] == row["experiment"]]
        metrics = {}
        for m in rows.itertuples(index=False):
            stem, _, stat = str(m.metric).rpartition("_")
            value = pd.to_numeric(pd.Series([m.measured_ms]), errors="coerce").iloc[0]
            if not np.isfinite(value):
                raise ValueError(f"{measured_csv}: {row['experiment']} {m.metric}: "
                                 f"{m.measured_ms!r} is not a number of milliseconds")
            metrics[f"{names.get(stem, stem)}_{stat}"] = float(value) / 1000.0
        settings = {k: (None if isinstance(v, float) and math.isnan(v) else v)
                    for k, v in row.items()}
        out.append(Measured(f"{runs_csv}:{row['experiment']}", metrics, settings))
    return out
