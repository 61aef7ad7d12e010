"""Formatting and checking helpers for the generated doc blocks (see tools.docs.check_docs)."""

from __future__ import annotations

import numpy as np
import pandas as pd


class Drift(Exception):
    """A documented result or claim that the code no longer produces."""


def claim(holds: bool, text: str) -> None:
    """Fail the check if a claim the docs make next to the numbers no longer holds."""
    if not holds:
        raise Drift(f"claim no longer holds: {text}")


def num(value: float, digits: int = 3) -> str:
    """``value`` to ``digits`` significant digits, with thousands separators, never 1e+03."""
    if value != value:
        return "–"
    if abs(value) >= 10 ** digits:
        return f"{round(value):,}"
    text = f"{value:.{digits}g}"
    return text if "e" not in text else f"{value:.{digits}f}"


def md_table(frame: pd.DataFrame, digits: int = 3) -> str:
    """A Markdown table; floats to ``digits`` significant digits, integers with separators."""
    def cell(v):
        if isinstance(v, (bool, np.bool_)):
            return str(v)
        if isinstance(v, (int, np.integer)):
            return f"{v:,}"
        if isinstance(v, float):
            return num(v, digits)
        return str(v)

    lines = ["| " + " | ".join(map(str, frame.columns)) + " |",
             "|" + "---|" * len(frame.columns)]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    return "\n".join(lines)


def wrap_md(text: str, width: int = 100) -> str:
    """Re-flow the prose of a Markdown block to ``width`` columns (tables, code and blank lines
    kept as they are; a list item's continuation lines indented by two spaces)."""
    import textwrap

    out: list[str] = []
    para: list[str] = []

    def flush():
        if para:
            first = para[0]
            indent = "  " if first.startswith(("- ", "* ")) else ""
            out.append(textwrap.fill(" ".join(p.strip() for p in para), width=width,
                                     subsequent_indent=indent, break_long_words=False,
                                     break_on_hyphens=False))
            para.clear()

    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            flush()
            fenced = not fenced
            out.append(line)
        elif fenced or not line.strip() or line.startswith(("|", "#", "<!--")):
            flush()
            out.append(line)
        elif line.startswith(("- ", "* ")):
            flush()
            para.append(line)
        else:
            para.append(line)
    flush()
    return "\n".join(out)
