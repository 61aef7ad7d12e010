"""Memory of a sweep's parent process: 8 runs of 100,000 requests, frames kept and combined.

``python -m benchmarks.sweep_memory [--runs N] [--num-requests N] [--workers N]``

Prints the parent's resident memory after the sweep returns and after the combined
``requests`` and ``iterations`` frames are built (each run's own frame is dropped as it is
combined, so one copy of each frame is kept), and its peak.
"""

from __future__ import annotations

import argparse

from benchmarks.common import peak_rss_mb
from benchmarks.common import add_record_option, record
from simsched import SimConfig
from simsched.analysis.sweep import sweep


def _current_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20
    except OSError:
        return float("nan")


def main(argv=None) -> None:
    """Run the sweep and print the parent's memory."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--num-requests", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2)
    add_record_option(parser)
    args = parser.parse_args(argv)
    if args.record and (args.runs, args.num_requests, args.workers) != (8, 100_000, 2):
        parser.error("--record keeps the default run's figures: drop --runs/--num-requests/"
                     "--workers")
    base = SimConfig().replace(num_requests=args.num_requests, rate=40.0)
    res = sweep(base, seed=list(range(args.runs)), max_workers=args.workers, progress=False)
    after_sweep = _current_mb()
    rows = len(res.requests) + len(res.iterations)
    print(f"{args.runs} runs x {args.num_requests} requests ({rows} frame rows combined): parent "
          f"{after_sweep:.0f} MiB after the sweep, {_current_mb():.0f} MiB with the combined "
          f"frames, peak {peak_rss_mb():.0f} MiB")
    if args.record:
        record("sweep_memory", "full", {"after_sweep_mib": after_sweep,
                                        "with_frames_mib": _current_mb(),
                                        "peak_mib": peak_rss_mb(), "rows_m": rows / 1e6})


if __name__ == "__main__":
    main()
