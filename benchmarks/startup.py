"""Startup of a fresh process (a sweep worker): import, first calibrated iteration, a short run.

``python -m benchmarks.startup [--quick] [--repeat N]``

Each case runs in a new Python process, as a sweep worker does: ``import simsched``, then the
time until the first ``iteration_time`` of a calibrated model (reading the shipped coefficients it
needs, :mod:`simsched.cost.fits`, and building its tables), then a 200-request simulation; and,
for comparison, the time to refit those coefficients from the bundled data (what every process
paid before fits were shipped). Prints the median over ``--repeat`` processes (milliseconds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.common import add_record_option, record, refuse_quick_record

ROOT = Path(__file__).resolve().parent.parent
CASES = {
    "llama-2-7b a100 (default)": {},
    "llama-3-8b h200": {"model": "llama-3-8b", "gpu": "h200"},
    "llama-2-70b h100 tp4 eager_2023": {"model": "llama-2-70b", "gpu": "h100-sxm",
                                        "tensor_parallel_size": 4,
                                        "engine_overhead": "eager_2023"},
}
SNIPPET = """
import json, sys, time
t0 = time.perf_counter()
import simsched
from simsched import SimConfig, simulate
from simsched.cost import factory
from simsched.cost.base import Batch
t1 = time.perf_counter()
hw = json.loads(sys.argv[1])
cfg = SimConfig().replace(**hw)
m = factory.make_cost_model(cfg.hardware)
m.iteration_time(Batch([], [], 1, 100))
t2 = time.perf_counter()
simulate(cfg.replace(num_requests=200, rate=5.0))
t3 = time.perf_counter()
from simsched.cost import fits, serving
from simsched.cost.hardware import GPUS
from simsched.cost.profiles import PROFILES
needed = {"a100-80gb", GPUS[cfg.hardware.gpu].kernels}
if cfg.hardware.engine_overhead == "eager_2023":
    needed.add(serving.ENGINE_FIT.name)
t4 = time.perf_counter()
for name in sorted(needed, key=lambda n: n not in PROFILES):
    fits.registered()[name].fit()
t5 = time.perf_counter()
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "first_iteration_ms": (t2 - t1) * 1e3,
                  "simulate_200_ms": (t3 - t2) * 1e3, "refit_ms": (t5 - t4) * 1e3}))
"""


def one(hw: dict) -> dict:
    """Run the snippet in a fresh process; its timings."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", SNIPPET, json.dumps(hw)], env=env, cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(hw: dict, repeat: int) -> dict:
    """Median timings over ``repeat`` fresh processes."""
    runs = [one(hw) for _ in range(repeat)]
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main(argv=None) -> dict:
    """Measure every case and print one line per case."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition")
    parser.add_argument("--repeat", type=int, default=5, help="processes per case")
    add_record_option(parser)
    args = parser.parse_args(argv)
    refuse_quick_record(parser, args)
    repeat = 1 if args.quick else args.repeat
    print(f"fresh-process startup, median of {repeat} (ms)")
    print(f"{'case':<34}{'import':>9}{'first iteration':>17}{'200-request run':>17}"
          f"{'refit (not done by runs)':>26}")
    results = {}
    for name, hw in CASES.items():
        r = results[name] = measure(hw, repeat)
        print(f"{name:<34}{r['import_ms']:>9.0f}{r['first_iteration_ms']:>17.0f}"
              f"{r['simulate_200_ms']:>17.0f}{r['refit_ms']:>26.0f}")
    if args.record:
        first = [r["first_iteration_ms"] for r in results.values()]
        refit = [r["refit_ms"] for r in results.values()]
        record("startup", "full", {"first_iteration_ms_min": min(first),
                                   "first_iteration_ms_max": max(first),
                                   "refit_ms_min": min(refit), "refit_ms_max": max(refit)})
    return results


if __name__ == "__main__":
    main()
