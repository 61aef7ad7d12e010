"""The A100 part of ``experiments.calibrate`` under its old name (kept as an alias).

    python -m experiments.calibrate_a100 [--quick] [--out out/calibrate_a100/]
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from experiments import calibrate
from experiments._common import parser as make_parser


def main(argv=None) -> dict:
    """Run ``experiments.calibrate --gpu a100-80gb``; return its ``linear`` and ``components``
    error tables."""
    parser = make_parser("calibrate_a100", __doc__, "tables only, no plot")
    args = parser.parse_args(argv)
    calibrate.main(["--gpu", "a100-80gb", "--out", args.out] + ["--quick"] * args.quick)
    out = Path(args.out)
    return {"linear": pd.read_csv(out / "linear_errors.csv"),
            "components": pd.read_csv(out / "component_errors.csv")}


if __name__ == "__main__":
    main()
