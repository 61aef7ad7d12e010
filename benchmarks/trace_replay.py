"""Wall time to replay the full one-hour Azure conversation trace (Llama-2-7B, one A100-80GB).

``python -m benchmarks.trace_replay [--quick]``

Prints wall seconds, speed-up over real time, iterations, tokens and SimPy wake-ups per request
for FCFS, SPF with preemption, and FCFS on the trace at 4x speed. Profile with
``python -m pyinstrument -m benchmarks.trace_replay`` (or ``py-spy record -- python -m ...``).
"""

from __future__ import annotations

import argparse
import time

from simsched import SimConfig, simulate
from benchmarks.common import add_record_option, record, refuse_quick_record
from simsched.workloads.workload import WorkloadConfig

CASES = {
    "fcfs 1x": ({"policy": "fcfs"}, 1.0),
    "spf+preemption 1x": ({"policy": "spf", "preemption": True}, 1.0),
    "fcfs 4x": ({"policy": "fcfs"}, 4.0),
}


def run(changes: dict, speedup: float, duration: float | None) -> dict:
    """Replay the trace once; return the figures."""
    workload = WorkloadConfig.preset("azure-conv", speedup=speedup, duration=duration)
    cfg = SimConfig(workload=workload).replace(**changes)
    started = time.perf_counter()
    res = simulate(cfg)
    wall = time.perf_counter() - started
    df = res.requests
    span = float(df["finished_at"].max() - df["arrival_at"].min())
    return {"requests": len(df), "output_tokens": int(df["num_generated_tokens"].sum()),
            "iterations": len(res.iterations), "simulated_s": span, "wall_s": wall,
            "x_real_time": span / wall, "us_per_iteration": wall / len(res.iterations) * 1e6,
            "wakeups_per_request": res.info["num_events"] / len(df),
            "rejected": int((df["status"] == "rejected").sum())}


def main(argv=None) -> None:
    """Run every case and print one line each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="first 60 s of the trace only")
    add_record_option(parser)
    args = parser.parse_args(argv)
    refuse_quick_record(parser, args)
    figures = {}
    duration = 60.0 if args.quick else None
    print(f"{'case':<20}{'requests':>9}{'out tokens':>12}{'iterations':>11}{'sim s':>9}"
          f"{'wall s':>8}{'x real':>8}{'us/iter':>9}{'wakeups/req':>12}")
    for name, (changes, speedup) in CASES.items():
        r = run(changes, speedup, duration)
        key = name.replace(" 1x", "").replace("+", "_").replace(" ", "_")
        figures.update({f"{key}_{k}": v for k, v in r.items()})
        print(f"{name:<20}{r['requests']:>9}{r['output_tokens']:>12}{r['iterations']:>11}"
              f"{r['simulated_s']:>9.0f}{r['wall_s']:>8.2f}{r['x_real_time']:>8.0f}"
              f"{r['us_per_iteration']:>9.1f}{r['wakeups_per_request']:>12.2f}")
    if args.record:
        record("trace_replay", "full", figures)


if __name__ == "__main__":
    main()
