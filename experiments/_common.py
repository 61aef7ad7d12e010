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
