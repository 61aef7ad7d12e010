"""The A100 part of ``experiments.calibrate`` under its old name (kept as an alias).

    python -m experiments.calibrate_a100 [--quick] [--out out/calibrate_a100/]
"""

from __future__ import annotations

import argparse

from experiments import calibrate


def main(argv=None) -> None:
    """Run ``experiments.calibrate --gpu a100-80gb``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tables only, no plot")
    parser.add_argument("--out", default="out/calibrate_a100/", help="output directory")
    args = parser.parse_args(argv)
    calibrate.main(["--gpu", "a100-80gb", "--out", args.out] + ["--quick"] * args.quick)


if __name__ == "__main__":
    main()
