"""What every experiment shares: its command line, printing tables, writing frames and plots.

Every experiment runs as ``python -m experiments.NAME [--quick] [--out DIR] [--quiet]``: it
prints its table first, then writes CSVs under ``--out`` (default ``out/NAME``), then draws its
plots; a plot that cannot be drawn costs one line on stderr, never the printed or written results.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
# The cost-model data shipped with the package; the _bundle_* scripts regenerate it.
BUNDLED_DATA = ROOT / "simsched" / "cost" / "data"


def parser(name: str, doc: str, quick: str) -> argparse.ArgumentParser:
    """The experiment's argument parser with ``--quick``, ``--out`` and ``--quiet``.

    ``doc`` is the module docstring (its first paragraph is the description) and ``quick``
    says what ``--quick`` does.
    """
    p = argparse.ArgumentParser(prog=f"python -m experiments.{name}",
                                description=doc.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help=quick)
    p.add_argument("--out", default=f"out/{name}", help=f"output directory (default out/{name})")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def print_table(table: pd.DataFrame, out=None, digits: int = 4, index: bool = False) -> None:
    """Print a table with ``digits`` significant digits (and where its files went)."""
    with pd.option_context("display.float_format", f"{{:.{digits}g}}".format,
                           "display.width", 200, "display.max_columns", 40):
        print(table.to_string(index=index))
    if out is not None:
        print(f"wrote {out}/")


def write_frames(out: Path, **frames: pd.DataFrame) -> None:
    """Each frame as CSV into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, frame in frames.items():
        frame.to_csv(out / f"{name}.csv", index=False)


def save_plot(path: Path, draw: Callable[[], object]) -> Path | None:
    """Draw a figure with ``draw()`` (returning a matplotlib Figure) and save it to ``path``.

    Any failure (matplotlib missing or broken) prints one line and returns None: the tables are
    already printed and written by then.
    """
    try:
        fig = draw()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=90)
    except (ImportError, RuntimeError, ValueError, OSError) as exc:
        print(f"plot {Path(path).name} skipped: {exc}", file=sys.stderr)
        return None
    return Path(path)


def try_plots(draw: Callable[[], list]) -> list:
    """``draw()`` (which writes plots and returns their paths), or [] with one line on stderr
    when plotting fails (matplotlib missing or broken): the tables are already out by then."""
    try:
        return draw()
    except (ImportError, RuntimeError, ValueError, OSError) as exc:
        print(f"plots skipped: {exc}", file=sys.stderr)
        return []


def bundle_parser(name: str, doc: str, source: str) -> argparse.ArgumentParser:
    """The command line of a data-bundling script (run by hand, rarely): ``SOURCE`` (a folder,
    required) and where to write, ``--out DIR`` or ``--write`` (over the data bundled in
    ``simsched/cost/data/``); one of them is required, so nothing is overwritten by accident.

    Such a script is not an experiment: ``--quick`` is refused with a line saying so. Check the
    arguments with :func:`bundle_args`.
    """
    p = argparse.ArgumentParser(prog=f"python -m experiments.{name}",
                                description=doc.split("\n\n")[0])
    # Optional to argparse so that --quick gets its own message; bundle_args requires it.
    p.add_argument("source", metavar="SOURCE", nargs="?", help=source + " (required)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--out", metavar="DIR", help="write the bundled files into DIR")
    where.add_argument("--write", action="store_true",
                       help=f"overwrite the bundled data in {BUNDLED_DATA.relative_to(ROOT)}/")
    p.add_argument("--quick", action="store_true", help=argparse.SUPPRESS)
    return p


def bundle_args(p: argparse.ArgumentParser, argv, needs: tuple[str, ...]):
    """Parse ``argv`` with a :func:`bundle_parser`; return ``(args, source, out)`` as paths.

    Exits with status 2 and one line (argparse's ``error``) for ``--quick``, a missing source
    folder, a source lacking any of ``needs`` (paths inside it), or no ``--out``/``--write``.
    """
    args = p.parse_args(argv)
    if args.quick:
        p.error("--quick: this script bundles data once, by hand; it is not an experiment and "
                "has no quick mode")
    if args.source is None:
        p.error("SOURCE is required: the folder to bundle the data from")
    source = Path(args.source)
    if not source.is_dir():
        p.error(f"source folder {source} does not exist (or is not a folder)")
    missing = [n for n in needs if not (source / n).exists()]
    if missing:
        p.error(f"source folder {source} lacks {', '.join(missing)}")
    if not args.write and args.out is None:
        p.error(f"say where to write: --out DIR, or --write to overwrite "
                f"{BUNDLED_DATA.relative_to(ROOT)}/")
    return args, source, (BUNDLED_DATA if args.write else Path(args.out))
