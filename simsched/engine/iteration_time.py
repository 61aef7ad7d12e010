"""Checking a cost model's iteration time before the GPU loop moves the clock by it.

The loop (:meth:`simsched.engine.replica.Replica._gpu`) checks each time cheaply inline (a
``float``, positive, finite, and at least the clock's resolution at the current power of two)
and calls :func:`checked_duration` only when that fails or the clock crosses a power of two. It
converts other real numbers to seconds, refreshes the resolution bounds, and raises a clear
:class:`IterationTimeError` naming the cost model and the batch for anything unusable.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

# An iteration must span at least this many float spacings of the clock (relative error <= 0.05 %).
MIN_ULPS = 1024


class IterationTimeError(ValueError):
    """A cost model's iteration time is unusable: not a number, not finite and positive, or too
    small to advance the clock at the current time (float resolution)."""


def cost_name(cost_model) -> str:
    """How errors name ``cost_model``: its own ``repr`` if it has one, else its class."""
    own_repr = type(cost_model).__repr__ is not object.__repr__
    return repr(cost_model) if own_repr else type(cost_model).__qualname__


def checked_duration(duration, batch, started: float, cost_model) -> tuple[float, float, float]:
    """``duration`` (``cost_model``'s time of ``batch``, starting at ``started``) as usable
    seconds, or an :class:`IterationTimeError`; with the clock's resolution at ``started``: the
    least duration it resolves, and the power of two below which that holds."""
    if duration.__class__ is not float:
        duration = _seconds(duration, batch, started, cost_model)
    ulp_floor = math.ulp(started) * MIN_ULPS
    exp = math.frexp(started)[1]
    ulp_below = 0.0 if started <= 0 else math.ldexp(1.0, exp) if exp < 1024 else math.inf
    if not (duration >= ulp_floor and started + duration < math.inf):
        _bad_duration(duration, batch, started, cost_model)
    return duration, ulp_floor, ulp_below


def _seconds(value, batch, now: float, cost_model) -> float:
    """A cost model's non-``float`` return value as seconds (ints and numpy reals pass)."""
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
        return float(value)
    raise IterationTimeError(
        f"cost model {cost_name(cost_model)} returned {value!r} ({type(value).__name__}, not a "
        f"number of seconds) for {batch!r} at t={now!r}")


def _bad_duration(duration: float, batch, now: float, cost_model) -> None:
    if duration > 0 and now + duration < math.inf:
        raise IterationTimeError(
            f"cost model {cost_name(cost_model)} returned {duration!r} s for {batch!r} at "
            f"t={now!r} s, below the clock's float resolution there (spacing "
            f"{math.ulp(now):.3g} s; an iteration must span {MIN_ULPS} of them): latencies "
            f"would round to nothing. Shift the arrival times to start near 0 (times this "
            f"large are rejected, not shifted) or check the cost model's units")
    why = ("overflows the clock" if duration > 0 else "must be a finite number > 0")
    raise IterationTimeError(
        f"cost model {cost_name(cost_model)} returned {duration!r} s for {batch!r} at t={now!r} "
        f"s: an iteration time {why}")
