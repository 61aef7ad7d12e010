"""Per-iteration cost with 1,000 vs 100,000 requests waiting: it must not grow with the queue.

``python -m benchmarks.scaling [--quick]``

All requests arrive at t=0, so the waiting queue stays long for the whole run; the run stops at
a simulated-time limit. The iteration loop alone is timed (see ``TimedCostModel``), for FCFS and
for SPF with preemption, and the ratio of the two per-iteration costs is printed (target <= 2).
"""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks.common import TimedCostModel
from benchmarks.common import add_record_option, record, refuse_quick_record
from simsched import SimConfig, simulate
from simsched.cost.factory import make_cost_model


def per_iteration_us(num_waiting: int, changes: dict, sim_seconds: float) -> tuple[float, int]:
    """Microseconds per iteration and iteration count with ``num_waiting`` queued requests."""
    rng = np.random.default_rng(0)
    requests = [(0.0, int(p), int(o)) for p, o in
                zip(rng.integers(20, 500, num_waiting), rng.integers(20, 500, num_waiting))]
    cfg = SimConfig(max_sim_time=sim_seconds).replace(max_num_seqs=64, **changes)
    timed = TimedCostModel(make_cost_model(cfg.hardware))
    simulate(cfg, requests=requests, cost_model=timed)
    return timed.per_iteration_us(), timed.num_calls


def main(argv=None) -> None:
    """Print per-iteration costs and their ratio for each policy."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 vs 10,000 waiting, short")
    add_record_option(parser)
    args = parser.parse_args(argv)
    refuse_quick_record(parser, args)
    figures = {}
    small, large = (100, 10_000) if args.quick else (1_000, 100_000)
    sim_seconds = 20.0 if args.quick else 200.0
    for name, changes in (("fcfs", {"policy": "fcfs"}),
                          ("spf+preemption", {"policy": "spf", "preemption": True})):
        a, na = per_iteration_us(small, changes, sim_seconds)
        b, nb = per_iteration_us(large, changes, sim_seconds)
        key = name.replace("+", "_")
        figures.update({f"{key}_small_us": a, f"{key}_large_us": b, f"{key}_ratio": b / a})
        print(f"{name:<16} {small:>7} waiting: {a:6.1f} us/iter ({na} iters)   "
              f"{large:>7} waiting: {b:6.1f} us/iter ({nb} iters)   ratio {b / a:.2f}")
    if args.record:
        record("scaling", "full", figures)


if __name__ == "__main__":
    main()
