"""Workloads: which requests arrive when, with which prompt and output lengths.

``WorkloadConfig`` names a workload and its parameters; :func:`generate` turns it into a request
table (a DataFrame with columns ``arrival_at, num_prompt_tokens, num_output_tokens, priority,
tenant``, sorted by arrival) using the run's ``numpy.random.Generator``. A workload combines an
arrival process (:mod:`simsched.arrivals`), a length distribution (:mod:`simsched.lengths`),
optionally a recorded trace (:mod:`simsched.traces`), and a tenant and priority mix.
:func:`describe` summarises any request table so a trace can be checked before it is run.

Prefix identity (for a prefix cache) rides along in optional columns: ``hash_ids`` (a trace's
block hashes, blocks of ``hash_block_size`` tokens), ``prefix_group``/``prefix_len`` (a shared
system prompt) and ``session_id``/``think_time`` (closed-loop multi-turn sessions,
:mod:`simsched.workloads.sessions`).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from simsched.workloads import lengths
from simsched.workloads import rate_schedule
from simsched.workloads import traces
from simsched.workloads.arrivals import ARRIVALS
from simsched.workloads.describe import WorkloadDescription, describe
from simsched.workloads.generation import (draw_classes, draw_lengths, session_turns,
                                           synthetic_arrivals)
from simsched.workloads.lengths import LENGTHS
from simsched.workloads.traces import LONG_PROMPT_POLICIES, LoadReport
from simsched.workloads.workload_checks import (check_arrival_count, check_integer, check_mix,
                                                check_number, check_prefix, check_range,
                                                check_schedule, check_sources)

# Arrival processes whose schedule is used as given with rate=None (a number rescales it).
SCHEDULED = ("trace", "piecewise", "windows", "servegen")
REQUEST_COLUMNS = ("arrival_at", "num_prompt_tokens", "num_output_tokens", "priority", "tenant")

WORKLOADS = {
    "lesson": "Poisson arrivals, the lesson's clipped lognormal lengths",
    "sharegpt": "Poisson arrivals, (prompt, output) pairs resampled from ShareGPT",
    "azure-code": "Azure 2023 code-completion trace replayed (bursty, CV ~13)",
    "azure-conv": "Azure 2023 conversation trace replayed (near-Poisson)",
    "mooncake": "Mooncake synthetic trace replayed: long prompts sharing prefixes (hash_ids)",
    "shared-prefix": "G groups with their own system prompts; request = system prompt + question",
    "sessions": "closed-loop multi-turn sessions: each turn's prompt is the whole history",
    "trace": "replay of a user trace file (trace_path)",
    "custom": "any arrival process and length distribution, set field by field",
}
# What rate=None and num_requests=None (with duration=None) mean for a synthetic arrival process;
# a replayed trace keeps its recorded times and every request instead.
DEFAULT_RATE = 8.0
DEFAULT_NUM_REQUESTS = 500
# What arrival=None and lengths=None mean for each workload.
_DEFAULTS = {"lesson": ("poisson", "lognormal"), "sharegpt": ("poisson", "empirical"),
             "azure-code": ("trace", "trace"), "azure-conv": ("trace", "trace"),
             "mooncake": ("trace", "trace"), "shared-prefix": ("poisson", "fixed"),
             "sessions": ("poisson", "lognormal"),
             "trace": ("trace", "trace"), "custom": ("poisson", "lognormal")}


@dataclass(frozen=True)
class WorkloadConfig:
    """A workload: arrival process, lengths, trace options and tenant/priority mix.

    ``name`` picks one of :data:`WORKLOADS`; ``arrival`` and ``lengths`` left at ``None`` take
    that workload's own (e.g. ``trace`` for ``azure-conv``). ``rate`` is the mean rate in
    requests/s for every arrival process. ``num_requests`` caps the count and ``duration`` the
    time span (for a trace: the window ``[start, start + duration)`` in the trace's own clock).

    A trace replays as recorded unless asked otherwise: with ``rate=None`` (the default) its
    times are kept (divided by ``speedup``) and with ``num_requests=None`` and ``duration=None``
    (the defaults) every request is replayed; a number for ``rate`` rescales the times to that
    mean rate. A piecewise schedule with ``rate=None`` is used as given. Any other (synthetic)
    arrival process takes ``rate=None`` as :data:`DEFAULT_RATE` (8 req/s) and, without a
    ``duration``, ``num_requests=None`` as :data:`DEFAULT_NUM_REQUESTS` (500);
    :attr:`resolved_rate` and :attr:`resolved_num_requests` give the values in effect.

    Time-varying load (:mod:`simsched.workloads.rate_schedule`): ``arrival='windows'`` plays
    ``rate_schedule`` once, window after window, each ``(seconds, rate[, cv])`` a stationary
    renewal process with gaps of family ``gap_family`` (``gamma`` or ``weibull``) and that CV
    (default ``cv``). ``arrival='servegen'`` replays ServeGen's per-client windows of
    ``servegen_model`` (the bundled day, or the ServeGen window file ``trace_path`` with
    ``name='custom'``) from ``start``; ``speedup`` compresses its time axis (windows
    ``speedup`` times shorter and busier) and ``duration`` is in the compressed clock; ``rate``
    scales either to that mean rate (the scale factor), keeping the shape. With ``num_requests``
    either is drawn only as far as the first ``num_requests`` need
    (:func:`~simsched.workloads.rate_schedule.windowed`); a ServeGen file is read when the
    config is built. No workload draws more than
    :data:`~simsched.workloads.arrivals.MAX_ARRIVALS` arrivals (expected, without a cap).

    Prefix sharing: ``hash_block_size`` is the tokens per trace ``hash_ids`` entry (512 in
    Mooncake's traces). ``system_prompt_len`` tokens of a shared system prompt, one of
    ``num_prefix_groups`` drawn uniformly per request (per session), are prepended to every
    prompt of a synthetic workload (``shared-prefix``: system prompt + a question of
    ``prompt_len`` tokens). ``sessions``: ``rate`` and ``num_requests`` count *sessions*; each has
    ``num_turns`` turns whose new user tokens and outputs come from the length distribution, the
    next sent ``think_time`` seconds after the previous finished (both distributions, see
    :mod:`simsched.workloads.sessions`).

    LoRA: with ``num_adapters`` > 0 each request names one of that many adapters (an ``adapter``
    column), adapter ``i`` drawn with probability proportional to ``1 / (i + 1) **
    adapter_zipf`` (0: uniform); a trace with an ``adapter`` column replays its adapters
    instead. The run serves them with ``scheduler.lora``.
    """

    name: str = "lesson"
    rate: float | None = None
    num_requests: int | None = None
    duration: float | None = None
    # arrivals
    arrival: str | None = None
    cv: float = 1.0
    on_seconds: float = 10.0
    off_seconds: float = 10.0
    rate_schedule: tuple | None = None
    gap_family: str = "gamma"
    servegen_model: str = "m-large"
    # lengths
    lengths: str | None = None
    prompt_len: int = 128
    output_len: int = 128
    prompt_range: tuple = (10, 512)
    output_range: tuple = (10, 512)
    lengths_path: str | None = None
    # traces
    trace_path: str | None = None
    start: float = 0.0
    speedup: float = 1.0
    max_prompt_tokens: int | None = None
    long_prompt_policy: str = "error"
    # tenant and priority mix
    num_tenants: int = 1
    tenant_weights: tuple | None = None
    num_priorities: int = 1
    priority_weights: tuple | None = None
    # prefix sharing
    hash_block_size: int = 512
    system_prompt_len: int = 0
    num_prefix_groups: int = 1
    num_turns: float | tuple = 4
    think_time: float | tuple = ("exponential", 5.0)
    # LoRA adapters (see simsched.config.lora): 0 serves every request with the base model
    num_adapters: int = 0
    adapter_zipf: float = 1.0

    def __post_init__(self) -> None:
        if self.name not in WORKLOADS:
            raise ValueError(f"workload.name must be one of {sorted(WORKLOADS)}, got {self.name!r}")
        if self.arrival is not None and self.arrival not in ARRIVALS:
            raise ValueError(f"workload.arrival must be one of {list(ARRIVALS)} or None, "
                             f"got {self.arrival!r}")
        if self.lengths is not None and self.lengths not in LENGTHS:
            raise ValueError(f"workload.lengths must be one of {list(LENGTHS)} or None, "
                             f"got {self.lengths!r}")
        arrival, length = self.arrival_process, self.length_distribution
        check_number("rate", self.rate, allow_none=True)
        check_integer("num_requests", self.num_requests, allow_none=True)
        check_number("duration", self.duration, allow_none=True)
        check_number("cv", self.cv)
        check_number("on_seconds", self.on_seconds)
        check_number("off_seconds", self.off_seconds)
        check_schedule(self, arrival)
        check_integer("prompt_len", self.prompt_len)
        check_integer("output_len", self.output_len)
        for name in ("prompt_range", "output_range"):
            check_range(self, name)
        for name in ("lengths_path", "trace_path"):
            value = getattr(self, name)
            if isinstance(value, os.PathLike):
                object.__setattr__(self, name, os.fspath(value))
            elif value is not None and not isinstance(value, str):
                raise ValueError(f"workload.{name} must be a path or None, got {value!r}")
        check_sources(self, arrival, length)
        check_number("start", self.start, low_open=False)
        check_number("speedup", self.speedup)
        if self.speedup != 1.0 and arrival not in ("trace", "servegen"):
            raise ValueError(f"workload.speedup only applies to arrival='trace' or 'servegen', "
                             f"not {arrival!r}")
        if self.speedup != 1.0 and self.rate is not None and arrival == "trace":
            raise ValueError(f"workload.speedup={self.speedup} and workload.rate={self.rate} "
                             "both rescale the trace; set rate=None to use speedup")
        if self.start != 0 and "trace" not in (arrival, length) and arrival != "servegen":
            raise ValueError("workload.start only applies to trace or servegen arrivals or "
                             "trace lengths")
        check_integer("max_prompt_tokens", self.max_prompt_tokens, allow_none=True)
        if self.long_prompt_policy not in LONG_PROMPT_POLICIES:
            raise ValueError(f"workload.long_prompt_policy must be one of "
                             f"{list(LONG_PROMPT_POLICIES)}, got {self.long_prompt_policy!r}")
        for count, weights in (("num_tenants", "tenant_weights"),
                               ("num_priorities", "priority_weights")):
            check_mix(self, count, weights)
        check_prefix(self, arrival)
        check_integer("num_adapters", self.num_adapters, low=0)
        check_number("adapter_zipf", self.adapter_zipf, low_open=False)
        if self.num_adapters and self.name == "sessions":
            raise ValueError("workload.num_adapters is not supported for name='sessions' (give "
                             "a session table an adapter column instead)")
        check_arrival_count(self, arrival)      # last: it reads a ServeGen file's windows

    @property
    def arrival_process(self) -> str:
        """The arrival process in effect: ``arrival`` or the workload's own."""
        return self.arrival or _DEFAULTS[self.name][0]

    @property
    def resolved_rate(self) -> float | None:
        """The mean rate in effect; None replays a trace's times or a rate schedule as given."""
        if self.rate is not None or self.arrival_process in SCHEDULED:
            return self.rate
        return DEFAULT_RATE

    @property
    def resolved_num_requests(self) -> int | None:
        """The request cap in effect; None keeps every request of the trace or the duration."""
        if self.num_requests is not None or self.duration is not None \
                or self.arrival_process in ("trace", "windows", "servegen"):
            return self.num_requests
        return DEFAULT_NUM_REQUESTS

    @property
    def length_distribution(self) -> str:
        """The length distribution in effect: ``lengths`` or the workload's own."""
        return self.lengths or _DEFAULTS[self.name][1]

    def window_table(self) -> pd.DataFrame:
        """The per-client window table of ``arrival='windows'`` or ``'servegen'``
        (:mod:`simsched.workloads.rate_schedule`); ``start`` and ``duration`` pick the
        ServeGen period read."""
        if self.arrival_process == "servegen":
            table = rate_schedule.read_servegen(self.trace_path, self.servegen_model, self.start,
                                                None if self.duration is None
                                                else self.duration * self.speedup)
            return rate_schedule.compress(table, self.speedup)
        return rate_schedule.windows_from_schedule(self.rate_schedule, self.cv,
                                                   self.gap_family)

    def trace_source(self) -> Path | None:
        """The timestamped trace file this workload reads, if any."""
        if self.trace_path is not None:
            return Path(self.trace_path)
        if self.name in ("azure-code", "azure-conv", "mooncake"):
            return traces.BUNDLED[self.name]
        return None

    def lengths_source(self) -> Path:
        """The file ``lengths='empirical'`` resamples pairs from."""
        if self.lengths_path is not None:
            return Path(self.lengths_path)
        return self.trace_source() or traces.BUNDLED["sharegpt"]

    @classmethod
    def preset(cls, name: str, **changes) -> "WorkloadConfig":
        """The recommended settings of workload ``name``, with ``changes`` applied.

        Trace workloads (``azure-*``, ``mooncake``, ``trace``) replay the whole trace at its
        recorded rate (the field defaults); ``shared-prefix`` has 8 groups with a 1,024-token
        system prompt, 128-token questions and outputs; the others are the field defaults.
        """
        base = {"name": name}
        if name == "shared-prefix":
            base.update(system_prompt_len=1024, num_prefix_groups=8)
        base.update(changes)
        return cls(**base)

    def describe(self, rng: np.random.Generator | None = None) -> "WorkloadDescription":
        """Generate this workload (with ``rng``, default seed 0) and :func:`describe` it."""
        return describe(generate(self, rng if rng is not None else np.random.default_rng(0)))


def generate(cfg: WorkloadConfig, rng: np.random.Generator) -> pd.DataFrame:
    """The request table of workload ``cfg`` drawn with ``rng``.

    Columns are :data:`REQUEST_COLUMNS`, sorted by ``arrival_at``, plus the prefix-identity
    columns the workload has (``hash_ids``, ``prefix_group``/``prefix_len``,
    ``session_id``/``think_time``). ``frame.attrs["load_report"]`` is a
    :class:`~simsched.workloads.traces.LoadReport` saying what trace loading and the long-prompt
    policy did (counts of sorted, clipped and dropped requests); ``frame.attrs["hash_block_size"]``
    the tokens per ``hash_ids`` entry.
    """
    if not isinstance(cfg, WorkloadConfig):
        hint = "; pass config.workload" if hasattr(cfg, "workload") else ""
        raise ValueError(f"generate() wants a WorkloadConfig, got {type(cfg).__name__}{hint}")
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"generate() wants a numpy.random.Generator as rng (e.g. "
                         f"numpy.random.default_rng(seed)), got {type(rng).__name__}")
    if cfg.name == "sessions":
        return session_turns(cfg, rng)
    arrival, kind = cfg.arrival_process, cfg.length_distribution
    source = cfg.trace_source()
    trace = report = None
    if "trace" in (arrival, kind):
        trace = traces.load_trace(
            source, start=cfg.start, duration=cfg.duration if arrival == "trace" else None,
            num_requests=cfg.num_requests if arrival == "trace" else None,
            speedup=cfg.speedup, rate=cfg.resolved_rate if arrival == "trace" else None,
            max_prompt_tokens=cfg.max_prompt_tokens if kind == "trace" else None,
            long_prompt_policy=cfg.long_prompt_policy, hash_block_size=cfg.hash_block_size)
        report = trace.attrs["load_report"]
    if arrival == "trace":
        times = trace["arrival_at"].to_numpy()
    else:
        times = synthetic_arrivals(cfg, rng)
    if kind == "trace":
        if len(times) > len(trace):
            warnings.warn(f"{source}: {len(trace)} length pairs for {len(times)} "
                                 f"arrivals; keeping the first {len(trace)} arrivals",
                                 traces.TraceWarning, stacklevel=2)
            times = times[:len(trace)]
        prompt, output = lengths.in_order(len(times), trace["num_prompt_tokens"].to_numpy(),
                                          trace["num_output_tokens"].to_numpy())
    else:
        prompt, output = draw_lengths(cfg, rng, len(times))
    n = len(times)
    if arrival == "trace":
        priority = trace["priority"].to_numpy(dtype=np.int64)
        tenant = trace["tenant"].astype(object)
        tenant = tenant.where(tenant.notna(), None).to_numpy(dtype=object)
    else:
        priority, tenant = np.zeros(n, dtype=np.int64), np.full(n, None, dtype=object)
    priority, tenant = draw_classes(cfg, rng, n, priority, tenant)
    # Drawn columns are the frame's own, not copied (a fleet's day is tens of millions of rows);
    # a trace's are copied (they may be views of the cached trace).
    frame = pd.DataFrame({"arrival_at": np.asarray(times, dtype=float),
                          "num_prompt_tokens": np.asarray(prompt, dtype=np.int64),
                          "num_output_tokens": np.asarray(output, dtype=np.int64),
                          "priority": priority,
                          "tenant": pd.Series(tenant, dtype=object, copy=trace is not None)},
                         copy=trace is not None)
    del times, prompt, output, priority, tenant
    if kind == "trace":     # rows are the trace's, in order: keep their prefix identity
        for column in ("hash_ids", "session_id", "think_time", "adapter"):
            if column in trace.columns:
                frame[column] = trace[column].iloc[:n].to_numpy()
    if cfg.system_prompt_len:
        frame["prefix_group"] = rng.integers(0, cfg.num_prefix_groups, n, dtype=np.int64)
        frame["prefix_len"] = cfg.system_prompt_len
        frame["num_prompt_tokens"] += cfg.system_prompt_len
    frame, counts = traces.apply_long_prompt_policy(
        frame, cfg.max_prompt_tokens, cfg.long_prompt_policy, f"workload {cfg.name!r}",
        hash_block_size=cfg.hash_block_size)
    if report is None:
        report = LoadReport(source=f"workload {cfg.name!r}", format="synthetic",
                            num_rows=n, num_in_window=n)
    merged = {k: getattr(report, k) + v for k, v in counts.items()}
    frame.attrs["load_report"] = replace(report, num_returned=len(frame),
                                         max_prompt_tokens=cfg.max_prompt_tokens,
                                         long_prompt_policy=cfg.long_prompt_policy, **merged)
    frame.attrs["hash_block_size"] = cfg.hash_block_size
    if cfg.num_adapters:
        if "adapter" in frame.columns:
            raise ValueError(f"workload.num_adapters={cfg.num_adapters} would replace the "
                             f"adapter column of {source}; set num_adapters=0 to replay it")
        # Drawn last, so every other column is what it is without adapters.
        frame["adapter"] = draw_adapters(cfg.num_adapters, cfg.adapter_zipf, rng, len(frame))
    return frame


def draw_adapters(num_adapters: int, zipf: float, rng: np.random.Generator,
                  n: int) -> np.ndarray:
    """``n`` adapter ids in ``[0, num_adapters)``, id ``i`` with probability proportional to
    ``1 / (i + 1) ** zipf``."""
    weights = 1.0 / np.arange(1, num_adapters + 1, dtype=float) ** zipf
    return rng.choice(num_adapters, size=n, p=weights / weights.sum()).astype(np.int64)
