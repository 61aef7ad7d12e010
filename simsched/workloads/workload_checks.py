"""Validation of :class:`~simsched.workloads.workload.WorkloadConfig` fields.

``WorkloadConfig.__post_init__`` calls these: each raises ValueError naming the ``workload.*``
field at fault, and some normalise a field in place (ranges to int pairs, weights and rate
schedules to float tuples, session distributions parsed) through ``object.__setattr__`` on the
frozen config.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import numpy as np

from simsched.workloads import arrivals
from simsched.workloads import rate_schedule
from simsched.workloads import sessions


def check_number(name: str, value, low: float = 0, low_open: bool = True,
                 allow_none: bool = False) -> None:
    """Raise unless ``value`` is a finite number > ``low`` (>= with ``low_open=False``)."""
    if value is None and allow_none:
        return
    ok = (not isinstance(value, bool) and isinstance(value, (int, float))
          and math.isfinite(value) and (value > low if low_open else value >= low))
    if not ok:
        bound = ">" if low_open else ">="
        raise ValueError(f"workload.{name} must be a finite number {bound} {low}, got {value!r}")


def check_integer(name: str, value, low: int = 1, allow_none: bool = False) -> None:
    """Raise unless ``value`` is an integer >= ``low`` (or None, with ``allow_none``)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"workload.{name} must be an integer >= {low}, got {value!r}")


def check_prefix(cfg, arrival: str) -> None:
    """Check the prefix-identity and session fields; parse the session distributions."""
    check_integer("hash_block_size", cfg.hash_block_size)
    check_integer("system_prompt_len", cfg.system_prompt_len, low=0)
    check_integer("num_prefix_groups", cfg.num_prefix_groups)
    if cfg.name == "shared-prefix" and cfg.system_prompt_len < 1:
        raise ValueError("workload.system_prompt_len must be >= 1 for name='shared-prefix' "
                         "(the shared system prompt's tokens)")
    if cfg.name == "sessions" and cfg.max_prompt_tokens is not None:
        raise ValueError("workload.max_prompt_tokens cannot cut a session's history; turns "
                         "too long for the model are rejected when they arrive")
    if cfg.system_prompt_len and arrival == "trace":
        raise ValueError("workload.system_prompt_len applies to synthetic workloads only; a "
                         "trace names its shared blocks with hash_ids")
    object.__setattr__(cfg, "num_turns",
                       sessions.parse_distribution("num_turns", cfg.num_turns, True))
    object.__setattr__(cfg, "think_time",
                       sessions.parse_distribution("think_time", cfg.think_time, False))


def check_schedule(cfg, arrival: str) -> None:
    """Check the gap family, the ServeGen options and ``rate_schedule`` (made float tuples)."""
    if cfg.gap_family not in rate_schedule.FAMILIES:
        raise ValueError(f"workload.gap_family must be one of {list(rate_schedule.FAMILIES)}, "
                         f"got {cfg.gap_family!r}")
    if arrival == "servegen":
        if cfg.trace_path is None and cfg.servegen_model not in rate_schedule.SERVEGEN_MODELS:
            raise ValueError(f"workload.servegen_model must be one of "
                             f"{list(rate_schedule.SERVEGEN_MODELS)} for the bundled day, "
                             f"got {cfg.servegen_model!r}")
        if cfg.name not in ("custom", "lesson", "sharegpt"):
            raise ValueError(f"arrival='servegen' needs name 'custom', 'lesson' or "
                             f"'sharegpt' (for its lengths), not {cfg.name!r}")
    s = cfg.rate_schedule
    if s is None:
        if arrival in ("piecewise", "windows"):
            raise ValueError(f"workload.rate_schedule is required for arrival={arrival!r}: "
                             "((seconds, rate), ...)")
        return
    # arrival='windows' takes an optional per-window CV: (seconds, rate, cv).
    width = (2, 3) if arrival == "windows" else (2,)
    try:
        s = tuple(tuple(float(v) for v in entry) for entry in s)
        if any(len(entry) not in width for entry in s):
            raise ValueError
    except (TypeError, ValueError):
        shape = "((seconds, rate[, cv]), ...)" if arrival == "windows" \
            else "((seconds, rate), ...)"
        raise ValueError(f"workload.rate_schedule must be {shape}, got {s!r}")
    if not s or any(not (math.isfinite(e[0]) and e[0] > 0 and math.isfinite(e[1]) and e[1] >= 0
                         and (len(e) < 3 or (math.isfinite(e[2]) and e[2] > 0)))
                    for e in s) or arrivals.schedule_mean_rate([e[:2] for e in s]) <= 0:
        raise ValueError("workload.rate_schedule needs segments with seconds > 0, rate >= 0 "
                         f"(cv > 0) and some rate > 0, got {cfg.rate_schedule!r}")
    object.__setattr__(cfg, "rate_schedule", s)


def check_range(cfg, name: str) -> None:
    """Check the ``(low, high)`` length range ``name`` (made a pair of ints)."""
    value = getattr(cfg, name)
    try:
        low, high = value
    except (TypeError, ValueError):
        raise ValueError(f"workload.{name} must be a (low, high) pair, got {value!r}")
    if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in (low, high)) \
            or not 1 <= low <= high:
        raise ValueError(f"workload.{name} must be integers 1 <= low <= high, got {value!r}")
    object.__setattr__(cfg, name, (int(low), int(high)))


