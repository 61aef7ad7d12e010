"""Writing and reading results: the resolved config, tidy frames on disk, and the vLLM export.

* :func:`resolved_config` is a run's config as plain JSON data, with what the run derived from it
  (the number of KV blocks, the context length, the time limit a sweep applied);
* :func:`read_frames` reads frames written by ``Results.to_csv``/``SweepResult.to_csv`` (or their
  Parquet twins) back with the dtypes they had in memory;
* :func:`vllm_bench_result` turns a run into the dictionary ``vllm bench serve --save-result``
  writes, so a simulation and a real benchmark can be compared with the same tools.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from simsched.config.serialize import plain_data

# Columns whose dtype a CSV round trip would lose: empty strings read back as NaN, nullable
# integers as floats.
STRING_COLUMNS = ("reject_reason",)
NULLABLE_INT_COLUMNS = ("preempted_by",)

VLLM_PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")


def plain(value: Any) -> Any:
    """``value`` as JSON data: dataclasses and mappings as dicts, tuples as lists, numpy scalars
    as Python numbers, non-finite floats as the strings ``"inf"``, ``"-inf"``, ``"nan"`` (the
    form :meth:`SimConfig.from_dict` reads back)."""
    return plain_data(value)


def resolved_config(config, info: Mapping[str, Any] | None = None, **extra: Any) -> dict:
    """A run's config as JSON data plus ``derived``: what the run computed from it.

    ``derived`` holds ``num_blocks`` (the KV cache size used, derived from GPU memory when
    ``cache.num_blocks`` is None), ``max_model_len`` (the context length requests must fit) and
    any ``extra`` values (e.g. the ``max_sim_time`` a sweep applied).
    """
    from simsched.cost import hardware

    out = plain(config)
    derived: dict[str, Any] = {}
    info = info or {}
    num_blocks = info.get("num_blocks")
    if num_blocks is None:
        num_blocks = config.cache.num_blocks
        if num_blocks is None:
            num_blocks = hardware.kv_capacity_blocks(config.hardware, config.cache.block_size)
    derived["num_blocks"] = int(num_blocks)
    derived["max_model_len"] = int(hardware.max_model_len(config.hardware))
    derived.update({k: plain(v) for k, v in extra.items()})
    out["derived"] = derived
    return out


def write_json(data: Any, path) -> Path:
    """Write ``data`` (made plain) as indented JSON to ``path``; return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plain(data), indent=1) + "\n")
    return path


def write_frames(frames: Mapping[str, pd.DataFrame], directory, fmt: str = "csv",
                 prefix: str = "") -> list[Path]:
    """Write each frame as ``PREFIXNAME.csv`` or ``.parquet`` into ``directory``."""
    if fmt not in ("csv", "parquet"):
        raise ValueError(f"format must be 'csv' or 'parquet', got {fmt!r}")
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    written = []
    for name, frame in frames.items():
        target = path / f"{prefix}{name}.{fmt}"
        if fmt == "csv":
            frame.to_csv(target, index=False)
        else:
            require_pyarrow("Parquet export")
            _parquet_safe(frame).to_parquet(target, index=False)
        written.append(target)
    return written


