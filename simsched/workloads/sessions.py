"""Multi-turn sessions and shared prompts: distributions and the request tables they make.

A *session* is a conversation: turn ``k+1`` is sent only after turn ``k`` has finished plus a think
time, and its prompt is the whole history (every earlier prompt and output) plus new user tokens,
so a prefix cache can reuse the KV of turn ``k``, generated tokens included. This module only
plans sessions as a request table (one row per turn, columns ``session_id`` and ``think_time``);
the closed loop itself runs in :mod:`simsched.cluster.sessions`.

Distributions are given as a number (a constant) or a tuple: ``("fixed", v)``,
``("uniform", low, high)``, ``("exponential", mean)``, ``("geometric", mean)`` (integers >= 1),
``("lognormal", mean, sigma)`` (``sigma`` of the underlying normal).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

DISTRIBUTIONS = ("fixed", "uniform", "exponential", "geometric", "lognormal")
_ARITY = {"fixed": 1, "uniform": 2, "exponential": 1, "geometric": 1, "lognormal": 2}
# Kinds that give integers (turn counts) and kinds that give non-negative reals (times).
INTEGER_KINDS = ("fixed", "uniform", "geometric")
REAL_KINDS = ("fixed", "uniform", "exponential", "lognormal")


def parse_distribution(name: str, value, integer: bool) -> tuple:
    """``value`` as a checked ``(kind, *params)`` tuple; ValueError naming ``workload.<name>``.

    ``integer`` distributions draw integers >= 1 (turns); the others reals >= 0 (seconds).
    """
    kinds = INTEGER_KINDS if integer else REAL_KINDS
    spec = ("fixed", value) if isinstance(value, (int, float, np.number)) \
        and not isinstance(value, bool) else value
    usage = (f"workload.{name} must be a number or a tuple (kind, *params) with kind one of "
             f"{list(kinds)}, got {value!r}")
    if not isinstance(spec, (tuple, list)) or not spec or spec[0] not in kinds \
            or len(spec) != 1 + _ARITY[spec[0]]:
        raise ValueError(usage)
    kind, params = spec[0], spec[1:]
    if any(isinstance(p, bool) or not isinstance(p, (int, float, np.number))
           or not math.isfinite(p) for p in params):
        raise ValueError(usage)
    params = tuple(float(p) for p in params)
    low = 1.0 if integer else 0.0
    if kind == "uniform":
        ok = low <= params[0] <= params[1]
    elif kind == "fixed":
        ok = params[0] >= low
    elif kind == "lognormal":
        ok = params[0] > 0 and params[1] >= 0
    else:   # exponential, geometric: a mean
        ok = params[0] > 0 if kind == "exponential" else params[0] >= 1
    if integer and kind in ("fixed", "uniform") and any(p != int(p) for p in params):
        ok = False
    if not ok:
        bound = "integers >= 1" if integer else "values >= 0"
        raise ValueError(f"workload.{name}: {kind} parameters {params} must give {bound} "
                         f"(uniform: low <= high; means > 0; geometric mean >= 1)")
    return (kind,) + params


def draw(spec: tuple, rng: np.random.Generator, n: int, integer: bool) -> np.ndarray:
    """``n`` draws of distribution ``spec`` (from :func:`parse_distribution`)."""
    kind, params = spec[0], spec[1:]
    if kind == "fixed":
        out = np.full(n, params[0])
    elif kind == "uniform":
        if integer:
            return rng.integers(int(params[0]), int(params[1]), n, endpoint=True, dtype=np.int64)
        out = rng.uniform(params[0], params[1], n)
    elif kind == "exponential":
        out = rng.exponential(params[0], n)
    elif kind == "geometric":
        return rng.geometric(1.0 / params[0], n).astype(np.int64)
    else:
        mean, sigma = params
        out = rng.lognormal(math.log(mean) - sigma * sigma / 2, sigma, n)
    return out.astype(np.int64) if integer else out


def session_table(starts: np.ndarray, turns: np.ndarray, user: np.ndarray, output: np.ndarray,
                  think: np.ndarray, system_prompt_len: int = 0,
                  groups: np.ndarray | None = None) -> pd.DataFrame:
    """One row per turn of sessions starting at ``starts`` with ``turns`` turns each.

    ``user``, ``output`` and ``think`` hold one value per turn (sessions in order); a turn's prompt
    is the system prompt (``system_prompt_len`` tokens of group ``groups[s]``), every earlier
    turn's user and output tokens, and its own user tokens. The first turn's think time is 0.
    Columns: ``arrival_at`` (the session's start), ``num_prompt_tokens``, ``num_output_tokens``,
    ``session_id``, ``think_time`` and, with a system prompt, ``prefix_group`` and ``prefix_len``.
    """
    turns = np.asarray(turns, dtype=np.int64)
    total = int(turns.sum())
    session = np.repeat(np.arange(len(turns), dtype=np.int64), turns)
    first = np.zeros(total, dtype=bool)
    first[np.concatenate([[0], np.cumsum(turns)[:-1]]).astype(np.int64)[turns > 0]] = True
    # history before each turn: cumulative (user + output) within its session, minus its own
    spent = np.cumsum(user + output)
    base = np.repeat(spent[np.flatnonzero(first)] - (user + output)[first], turns)
    prompt = system_prompt_len + spent - output - base
    frame = pd.DataFrame({"arrival_at": np.repeat(np.asarray(starts, dtype=float), turns),
                          "num_prompt_tokens": prompt.astype(np.int64),
                          "num_output_tokens": np.asarray(output, dtype=np.int64),
                          "session_id": session,
                          "think_time": np.where(first, 0.0, np.asarray(think, dtype=float))})
    if system_prompt_len:
        frame["prefix_group"] = np.repeat(np.asarray(groups, dtype=np.int64), turns)
        frame["prefix_len"] = system_prompt_len
    return frame