def check_sources(cfg, arrival: str, length: str) -> None:
    """Check that a trace is given exactly where the workload and its processes need one."""
    uses_trace = "trace" in (arrival, length)
    if cfg.trace_path is not None and cfg.name not in ("trace", "custom"):
        raise ValueError(f"workload.trace_path needs name='trace' or 'custom', not "
                         f"{cfg.name!r} (which has its own data)")
    if cfg.name in ("trace", "custom") and uses_trace and cfg.trace_path is None:
        raise ValueError(f"workload.trace_path is required for name={cfg.name!r} with "
                         f"arrival={arrival!r}, lengths={length!r}")
    if uses_trace and cfg.name in ("lesson", "sharegpt", "shared-prefix", "sessions"):
        raise ValueError(f"workload {cfg.name!r} has no timestamped trace; use name='custom' "
                         "with trace_path, or an azure-* workload")


def check_mix(cfg, count_name: str, weights_name: str) -> None:
    """Check a class count and its optional weights (made a float tuple)."""
    count, weights = getattr(cfg, count_name), getattr(cfg, weights_name)
    check_integer(count_name, count)
    if weights is None:
        return
    try:
        w = tuple(float(x) for x in weights)
    except (TypeError, ValueError):
        raise ValueError(f"workload.{weights_name} must be a tuple of numbers, got {weights!r}")
    if len(w) != count or any(not (math.isfinite(x) and x >= 0) for x in w) or sum(w) <= 0:
        raise ValueError(f"workload.{weights_name} must hold {count_name}={count} weights "
                         f">= 0 with a positive sum, got {weights!r}")
    object.__setattr__(cfg, weights_name, w)


@lru_cache(maxsize=16)
def _servegen_table(path: str | None, stamp: tuple, model: str, start: float,
                    period: float | None):
    # Keyed by the file's size and modification time too: sweeps build many configs of one
    # workload, and a file rewritten between them is read again.
    return rate_schedule.read_servegen(path, model, start, period)


def servegen_windows(cfg):
    """The window table ``cfg`` (``arrival='servegen'``) replays, read at configuration time:
    a missing or unreadable file, an unknown model or a period without traffic raises
    ValueError naming ``workload.trace_path``, ``servegen_model`` or ``start``/``duration``."""
    path = Path(cfg.trace_path) if cfg.trace_path is not None else rate_schedule.BUNDLED_SERVEGEN
    if not path.is_file():
        raise ValueError(f"workload.trace_path: ServeGen window file {path} not found")
    stat = path.stat()
    period = None if cfg.duration is None else cfg.duration * cfg.speedup
    try:
        table = _servegen_table(None if cfg.trace_path is None else str(path),
                                (stat.st_size, stat.st_mtime_ns), cfg.servegen_model,
                                cfg.start, period)
    except ValueError as exc:
        text = str(exc)
        field = ("servegen_model" if "no model" in text
                 else "start/workload.duration" if "no traffic" in text else "trace_path")
        raise ValueError(f"workload.{field}: {text}") from None
    return rate_schedule.compress(table, cfg.speedup)


def check_arrival_count(cfg, arrival: str) -> None:
    """Bound the arrivals a workload draws (:data:`~simsched.workloads.arrivals.MAX_ARRIVALS`)
    and refuse a windowed schedule (``windows``, ``servegen``) whose period holds less than
    one arrival in expectation; each ValueError names the field to change."""
    limit = arrivals.MAX_ARRIVALS
    if cfg.num_requests is not None and cfg.num_requests > limit:
        raise ValueError(f"workload.num_requests must be at most {limit:,} (the arrivals one "
                         f"workload may draw), got {cfg.num_requests:,}")
    if arrival in ("windows", "servegen"):
        table = servegen_windows(cfg) if arrival == "servegen" else \
            rate_schedule.windows_from_schedule(cfg.rate_schedule, cfg.cv, cfg.gap_family)
        expected = rate_schedule.expected_arrivals(table, cfg.rate, cfg.duration)
        field = "duration" if cfg.duration is not None else "rate" if cfg.rate is not None \
            or arrival == "servegen" else "rate_schedule"
        if expected < 1.0:
            raise ValueError(f"workload.{field}: arrival={arrival!r} expects {expected:.3g} "
                             f"arrivals in the period drawn (duration={cfg.duration!r}, "
                             f"rate={cfg.rate!r}): fewer than one, the workload would be empty")
    elif arrival != "trace" and cfg.duration is not None:
        # A synthetic process drawn for a duration (a piecewise schedule's own mean rate when
        # it is used as given).
        rate = cfg.resolved_rate if cfg.resolved_rate is not None \
            else arrivals.schedule_mean_rate(cfg.rate_schedule)
        expected, field = rate * cfg.duration, "duration"
    else:
        return
    # With a request cap, no more than it is drawn (rate_schedule.windowed draws lazily).
    if cfg.num_requests is None and expected > limit:
        raise ValueError(f"workload.{field}: arrival={arrival!r} expects {expected:.3g} arrivals "
                         f"(rate={cfg.rate!r}, duration={cfg.duration!r}), more than the "
                         f"{limit:,} one workload may draw; lower it or set "
                         "workload.num_requests")
