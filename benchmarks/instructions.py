"""Instructions executed by a fleet-day slice, here and at a base commit (a noise-free speed check).

``python -m benchmarks.instructions [--base REV] [--hours 0.05] [--start-hour 14]``

On a shared virtual machine wall and CPU times drift by tens of per cent over an hour, so a
change worth a few per cent cannot be timed. Counting the instructions the CPU executes
(``valgrind --tool=cachegrind --cache-sim=no``, about 10× slower than a plain run) gives the same
count run after run (hash seeds fixed). This runs ``benchmarks.fleet_day --loop simsched``
for ``--hours`` from ``--start-hour`` (its calibration run included; the bare loop is not run)
in the working tree and in a temporary checkout of ``--base`` (given this tree's
``benchmarks/fleet_day.py``, so both run the same command), and
prints both counts and their ratio. Both trees are byte-compiled first and run with one BLAS
thread (idle BLAS threads spin under valgrind), so the counts repeat to the last digits. Needs
git and valgrind; the counts include Python's start-up and imports (about 2.6 G instructions
with pandas and pyarrow).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import add_record_option, record

ROOT = Path(__file__).resolve().parents[1]


def count(tree: Path, hours: float, start_hour: float) -> int:
    """Instructions of the fleet-day slice run in ``tree``."""
    # One BLAS thread: idle BLAS threads spin under valgrind and add counts of their own.
    env = dict(os.environ, PYTHONHASHSEED="0", PYTHONPATH=str(tree), OPENBLAS_NUM_THREADS="1")
    # Byte-compiled first, so neither count includes compiling what a fresh checkout lacks.
    subprocess.run([sys.executable, "-m", "compileall", "-q", "simsched", "benchmarks"],
                   cwd=tree, env=env, capture_output=True, check=True)
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
           sys.executable, "-m", "benchmarks.fleet_day", "--hours", str(hours),
           "--start-hour", str(start_hour), "--loop", "simsched"]   # simsched's work alone
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=True)
    match = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
    if match is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{out.stderr[-2000:]}")
    return int(match.group(1).replace(",", ""))


def main(argv=None) -> None:
    """Count both trees' instructions and print them."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", default="HEAD", help="the commit to compare with")
    p.add_argument("--hours", type=float, default=0.05)
    p.add_argument("--start-hour", type=float, default=14.0)
    add_record_option(p)
    args = p.parse_args(argv)
    if args.record and (args.hours, args.start_hour) != (0.05, 14.0):
        p.error("--record keeps the default slice's figures: drop --hours/--start-hour")
    if shutil.which("valgrind") is None:
        raise SystemExit("benchmarks.instructions needs valgrind")
    here = count(ROOT, args.hours, args.start_hour)
    base_dir = Path(tempfile.mkdtemp(prefix="simsched_base_"))
    try:
        subprocess.run(["git", "worktree", "add", "--detach", str(base_dir), args.base],
                       cwd=ROOT, check=True, capture_output=True)
        shutil.copy(ROOT / "benchmarks" / "fleet_day.py", base_dir / "benchmarks" / "fleet_day.py")
        base = count(base_dir, args.hours, args.start_hour)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base_dir)], cwd=ROOT,
                       capture_output=True)
        shutil.rmtree(base_dir, ignore_errors=True)
    print(f"fleet_day --hours {args.hours:g} --start-hour {args.start_hour:g}: "
          f"{args.base} {base / 1e9:.3f} G instructions, working tree {here / 1e9:.3f} G "
          f"({here / base - 1:+.1%})")
    if args.record:
        record("instructions", "full", {"base": args.base, "base_g": base / 1e9,
                                        "here_g": here / 1e9, "change": here / base - 1})


if __name__ == "__main__":
    main()