def require_pyarrow(what: str) -> None:
    """Raise an ImportError saying that ``what`` needs pyarrow and how to install it, if it is
    missing (pyarrow is an optional extra)."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise ImportError(f"{what} needs pyarrow: pip install 'simsched[parquet]'") from None


def _parquet_safe(frame: pd.DataFrame) -> pd.DataFrame:
    # Object columns mixing None with strings/numbers (tenant, varied fields) must be one type.
    out = frame.copy()
    for col in out.columns:
        if out[col].dtype == object:
            out[col] = out[col].map(lambda v: None if v is None else str(v))
    return out


def restore_dtypes(frame: pd.DataFrame) -> pd.DataFrame:
    """Give a frame read from disk its in-memory dtypes back (see :data:`STRING_COLUMNS`)."""
    for col in STRING_COLUMNS:
        if col in frame.columns:
            # astype first: an all-empty column reads back as float NaN, which fillna("")
            # would warn about (pandas refuses a string fill for a float column).
            frame[col] = frame[col].astype(object).fillna("")
    for col in NULLABLE_INT_COLUMNS:
        if col in frame.columns:
            frame[col] = frame[col].astype("Int64")
    return frame


def read_frames(directory, prefix: str = "") -> dict[str, pd.DataFrame]:
    """Every ``PREFIX*.csv`` / ``PREFIX*.parquet`` frame in ``directory``, by name.

    ``reject_reason`` reads back as ``''`` for requests that were not rejected (as in memory, not
    NaN) and ``preempted_by`` as a nullable integer (``<NA>`` where nothing preempted).
    """
    path = Path(directory)
    if not path.is_dir():
        raise ValueError(f"{path} is not a directory")
    out: dict[str, pd.DataFrame] = {}
    for file in sorted(path.iterdir()):
        if not file.name.startswith(prefix) or file.suffix not in (".csv", ".parquet"):
            continue
        name = file.stem[len(prefix):]
        frame = pd.read_csv(file) if file.suffix == ".csv" else pd.read_parquet(file)
        out[name] = restore_dtypes(frame)
    return out


def _stats(values: np.ndarray, percentiles: Sequence[float], name: str) -> dict[str, float]:
    # As vllm bench serve: milliseconds, population std, numpy's default (linear) percentiles;
    # an empty sample counts as 0.
    values = values if len(values) else np.zeros(1)
    out = {f"mean_{name}_ms": float(np.mean(values)) * 1000,
           f"median_{name}_ms": float(np.median(values)) * 1000,
           f"std_{name}_ms": float(np.std(values)) * 1000}
    for p in percentiles:
        word = str(int(p)) if int(p) == p else str(p)
        out[f"p{word}_{name}_ms"] = float(np.percentile(values, p)) * 1000
    return out


def _peak_tokens_per_s(requests: pd.DataFrame, iterations: pd.DataFrame, start: float) -> float:
    """Most output tokens emitted in one second (1-s buckets from ``start``)."""
    decode_at = (iterations["started_at"] + iterations["duration"]).to_numpy()
    counts = iterations["num_decode_tokens"].to_numpy()
    first = requests["first_token_at"].dropna().to_numpy()
    times = np.concatenate([decode_at, first])
    weights = np.concatenate([counts, np.ones(len(first))])
    if not len(times):
        return 0.0
    buckets = np.floor(times - start).astype(np.int64)
    keep = buckets >= 0
    return float(np.bincount(buckets[keep], weights=weights[keep]).max()) if keep.any() else 0.0


def _peak_concurrency(done: pd.DataFrame) -> int:
    starts, ends = done["arrival_at"].to_numpy(), done["finished_at"].to_numpy()
    events = np.concatenate([np.stack([starts, np.ones(len(starts))], 1),
                             np.stack([ends, -np.ones(len(ends))], 1)])
    if not len(events):
        return 0
    # Half-open intervals [arrival, finish): a departure at t precedes an arrival at t.
    events = events[np.lexsort((events[:, 1], events[:, 0]))]
    return int(np.cumsum(events[:, 1]).max())


def vllm_bench_result(results, percentiles: Sequence[float] = (99,),
                      percentile_metrics: Sequence[str] = VLLM_PERCENTILE_METRICS,
                      slo=None, label: str | None = None) -> dict[str, Any]:
    """A run as the dictionary ``vllm bench serve --save-result`` writes (without
    ``--save-detailed``), with the same keys, units (milliseconds) and statistics.

    As vLLM computes them: ``completed`` counts finished requests and ``failed`` the others
    (rejected, or still in flight when ``max_sim_time`` ended the run); TTFT, TPOT and E2EL are
    over finished requests (TPOT over those with more than one output token); statistics are the
    mean, median, population standard deviation and numpy's linear-interpolation percentiles
    ``percentiles`` (default 99, as ``--metric-percentiles``); ``percentile_metrics`` selects the
    metrics as ``--percentile-metrics`` does (default all four). ``duration`` is the span from
    the first arrival to the last finish. ITL pools every gap emitted, including those of
    requests still in flight at the end of the run (identical to vLLM's when all finished).
    ``request_goodput`` is set when an :class:`~simsched.analysis.slo.SLO` is given.
    Setup keys describe the simulated run: ``backend`` is ``"simsched"``, ``model_id`` the
    simulated model, ``request_rate`` the workload's rate (``"inf"`` when it has none).
    """
    from simsched.analysis.slo import goodput as goodput_of

    unknown = set(percentile_metrics) - set(VLLM_PERCENTILE_METRICS)
    if unknown:
        raise ValueError(f"percentile_metrics must be among {list(VLLM_PERCENTILE_METRICS)}, "
                         f"got {sorted(unknown)}")
    for p in percentiles:
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p < 100:
            raise ValueError(f"percentiles must be numbers in (0, 100), got {p!r}")
    df = results.requests
    done = df[df["status"] == "finished"]
    config = results.config
    workload = getattr(config, "workload", None)
    rate = getattr(workload, "rate", None)
    cv = getattr(workload, "cv", 1.0) if getattr(workload, "arrival_process", "") == "gamma" \
        else 1.0
    span = (float(done["finished_at"].max() - df["arrival_at"].min()) if len(done)
            else 0.0)
    total_in = int(done["num_prompt_tokens"].sum())
    total_out = int(done["num_output_tokens"].sum())
    per_s = (lambda x: x / span) if span > 0 else (lambda x: 0.0)
    out: dict[str, Any] = {
        "date": datetime.datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "simsched", "backend": "simsched", "label": label,
        "model_id": getattr(getattr(config, "hardware", None), "model", None),
        "tokenizer_id": None, "num_prompts": len(df),
        "request_rate": "inf" if rate is None else float(rate),
        "burstiness": 1.0 / cv**2, "max_concurrency": None,
        "duration": span, "completed": len(done), "failed": len(df) - len(done),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": per_s(len(done)),
        "request_goodput": (per_s(goodput_of(df, slo)["num_good"]) if slo is not None
                            else None),
        "output_throughput": per_s(total_out),
        "total_token_throughput": per_s(total_in + total_out),
        "max_output_tokens_per_s": (_peak_tokens_per_s(df, results.iterations,
                                                       float(df["arrival_at"].min()))
                                    if len(df) else 0.0),
        "max_concurrent_requests": _peak_concurrency(done),
        "rtfx": 0.0,
    }
    samples = {"ttft": done["ttft"].to_numpy(dtype=float),
               "tpot": done.loc[done["num_output_tokens"] > 1, "tpot"].to_numpy(dtype=float),
               "itl": results.itl_samples(),
               "e2el": done["e2el"].to_numpy(dtype=float)}
    for name in VLLM_PERCENTILE_METRICS:
        if name in percentile_metrics:
            out.update(_stats(samples[name], percentiles, name))
    return out
