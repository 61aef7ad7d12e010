"""Time-varying load: arrivals driven by a rate schedule of windows, per client (ServeGen).

A *window table* lists, per client and window, ``start`` and ``seconds`` (the window), ``rate``
(requests/s), ``cv`` (coefficient of variation of the inter-arrival gaps) and ``family`` (the gap
distribution: ``gamma`` or ``weibull``, as ServeGen fits them). Within a window a client's
arrivals are a *stationary* renewal process of that family with mean gap ``1/rate`` and that CV:
the first arrival comes after a residual gap (drawn from the length-biased gap times a uniform),
so the expected count in a window is exactly ``rate * seconds`` even for CV 8 (a renewal process
restarted at each window start would add about ``(cv**2 - 1) / 2`` arrivals per window). The
clients' arrivals are merged. Each family's parameters are derived from the rate and CV, so a
schedule can be rescaled to any mean rate (scale factor) without changing its shape.

:func:`read_servegen` reads ServeGen's per-client window files (the bundled day, or the full
``client_windows.csv(.gz)``); :func:`windows_from_schedule` turns a ``((seconds, rate[, cv]),
...)`` schedule into a one-client table.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

DATA = Path(__file__).resolve().parent / "data" / "traces" / "servegen-language"
BUNDLED_SERVEGEN = DATA / "servegen_day0_windows.csv.gz"
SERVEGEN_MODELS = ("m-large", "m-mid", "m-small")
FAMILIES = ("gamma", "weibull")
WINDOW_COLUMNS = ("client", "start", "seconds", "rate", "cv", "family")


@lru_cache(maxsize=1)
def _weibull_table() -> tuple[np.ndarray, np.ndarray]:
    # CV of a Weibull falls monotonically with its shape k: tabulate log(cv) against log(k).
    k = np.logspace(math.log10(0.06), math.log10(60.0), 4000)
    lg1 = np.array([math.lgamma(1 + 1 / x) for x in k])
    lg2 = np.array([math.lgamma(1 + 2 / x) for x in k])
    cv = np.sqrt(np.expm1(lg2 - 2 * lg1))
    return np.log(cv[::-1]), np.log(k[::-1])


def weibull_shape(cv: float) -> float:
    """The Weibull shape ``k`` whose gaps have coefficient of variation ``cv`` (tabulated for
    ``k`` in 0.06..60: CVs from about 0.02 to far beyond the largest ServeGen fits, 149)."""
    log_cv, log_k = _weibull_table()
    return float(np.exp(np.interp(math.log(cv), log_cv, log_k)))


def _gaps(rng: np.random.Generator, family: str, rate: float, cv: float):
    """``(draw(k), draw_residual())``: k i.i.d. gaps, and one stationary first gap."""
    if family == "gamma":
        shape = 1.0 / cv**2
        scale = 1.0 / (rate * shape)
        # Length-biased Gamma(shape) is Gamma(shape + 1); a uniform point of it is the residual.
        return (lambda k: rng.gamma(shape, scale, k),
                lambda: rng.gamma(shape + 1.0, scale) * rng.random())
    k_shape = weibull_shape(cv)
    scale = 1.0 / (rate * math.gamma(1.0 + 1.0 / k_shape))
    # Length-biased Weibull: scale * G**(1/k) with G ~ Gamma(1 + 1/k).
    return (lambda k: scale * rng.weibull(k_shape, k),
            lambda: scale * rng.gamma(1.0 + 1.0 / k_shape) ** (1.0 / k_shape) * rng.random())


def window_arrivals(rng: np.random.Generator, start: float, seconds: float, rate: float,
                    cv: float, family: str = "gamma", limit: int | None = None) -> np.ndarray:
    """Arrival times in ``[start, start + seconds)`` of a stationary renewal process; with
    ``limit``, only the first ``limit`` of them (at most ``limit`` gaps are drawn at once, and
    drawing stops once that many are known: a window of 1e12 req/s costs what ``limit`` does)."""
    if rate <= 0:
        return np.empty(0)
    draw, residual = _gaps(rng, family, rate, cv)
    first = residual()
    if first >= seconds:
        return np.empty(0)
    chunk = _first_batch(rate, seconds, cv)
    if limit is not None:
        chunk = min(chunk, limit)
    chunks = [first + np.concatenate([[0.0], np.cumsum(draw(chunk))])]
    drawn = len(chunks[0])
    while chunks[-1][-1] < seconds and (limit is None or drawn < limit):
        chunks.append(chunks[-1][-1] + np.cumsum(draw(chunk)))
        drawn += chunk
    times = np.concatenate(chunks)
    times = times[times < seconds]
    return start + (times if limit is None else times[:limit])


def _first_batch(rate: float, seconds: float, cv: float) -> int:
    """The gaps :func:`window_arrivals` draws at once: the mean count plus ten standard
    deviations (a second batch is drawn in the rare case they end inside the window)."""
    mean = rate * seconds
    return int(mean + 10 * cv * math.sqrt(mean) + 10)


def _capacity(rows: list, scale: float, limit: int | None = None) -> int:
    """Arrivals the windows ``rows`` hold if none draws a second batch of gaps (at most
    ``limit`` + 1 each, with a limit)."""
    return sum(min(_first_batch(r * scale, seconds, cv), limit if limit is not None else math.inf)
               + 1 for _, seconds, r, cv, _ in rows if r * scale > 0)


def _grown(buffer: np.ndarray, used: int, need: int) -> np.ndarray:
    """A larger buffer holding ``buffer[:used]`` (at least ``need`` long, doubling)."""
    bigger = np.empty(max(need, 2 * len(buffer)))
    bigger[:used] = buffer[:used]
    return bigger


def windowed(rng: np.random.Generator, windows: pd.DataFrame, rate: float | None = None,
             duration: float | None = None, n: int | None = None) -> np.ndarray:
    """Sorted arrival times of a window table (all clients merged).

    ``rate``, if given, scales every window's rate so the mean over the schedule's span equals
    it (the shape, CVs and client mix are kept). ``duration`` keeps arrivals before it, ``n``
    the first ``n``.

    With ``n``, only what the first ``n`` need is drawn: each window at most its first ``n``
    arrivals (no later one of it can be among the first ``n`` overall), and the windows in
    order of start only until ``n`` arrivals are known before the next window's start (no
    later window can then add one). So ``n`` requests of a ServeGen day at any rate cost what
    ``n`` do, not the day. The draws then differ from those of the whole table (the random
    stream stops early), as any sample of the same process does; without ``n`` every window is
    drawn, as before.
    """
    scale = 1.0 if rate is None else rate / mean_rate(windows)
    rows = [row for row in zip(
        windows["start"].to_numpy(float), windows["seconds"].to_numpy(float),
        windows["rate"].to_numpy(float), windows["cv"].to_numpy(float),
        windows["family"].tolist()) if duration is None or row[0] < duration]
    # The earliest start among the windows after each one (the table need not be sorted).
    later = np.minimum.accumulate(np.array([r[0] for r in rows] + [math.inf])[::-1])[::-1]
    # Each window is drawn as before and written into one buffer, sized for the first batch of
    # gaps every window draws (it holds all its arrivals unless a window needs a second batch):
    # a day of a big fleet is tens of millions of arrivals, held once, not as parts and their
    # concatenation. Pages of the buffer never written are never backed by memory.
    times = np.empty(_capacity(rows, scale, n))
    end = 0
    for i, (start, seconds, r, cv, family) in enumerate(rows):
        part = window_arrivals(rng, start, seconds, r * scale, cv, family, n)
        if end + len(part) > len(times):
            times = _grown(times, end, end + len(part))
        times[end:end + len(part)] = part
        end += len(part)
        if n is not None and end >= n and later[i + 1] > later[i] \
                and np.count_nonzero(times[:end] < later[i + 1]) >= n:
            break
    # Sorted in place and cut by slices (no second sorted copy, no masked copy).
    times = times[:end]
    times.sort()
    if duration is not None:
        times = times[:np.searchsorted(times, duration, side="left")]
    return times[:n] if n is not None else times


def expected_arrivals(windows: pd.DataFrame, rate: float | None = None,
                      duration: float | None = None) -> float:
    """The expected number of arrivals :func:`windowed` draws from ``windows`` (scaled to
    ``rate``, cut at ``duration``, without a request cap): each window's rate times the part
    of it before ``duration``."""
    scale = 1.0 if rate is None else rate / mean_rate(windows)
    start, seconds = windows["start"].to_numpy(float), windows["seconds"].to_numpy(float)
    end = start + seconds if duration is None else np.minimum(start + seconds, duration)
    return float(scale * (windows["rate"].to_numpy(float) * np.clip(end - start, 0.0, None)).sum())


def span(windows: pd.DataFrame) -> tuple[float, float]:
    """``(first window start, last window end)`` of a window table (a read period's own span,
    silent windows included, when :func:`read_servegen` recorded it)."""
    if "span" in windows.attrs:
        return windows.attrs["span"]
    return (float(windows["start"].min()),
            float((windows["start"] + windows["seconds"]).max()))


def mean_rate(windows: pd.DataFrame) -> float:
    """Mean request rate over the table's span (all clients)."""
    lo, hi = span(windows)
    return float((windows["rate"] * windows["seconds"]).sum() / (hi - lo))


