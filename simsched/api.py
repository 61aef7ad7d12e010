"""The Python entry point: ``simulate(config, requests=None, cost_model=None) -> Results``."""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np
import pandas as pd

from simsched import hardware
from simsched.config import SimConfig
from simsched.engine import Engine
from simsched.metrics import Results, build_iterations_frame, build_requests_frame
from simsched.request import Request
from simsched.workload import generate

_FIELDS = ("arrival_at", "num_prompt_tokens", "num_output_tokens", "priority", "tenant")


def make_requests(table: Any) -> list[Request]:
    """Turn a request table into ``Request`` objects sorted by arrival, ids 0..n-1 in that order.

    ``table`` may be a DataFrame with columns ``arrival_at, num_prompt_tokens,
    num_output_tokens`` (optional ``priority``, ``tenant``), or an iterable of tuples
    ``(arrival_at, prompt, output[, priority[, tenant]])`` or of dicts with those keys.
    """
    if isinstance(table, pd.DataFrame):
        missing = [c for c in _FIELDS[:3] if c not in table.columns]
        if missing:
            raise ValueError(f"requests table lacks column(s) {missing}")
        rows = table.to_dict("records")
    else:
        rows = []
        for i, item in enumerate(table):
            if isinstance(item, dict):
                rows.append(item)
            else:
                item = tuple(item)
                if not 3 <= len(item) <= 5:
                    raise ValueError(f"requests[{i}]: expected (arrival_at, prompt, output"
                                     f"[, priority[, tenant]]), got {item!r}")
                rows.append(dict(zip(_FIELDS, item)))
    parsed = []
    for i, row in enumerate(rows):
        try:
            arrival = float(row["arrival_at"])
            prompt = row["num_prompt_tokens"]
            output = row["num_output_tokens"]
        except KeyError as exc:
            raise ValueError(f"requests[{i}] lacks field {exc.args[0]!r}") from None
        except (TypeError, ValueError):
            raise ValueError(f"requests[{i}].arrival_at must be a number, "
                             f"got {row.get('arrival_at')!r}") from None
        if not math.isfinite(arrival) or arrival < 0:
            raise ValueError(f"requests[{i}].arrival_at must be finite and >= 0, got {arrival}")
        for name, value in (("num_prompt_tokens", prompt), ("num_output_tokens", output)):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
                    or value < 1:
                raise ValueError(f"requests[{i}].{name} must be an integer >= 1, got {value!r}")
        prio = row.get("priority", 0)
        prio = 0 if prio is None or (isinstance(prio, float) and math.isnan(prio)) else prio
        if isinstance(prio, float) and prio.is_integer():
            prio = int(prio)
        if not isinstance(prio, (int, np.integer)) or isinstance(prio, bool):
            raise ValueError(f"requests[{i}].priority must be an integer, got {prio!r}")
        tenant = row.get("tenant")
        if isinstance(tenant, float) and math.isnan(tenant):
            tenant = None
        parsed.append((arrival, i, int(prompt), int(output), int(prio), tenant))
    parsed.sort()
    return [Request(n, a, p, o, pr, t) for n, (a, _, p, o, pr, t) in enumerate(parsed)]


def simulate(config: SimConfig | None = None, requests: Iterable | pd.DataFrame | None = None,
             cost_model=None) -> Results:
    """Run one simulation and return its :class:`~simsched.metrics.Results`.

    ``requests`` overrides the configured workload (a table or tuples, see
    :func:`make_requests`); ``cost_model`` overrides the one named by ``config.hardware``.
    The same config and seed give identical frames.
    """
    config = config or SimConfig()
    if not isinstance(config, SimConfig):
        raise ValueError(f"config must be a SimConfig, got {type(config).__name__}")
    rng = np.random.default_rng(config.seed)
    table = generate(config.workload, rng) if requests is None else requests
    reqs = make_requests(table)
    if cost_model is None:
        cost_model = hardware.make_cost_model(config.hardware)
    elif not callable(getattr(cost_model, "iteration_time", None)):
        raise ValueError("cost_model must have an iteration_time(batch) method")
    num_blocks = config.cache.num_blocks
    if num_blocks is None:
        num_blocks = hardware.kv_capacity_blocks(config.hardware, config.cache.block_size)
    engine = Engine(config, reqs, cost_model, num_blocks, hardware.max_model_len(config.hardware))
    engine.run()
    sched = engine.scheduler
    step_end = np.asarray(sched.step_end_at, dtype=float)
    req_df, itl, causes = build_requests_frame(reqs, step_end)
    info = {"num_blocks": num_blocks, "num_events": engine.num_events,
            "num_waiting_at_end": sched.num_waiting, "num_running_at_end": len(sched.running)}
    return Results(req_df, build_iterations_frame(engine.iteration_rows), itl, causes,
                   config=config, sim_time=engine.env.now, info=info)
