"""Progress shown while simulating: a tqdm bar on a terminal, plain periodic lines in a log.

A bar redraws itself with carriage returns, which a log file (stderr redirected) keeps as one
long line of bar states; so a bar is drawn only where it can be redrawn (a terminal, or a
Jupyter kernel's widget), and elsewhere progress is a plain line every :data:`PLAIN_INTERVAL`
seconds (none for shorter tasks).

A single run's progress (:class:`RunWatcher`) is read from the cluster's counters by a thread
that wakes twice a second: the simulation does no extra work for it, and its results cannot
change.
"""

from __future__ import annotations

import sys
import threading
import time

# Seconds between two plain progress lines (stderr not a terminal).
PLAIN_INTERVAL = 30.0
# Seconds between two looks at a running simulation's counters.
WATCH_INTERVAL = 0.5


def _interactive(stream) -> bool:
    """Whether ``stream`` can show a redrawn bar: a terminal, or a Jupyter kernel's stream."""
    if type(stream).__module__.startswith("ipykernel"):
        return True
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (ValueError, OSError):        # closed or detached
        return False


class PlainProgress:
    """The part of tqdm's interface the simulator uses, as plain lines on stderr: one every
    :data:`PLAIN_INTERVAL` seconds (the first after that long), and a last one on ``close`` if
    any was written."""

    def __init__(self, total: int | None, desc: str, unit: str) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.n = 0
        self.postfix = ""
        self.started = self.last = time.monotonic()
        self.written = ""                # the last line's count and postfix

    def update(self, n: int = 1) -> None:
        """Count ``n`` more done; write a line if the last one is old enough."""
        self.n += n
        now = time.monotonic()
        if now - self.last >= PLAIN_INTERVAL:
            self.last = now
            self._write(now)

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        """Text shown after the count (e.g. the simulated time)."""
        self.postfix = text

    def close(self) -> None:
        """End with a last line, if any line was written (a short task writes none) and the
        count moved since."""
        if self.written and self.written != self._state():
            self._write(time.monotonic())

    def _state(self) -> str:
        total = f"/{self.total:,}" if self.total else ""
        postfix = f", {self.postfix}" if self.postfix else ""
        return f"{self.n:,}{total} {self.unit}{postfix}"

    def _write(self, now: float) -> None:
        self.written = self._state()
        print(f"{self.desc}: {self.written} ({now - self.started:,.0f} s elapsed)",
              file=sys.stderr, flush=True)


def progress_bar(total: int | None, desc: str, unit: str, delay: float = 0.0):
    """A tqdm bar where it can be redrawn (shown after ``delay`` seconds), else
    :class:`PlainProgress`."""
    if _interactive(sys.stderr):
        try:
            from tqdm.auto import tqdm
        except ImportError:
            pass
        else:
            return tqdm(total=total, desc=desc, unit=unit, leave=False, delay=delay)
    return PlainProgress(total, desc, unit)


class RunWatcher:
    """Shows a running simulation's progress: requests arrived (of ``total``, if known) and the
    simulated time, read from ``engine`` (a :class:`~simsched.cluster.cluster.Cluster`) by a
    thread; a context manager around ``engine.run()``.

    The bar appears after ``delay`` seconds, so short runs show nothing.
    """

    def __init__(self, engine, total: int | None, desc: str = "simulate, arrived",
                 delay: float = 1.0) -> None:
        self.engine, self.total, self.desc, self.delay = engine, total, desc, delay
        self._stop = threading.Event()
        self._bar = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "RunWatcher":
        self._bar = progress_bar(self.total, self.desc, "req", self.delay)
        self._thread = threading.Thread(target=self._loop, name="simsched-progress",
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._show()
        self._bar.close()

    def _loop(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL):
            self._show()

    def _show(self) -> None:
        # Plain reads of two numbers the simulation keeps anyway.
        arrived, now = self.engine.num_arrived, self.engine.env.now
        self._bar.set_postfix_str(f"simulated {now:,.1f} s", refresh=False)
        self._bar.update(arrived - self._bar.n)