def total_rates(windows: pd.DataFrame) -> pd.Series:
    """Total rate (all clients) per window start, every window of the span included."""
    return windows.groupby("start")["rate"].sum().sort_index()


def compress(windows: pd.DataFrame, speedup: float) -> pd.DataFrame:
    """The table on a clock ``speedup`` times faster: windows shorter, rates higher (the same
    requests in expectation)."""
    if speedup == 1.0:
        return windows
    lo, hi = span(windows)
    out = windows.assign(start=windows["start"] / speedup, seconds=windows["seconds"] / speedup,
                         rate=windows["rate"] * speedup)
    out.attrs["span"] = (lo / speedup, hi / speedup)
    return out


def windows_from_schedule(schedule, cv: float = 1.0, family: str = "gamma") -> pd.DataFrame:
    """A one-client window table from ``((seconds, rate[, cv]), ...)``, windows back to back."""
    rows, t = [], 0.0
    for entry in schedule:
        seconds, r = float(entry[0]), float(entry[1])
        rows.append((0, t, seconds, r, float(entry[2]) if len(entry) > 2 else cv, family))
        t += seconds
    return pd.DataFrame(rows, columns=list(WINDOW_COLUMNS))


def read_servegen(path: str | Path | None = None, model: str = "m-large", start: float = 0.0,
                  duration: float | None = None, window_seconds: float = 600.0) -> pd.DataFrame:
    """Model ``model``'s client windows from a ServeGen window file, as a window table.

    ``path`` defaults to the bundled day (:data:`BUNDLED_SERVEGEN`); the full
    ``client_windows.csv.gz`` (14 days) reads the same way. Windows starting in ``[start,
    start + duration)`` are kept and shifted so ``start`` is time 0. Rows without traffic are
    dropped. A missing column, an unknown model or a bad value raises ValueError naming the file.
    """
    path = Path(path) if path is not None else BUNDLED_SERVEGEN
    try:
        table = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read a ServeGen window file: {exc}") from None
    need = {"model", "client", "window_start_s", "rate", "cv", "dist"}
    missing = need - set(table.columns)
    if missing:
        raise ValueError(f"{path}: missing column(s) {sorted(missing)} of a ServeGen window "
                         f"file (has {list(table.columns)})")
    models = sorted(table["model"].unique())
    if model not in models:
        raise ValueError(f"{path}: no model {model!r}; the file has {models}")
    table = table[(table["model"] == model) & (table["rate"] > 0)]
    end = math.inf if duration is None else start + duration
    table = table[(table["window_start_s"] >= start) & (table["window_start_s"] < end)]
    if table.empty:
        raise ValueError(f"{path}: model {model!r} has no traffic in [{start}, {end}) s")
    rate, cv = table["rate"].to_numpy(float), table["cv"].to_numpy(float)
    bad = ~(np.isfinite(rate) & np.isfinite(cv) & (cv > 0))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{path}: row {table.index[row] + 2}: rate and cv must be finite and "
                         f"cv > 0, got rate={rate[row]!r}, cv={cv[row]!r}")
    family = table["dist"].fillna("Gamma").str.lower()
    unknown = sorted(set(family) - set(FAMILIES))
    if unknown:
        raise ValueError(f"{path}: unknown gap famil(ies) {unknown}; known: Gamma, Weibull")
    out = pd.DataFrame({"client": table["client"].to_numpy(np.int64),
                        "start": table["window_start_s"].to_numpy(float) - start,
                        "seconds": window_seconds, "rate": rate, "cv": cv,
                        "family": family.to_numpy(object)})
    # The span runs to the end of the requested period, silent windows included.
    out.attrs["span"] = (0.0, duration if duration is not None
                         else float(out["start"].max()) + window_seconds)
    return out.sort_values(["start", "client"], ignore_index=True)
