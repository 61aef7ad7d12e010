"""Times between failures and times to repair (``SimConfig.faults``): distributions and per-pool
values.

A *lifetime* is a number (the mean of an exponential, the memoryless failure process of
``faults.mtbf`` since it was added) or a tuple ``(kind, *params)``:

* ``("exponential", mean)``;
* ``("weibull", shape, scale)``: ``scale * W`` with ``W`` a standard Weibull of that shape (shape
  below 1: infant mortality, failures cluster early; above 1: wear-out);
* ``("lognormal", mean, sigma)``: a lognormal with that mean and log-space sigma (as the
  workload's lognormal);
* ``("fixed", value)`` and ``("uniform", low, high)``.

A *per-pool* value is a tuple of ``(pool name, lifetime)`` pairs, one per pool that differs; a pool
not named has none (for ``mtbf``: it never fails). Draws come from the caller's seeded Generator,
one call per draw, so a run's failure times depend only on its seed.
"""

from __future__ import annotations

import math

import numpy as np

from simsched.config.serialize import _tuples

__all__ = ["LIFETIME_KINDS", "parse_lifetime", "parse_per_pool", "is_per_pool", "for_pool",
           "draw_lifetime", "lifetime_mean"]

LIFETIME_KINDS = {"exponential": 1, "weibull": 2, "lognormal": 2, "fixed": 1, "uniform": 2}


def _usage(where: str, value) -> str:
    return (f"{where} must be a number (an exponential's mean) or a tuple (kind, *params) with "
            f"kind one of {sorted(LIFETIME_KINDS)} (exponential: mean; weibull: shape, scale; "
            f"lognormal: mean, sigma; fixed: value; uniform: low, high), got {value!r}")


def parse_lifetime(where: str, value) -> tuple:
    """``value`` as a checked ``(kind, *params)`` tuple; ValueError naming ``where``."""
    value = _tuples(value)
    if isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
        value = ("exponential", value)
    if not isinstance(value, tuple) or not value or value[0] not in LIFETIME_KINDS \
            or len(value) != 1 + LIFETIME_KINDS[value[0]]:
        raise ValueError(_usage(where, value))
    kind, params = value[0], value[1:]
    if any(isinstance(p, bool) or not isinstance(p, (int, float, np.number))
           or not math.isfinite(p) for p in params):
        raise ValueError(_usage(where, value))
    params = tuple(float(p) for p in params)
    if kind == "uniform":
        ok = 0 <= params[0] <= params[1] and params[1] > 0
    elif kind == "lognormal":
        ok = params[0] > 0 and params[1] >= 0
    else:       # exponential mean, weibull shape and scale, fixed value: > 0
        ok = all(p > 0 for p in params)
    if not ok:
        raise ValueError(f"{where}: {kind} parameters {params} must be > 0 (uniform: 0 <= low "
                         "<= high, high > 0; lognormal: mean > 0, sigma >= 0)")
    return (kind,) + params


def parse_per_pool(where: str, value, parse) -> tuple:
    """``value`` as either one ``parse``\\ d value for every pool (returned as is) or a tuple of
    ``(pool name, parsed value)`` pairs (a per-pool value: the first element is itself a pair)."""
    value = _tuples(value)
    if isinstance(value, tuple) and value and isinstance(value[0], tuple):
        out, seen = [], set()
        for entry in value:
            if not isinstance(entry, tuple) or len(entry) != 2 or not isinstance(entry[0], str) \
                    or not entry[0]:
                raise ValueError(f"{where}: a per-pool value must be ((pool name, value), ...), "
                                 f"got {value!r}")
            if entry[0] in seen:
                raise ValueError(f"{where}: pool {entry[0]!r} is named twice")
            seen.add(entry[0])
            out.append((entry[0], parse(f"{where}[{entry[0]!r}]", entry[1])))
        return tuple(out)
    return parse(where, value)


def is_per_pool(value) -> bool:
    """Whether a parsed value is per pool (pairs) rather than one value for every pool."""
    return isinstance(value, tuple) and bool(value) and isinstance(value[0], tuple)


def for_pool(value, pool: str, default=None):
    """A parsed (possibly per-pool) value for ``pool``: its own, or ``default`` if not named."""
    if is_per_pool(value):
        return dict(value).get(pool, default)
    return value


def draw_lifetime(spec: tuple, rng: np.random.Generator) -> float:
    """One draw (seconds) of lifetime ``spec`` (from :func:`parse_lifetime`)."""
    kind, params = spec[0], spec[1:]
    if kind == "exponential":
        return float(rng.exponential(params[0]))
    if kind == "weibull":
        return float(params[1] * rng.weibull(params[0]))
    if kind == "lognormal":
        mean, sigma = params
        return float(rng.lognormal(math.log(mean) - sigma * sigma / 2, sigma))
    if kind == "uniform":
        return float(rng.uniform(params[0], params[1]))
    return params[0]


def lifetime_mean(spec: tuple) -> float:
    """The mean of lifetime ``spec`` (seconds)."""
    kind, params = spec[0], spec[1:]
    if kind == "weibull":
        return params[1] * math.gamma(1.0 + 1.0 / params[0])
    if kind == "uniform":
        return (params[0] + params[1]) / 2
    return params[0]
