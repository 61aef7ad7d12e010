"""Startup of a fresh process (a sweep worker): without, with a cold, and with a warm coefficient cache.

``python -m benchmarks.startup [--quick] [--repeat N]``

Each case runs in a new Python process, as a sweep worker does: ``import simsched``, then the
time until the first ``iteration_time`` of a calibrated model (fitting, or reading, the
coefficients it needs and building its tables), then a short simulation. Three cache states:

* ``off`` (``SIMSCHED_CACHE_DIR=off``): every process fits everything it needs from the bundled
  data, as every process did before the cache existed;
* ``cold``: an empty cache folder; this process fits and writes the coefficients;
* ``warm``: the folder the cold run filled; the process only reads JSON.

Prints the median over ``--repeat`` processes (milliseconds) per model and cache state.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

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
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "first_iteration_ms": (t2 - t1) * 1e3,
                  "simulate_200_ms": (t3 - t2) * 1e3}))
"""


def one(hw: dict, cache: str) -> dict:
    """Run the snippet in a fresh process with the given cache setting; its timings."""
    env = dict(os.environ, SIMSCHED_CACHE_DIR=cache, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", SNIPPET, json.dumps(hw)], env=env, cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(hw: dict, repeat: int) -> dict:
    """Median timings per cache state (cold uses a fresh folder each repetition)."""
    runs = {"off": [], "cold": [], "warm": []}
    for _ in range(repeat):
        runs["off"].append(one(hw, "off"))
        folder = tempfile.mkdtemp(prefix="simsched-cache-")
        try:
            runs["cold"].append(one(hw, folder))
            runs["warm"].append(one(hw, folder))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return {state: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            for state, rs in runs.items()}


def main(argv=None) -> dict:
    """Measure every case and print one line per (case, cache state)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition")
    parser.add_argument("--repeat", type=int, default=5, help="processes per cache state")
    args = parser.parse_args(argv)
    repeat = 1 if args.quick else args.repeat
    print(f"fresh-process startup, median of {repeat} (ms)")
    print(f"{'case':<34}{'cache':>6}{'import':>9}{'first iteration':>17}"
          f"{'200-request run':>17}")
    results = {}
    for name, hw in CASES.items():
        results[name] = measure(hw, repeat)
        for state, r in results[name].items():
            print(f"{name:<34}{state:>6}{r['import_ms']:>9.0f}{r['first_iteration_ms']:>17.0f}"
                  f"{r['simulate_200_ms']:>17.0f}")
    return results


if __name__ == "__main__":
    main()
