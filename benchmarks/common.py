"""Helpers shared by the benchmark scripts."""

from __future__ import annotations

import re
import resource
import shutil
import subprocess
import sys
import time


class TimedCostModel:
    """Wraps a cost model and notes the wall clock at every call: one call per iteration.

    The wall time between the first and the last call is the simulation's iteration loop alone,
    without start-up (arrivals at t=0) or building the result frames. ``clock`` is the clock
    read (a subclass may read another, e.g. ``time.process_time``).
    """

    clock = staticmethod(time.perf_counter)

    def __init__(self, inner) -> None:
        self.inner = inner
        self.first_at = None
        self.last_at = None
        self.num_calls = 0

    def iteration_time(self, batch) -> float:
        """Delegate, noting the time."""
        now = self.clock()
        if self.first_at is None:
            self.first_at = now
        self.last_at = now
        self.num_calls += 1
        return self.inner.iteration_time(batch)

    def per_iteration_us(self) -> float:
        """Mean wall microseconds per iteration between the first and last call."""
        return (self.last_at - self.first_at) / max(1, self.num_calls - 1) * 1e6


def timed_as_is(model, clock=time.perf_counter):
    """``model`` itself, timed: a copy whose class is a subclass of ``model``'s that notes
    ``clock`` at every ``iteration_time`` (and ``decode_iteration_times``, where the model has
    one) in ``first_at``, ``last_at`` and ``num_calls``, and that keeps every promise and field
    of the model, so the engine runs exactly the path it runs on ``model``.

    What :class:`TimedCostModel` gives up, this keeps: a wrapper without the model's
    ``engine_overhead`` turns async scheduling off (it follows the engine profile), and one that
    does not declare ``pure_iteration_time`` turns quiet runs off. ``simulate`` on this copy
    gives the same frames as on ``model``.
    """
    from simsched.engine.scheduler.quiet import promised

    base = type(model)

    def note(self) -> None:
        now = clock()
        if self.first_at is None:
            self.first_at = now
        self.last_at = now
        self.num_calls += 1

    def iteration_time(self, batch):
        note(self)
        return base.iteration_time(self, batch)

    body = {"pure_iteration_time": promised(model, "pure_iteration_time"),
            "iteration_time": iteration_time}
    if promised(model, "decode_iteration_times"):
        def decode_iteration_times(self, *args):
            note(self)
            return base.decode_iteration_times(self, *args)
        body["decode_iteration_times"] = decode_iteration_times
    timed = object.__new__(type(f"Timed{base.__name__}", (base,), body))
    timed.__dict__.update(vars(model))
    timed.first_at = timed.last_at = None
    timed.num_calls = 0
    return timed


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


_COUNTS = {"instructions": r"I\s+refs:\s+([\d,]+)", "D1 misses": r"D1\s+misses:\s+([\d,]+)",
           "mispredicted branches": r"Mispredicts:\s+([\d,]+)"}


def _cachegrind(module: str, args: list[str]) -> dict:
    """Counts of ``python -m module *args`` run under cachegrind (caches and branches simulated)."""
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=yes", "--branch-sim=yes",
           "--cachegrind-out-file=/dev/null", sys.executable, "-m", module] + args
    done = subprocess.run(cmd, capture_output=True, text=True)
    out = done.stderr
    if done.returncode != 0:
        raise SystemExit(f"{module} {' '.join(args)} under cachegrind failed:\n{out[-2000:]}")
    counts = {}
    for name, pattern in _COUNTS.items():
        found = re.search(pattern, out)
        if found is None:
            raise SystemExit(f"no '{name}' in cachegrind's output:\n{out[-2000:]}")
        counts[name] = int(found.group(1).replace(",", ""))
    return counts


def cachegrind_per_call(module: str, args: list[str]) -> dict:
    """One call's counts: ``module`` runs its work once and three times (``--calls N`` appended
    to ``args``) under cachegrind; the difference over two leaves start-up out."""
    if shutil.which("valgrind") is None:
        raise SystemExit("counting needs valgrind (cachegrind) on the PATH")
    one = _cachegrind(module, args + ["--calls", "1"])
    three = _cachegrind(module, args + ["--calls", "3"])
    return {name: (three[name] - one[name]) / 2 for name in one}


def print_count_ratios(base: dict, other: dict, base_name: str, other_name: str,
                       per: tuple[float, float] = (1.0, 1.0), unit: str = "") -> None:
    """Print each count of two runs (divided by ``per``, e.g. iterations) and their ratio."""
    for name in _COUNTS:
        b, o = base[name] / per[0], other[name] / per[1]
        scale, suffix = (1e6, " M") if b >= 1e6 else (1e3, " k")
        print(f"  {name:<22} {base_name} {b / scale:9.1f}{suffix}{unit}  {other_name} "
              f"{o / scale:9.1f}{suffix}{unit}  ratio {o / b:.2f}")


def add_record_option(parser) -> None:
    """``--record``: write the run's figures to benchmarks/results/ (see benchmarks.results)."""
    parser.add_argument("--record", action="store_true",
                        help="write the figures to benchmarks/results/NAME.json and re-render "
                             "benchmarks/README.md (full runs only)")


def refuse_quick_record(parser, args) -> None:
    """A ``--quick`` run's figures are not the table's: refuse to record them."""
    if getattr(args, "record", False) and getattr(args, "quick", False):
        parser.error("--record keeps a full run's figures: run without --quick")


def record(name: str, variant: str, figures: dict) -> None:
    """Record ``figures`` as variant ``variant`` of script ``name`` (benchmarks.results)."""
    from benchmarks import results

    results.record(name, variant, figures)
