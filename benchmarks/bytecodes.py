"""Python bytecodes a fleet-day slice executes, by function: where the interpreter's work goes.

``python -m benchmarks.bytecodes [--hours 0.02] [--start-hour 14] [--top 25]`` (and
``benchmarks.fleet_day``'s other options)

``benchmarks.fleet_day``'s run is timed, and on a shared virtual machine its time drifts by tens
of per cent; ``benchmarks.instructions`` counts CPU instructions, the same run after run, but
only in total. This counts the bytecodes the interpreter executes in ``simulate`` (the fleet's
streamed run; the one-replica calibration run before it is not counted), per function, with a
trace function that asks for an event per opcode (``sys.settrace``, ``frame.f_trace_opcodes``):
about 50× slower than a plain run, and the same counts on any machine for one Python version and
hash seed (the script re-runs itself with ``PYTHONHASHSEED=0``). Work done inside C functions
(``struct`` packing, list and heap operations, numpy and Arrow kernels) is not counted: a
bytecode is not a unit of time, but where they go is where the interpreter spends its time.

Prints the total per request and per iteration, how many functions make up half and nine tenths
of it, the share of each package, and the ``--top`` functions with their calls (a generator's
calls are its resumptions) and bytecodes per call.
"""

from __future__ import annotations

import collections
import os
import shutil
import sys
import tempfile
from pathlib import Path

from benchmarks.fleet_day import fleet_config, parser
from benchmarks.common import record
from simsched import simulate

ROOT = Path(__file__).resolve().parents[1].as_posix() + "/"


def _name(code) -> str:
    """``path:function`` of a code object, the path from the repository or site-packages."""
    path = code.co_filename.replace(os.sep, "/")
    if path.startswith(ROOT):
        path = path[len(ROOT):]
    elif "/site-packages/" in path:
        path = path.split("/site-packages/")[-1]
    else:
        path = path.rsplit("/", 1)[-1]        # the standard library, or <frozen ...>
    return f"{path}:{code.co_name}"


def _package(name: str) -> str:
    """The group a function is counted in: ``simsched.engine`` etc., or its top-level package."""
    parts = name.split(":")[0].split("/")
    if parts[0] == "simsched" and len(parts) > 2:
        return f"simsched.{parts[1]}"
    return parts[0].removesuffix(".py")


def count(cfg) -> tuple:
    """Run ``cfg`` streamed, counting bytecodes and calls per code object; return
    ``(bytecodes, calls, number of requests, number of iterations)``."""
    ops: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()

    def local(frame, event, arg):
        if event == "opcode":
            ops[frame.f_code] += 1
        return local

    def on_call(frame, event, arg):
        frame.f_trace_opcodes = True
        calls[frame.f_code] += 1
        return local

    out = tempfile.mkdtemp(prefix="bytecodes_")
    try:
        sys.settrace(on_call)
        try:
            run = simulate(cfg, stream_to=out)
        finally:
            sys.settrace(None)
        n = int(run.windows["num_requests"].sum())
        iterations = run.dataset("iterations").count_rows()
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return ops, calls, n, iterations


def main(argv=None) -> None:
    """Count the slice's bytecodes and print where they go."""
    if os.environ.get("PYTHONHASHSEED") != "0":
        # String hashes order sets and dicts of strings: fix them so counts repeat.
        env = dict(os.environ, PYTHONHASHSEED="0", OPENBLAS_NUM_THREADS="1")
        args = sys.argv[1:] if argv is None else list(argv)
        os.execve(sys.executable, [sys.executable, "-m", "benchmarks.bytecodes", *args], env)
    p = parser()
    p.set_defaults(hours=0.02, start_hour=14.0)
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)       # fleet_day's parser has --record: the default slice only
    if args.record and any(getattr(args, k) != p.get_default(k) for k in
                           ("replicas", "hours", "start_hour", "utilisation", "prompt_range",
                            "output_range", "autoscale")):
        p.error("--record keeps the default slice's figures: drop the options but --top")
    cfg = fleet_config(args)[0]
    ops, calls, n, iterations = count(cfg)
    by_name: collections.Counter = collections.Counter()
    calls_by_name: collections.Counter = collections.Counter()
    for code, k in ops.items():
        by_name[_name(code)] += k
    for code, k in calls.items():
        calls_by_name[_name(code)] += k
    total = sum(by_name.values())
    print(f"fleet_day --hours {args.hours:g} --start-hour {args.start_hour:g} "
          f"({args.replicas} replicas at {args.utilisation:.0%}): {n} requests, {iterations} "
          f"iterations; Python {sys.version.split()[0]}")
    print(f"{total} bytecodes in simulate(): {total / n:,.0f} per request, "
          f"{total / iterations:,.0f} per iteration, in {len(by_name)} functions")
    ranked = by_name.most_common()
    running, half, most = 0, 0, 0
    for i, (_, k) in enumerate(ranked, 1):
        running += k
        half = half or (i if running >= total / 2 else 0)
        most = most or (i if running >= 0.9 * total else 0)
    print(f"half of them in {half} functions, nine tenths in {most}")
    if args.record:
        record("bytecodes", "full", {"requests": n, "iterations": iterations, "bytecodes": total,
                                     "bytecodes_per_request": total / n,
                                     "bytecodes_per_iteration": total / iterations,
                                     "half_functions": half, "ninety_percent_functions": most})
    packages: collections.Counter = collections.Counter()
    for name, k in by_name.items():
        packages[_package(name)] += k
    print("by package: " + ", ".join(f"{pkg} {k / total:.1%}"
                                     for pkg, k in packages.most_common(10)))
    print(f"{'share':>6} {'per request':>11} {'calls':>9} {'per call':>8}  function")
    for name, k in ranked[:args.top]:
        c = calls_by_name[name]
        print(f"{k / total:6.1%} {k / n:11.1f} {c:9d} {k / max(c, 1):8.1f}  {name}")


if __name__ == "__main__":
    main()
