"""Continuous-time arrival processes: when requests arrive.

Every sampler takes the run's ``numpy.random.Generator`` and returns sorted arrival times in
seconds, either ``n`` of them or all those before ``duration``. ``rate`` is always the long-run
mean rate in requests per second, so any process can be rescaled to a target load; burstiness
(the coefficient of variation of inter-arrival gaps) is a separate knob.

The processes are Poisson, Gamma renewal (Poisson is the Gamma with ``cv=1``), deterministic,
and a non-homogeneous Poisson process with a cyclic piecewise-constant rate schedule (an on/off
source is the schedule ``((on, 1), (off, 0))``). Recorded timestamps are rescaled with
:func:`rescale`.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

ARRIVALS = ("poisson", "gamma", "deterministic", "piecewise", "onoff", "trace", "windows",
            "servegen")
# The most arrivals one workload may draw (its request cap, or the expected count of its
# schedule and duration without one): 200 million. A request table holds 40 bytes per
# request (arrival time, two lengths, priority, tenant: 8 bytes each), the run's requests
# several times that, so this is already tens of GiB; benchmarks/fleet_day.py's 64-replica day
# is 11.7 million. A schedule of 1e12 req/s would otherwise ask for terabytes before failing.
MAX_ARRIVALS = 200_000_000


def _expected_count(rate: float, duration: float, cv: float = 1.0) -> int:
    # Mean plus ten standard deviations of a renewal count, so one batch of gaps almost always
    # covers the window; the fill loop below tops it up in the rare case it does not.
    return int(rate * duration + 10 * cv * math.sqrt(rate * duration) + 10)


def _renewal(draw_gaps: Callable[[int], np.ndarray], rate: float, cv: float, n: int | None,
             duration: float | None) -> np.ndarray:
    """Cumulative sums of i.i.d. gaps: ``n`` arrivals, or those before ``duration``."""
    if n is not None:
        times = np.cumsum(draw_gaps(n))
        return times[times < duration] if duration is not None else times
    if duration is None:
        raise ValueError("need n or duration")
    chunks = [np.cumsum(draw_gaps(_expected_count(rate, duration, cv)))]
    while chunks[-1][-1] < duration:
        more = np.cumsum(draw_gaps(_expected_count(rate, duration, cv))) + chunks[-1][-1]
        chunks.append(more)
    times = np.concatenate(chunks)
    return times[times < duration]


def poisson(rng: np.random.Generator, rate: float, n: int | None = None,
            duration: float | None = None) -> np.ndarray:
    """Arrival times of a Poisson process at ``rate``: ``n`` of them, or all within ``duration``.

    Draws exactly the gaps the original lesson workload drew, so seeded runs keep their numbers.
    """
    return _renewal(lambda k: rng.exponential(1.0 / rate, k), rate, 1.0, n, duration)


def gamma(rng: np.random.Generator, rate: float, cv: float, n: int | None = None,
          duration: float | None = None) -> np.ndarray:
    """A Gamma renewal process: mean gap ``1/rate``, gap coefficient of variation ``cv``.

    ``cv > 1`` is burstier than Poisson (clusters and long silences), ``cv < 1`` more regular,
    ``cv = 1`` is Poisson.
    """
    shape = 1.0 / cv**2
    return _renewal(lambda k: rng.gamma(shape, 1.0 / (rate * shape), k), rate, cv, n, duration)


def deterministic(rate: float, n: int | None = None, duration: float | None = None) -> np.ndarray:
    """Evenly spaced arrivals every ``1/rate`` seconds, the first at ``1/rate``."""
    if n is None:
        n = max(0, math.ceil(duration * rate) + 1)
    times = np.arange(1, n + 1, dtype=float) / rate
    return times[times < duration] if duration is not None else times


def schedule_mean_rate(schedule) -> float:
    """Time-averaged rate of a ``((seconds, rate), ...)`` schedule over one cycle."""
    seconds = np.array([s for s, _ in schedule], dtype=float)
    rates = np.array([r for _, r in schedule], dtype=float)
    return float((seconds * rates).sum() / seconds.sum())


def piecewise(rng: np.random.Generator, schedule, n: int | None = None,
              duration: float | None = None, rate: float | None = None) -> np.ndarray:
    """A Poisson process whose rate follows ``schedule``, repeated cyclically.

    ``schedule`` is ``((seconds, rate), ...)``: the rate is ``rate_0`` for the first ``seconds_0``
    seconds, and so on; after the last segment it starts over. If ``rate`` is given the schedule
    is scaled so its time average equals it (the shape is kept). Sampled by time change: unit-rate
    Poisson points in cumulative-intensity space mapped back through the inverse intensity.
    """
    seconds = np.array([s for s, _ in schedule], dtype=float)
    rates = np.array([r for _, r in schedule], dtype=float)
    if rate is not None:
        rates = rates * (rate / schedule_mean_rate(schedule))
    bounds = np.concatenate([[0.0], np.cumsum(seconds)])
    intensity = np.concatenate([[0.0], np.cumsum(seconds * rates)])
    cycle_seconds, cycle_intensity = bounds[-1], intensity[-1]
    if duration is not None:
        points = poisson(rng, 1.0, None, _intensity_at(duration, bounds, intensity, rates))
    else:
        points = poisson(rng, 1.0, n)
    cycles, within = np.divmod(points, cycle_intensity)
    # side="right" skips zero-rate segments, whose intensity interval is empty.
    seg = np.searchsorted(intensity, within, side="right") - 1
    seg = np.minimum(seg, len(rates) - 1)
    times = cycles * cycle_seconds + bounds[seg] + (within - intensity[seg]) / rates[seg]
    return times[:n] if n is not None else times


def _intensity_at(t: float, bounds: np.ndarray, intensity: np.ndarray, rates: np.ndarray) -> float:
    """Cumulative intensity of the cyclic schedule at time ``t``."""
    cycles, within = divmod(t, bounds[-1])
    seg = min(int(np.searchsorted(bounds, within, side="right")) - 1, len(rates) - 1)
    return cycles * intensity[-1] + intensity[seg] + (within - bounds[seg]) * rates[seg]


def onoff(rng: np.random.Generator, rate: float, on_seconds: float, off_seconds: float,
          n: int | None = None, duration: float | None = None) -> np.ndarray:
    """Poisson bursts: ``on_seconds`` of traffic, ``off_seconds`` of silence, mean rate ``rate``.

    The rate during an on period is ``rate * (on + off) / on``.
    """
    return piecewise(rng, ((on_seconds, 1.0), (off_seconds, 0.0)), n, duration, rate)


def recorded_rate(times: np.ndarray) -> float:
    """Mean rate of sorted arrival times: one over the mean gap (NaN with fewer than 2)."""
    if len(times) < 2 or times[-1] <= times[0]:
        return math.nan
    return (len(times) - 1) / float(times[-1] - times[0])


def rescale(times: np.ndarray, speedup: float = 1.0, rate: float | None = None,
            origin: float = 0.0) -> np.ndarray:
    """Compress recorded arrival times by ``speedup``, or to mean rate ``rate`` if given.

    Times are scaled about ``origin`` (the window start), so gaps shrink by the same factor
    and the first arrival keeps its offset from the window start, scaled.
    """
    times = np.asarray(times, dtype=float)
    if rate is not None:
        current = recorded_rate(times)
        if math.isnan(current):
            raise ValueError(f"cannot rescale {len(times)} arrival(s) to a rate: need at least "
                             "two distinct timestamps")
        speedup = rate / current
    return (times - origin) / speedup
