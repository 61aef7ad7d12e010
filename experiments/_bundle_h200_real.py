"""Copy the H200 operator profiles and the real-serving timings into simsched/cost/data/.

Run once by hand::

    python -m experiments._bundle_h200_real ../shared/data --out /tmp/h200
    python -m experiments._bundle_h200_real ../shared/data \
        --iteration-json benchmarks/device/h200_iteration_results.json --write   # the bundle

The package only ever reads the bundled copies. Values are rounded to 6 significant digits (the
measurements' own run-to-run spread is far larger); the real-serving file keeps only the columns the
simulator uses (power readings dropped) and every repetition, so its spread can be reported. The
optional JSON is ``benchmarks/device/h200_iteration_results.json`` (whole decode steps measured on
the same H200): its rows become ``h200/iteration.csv``.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pandas as pd

from experiments._common import bundle_args, bundle_parser

# What the source folder must hold.
NEEDS = ("h200-profiling/linear.csv", "h200-profiling/attn_prefill.csv",
         "h200-profiling/attn_decode.csv", "h200-profiling/README.md",
         "real-serving/splitwise-perf-model.csv", "real-serving/LICENSE",
         "real-serving/README.md")

# Appended to the copied H200 README: what the bundle adds to the shared data.
ITERATION_NOTE = """
## Added when bundled into simsched

- `iteration.csv`: whole decode steps of a Llama-3-8B-shaped model (32 layers, bf16) on the same H200 at
  context 1,024, from `benchmarks/device/h200_iteration.py` (its `h200_iteration_results.json`):
  `graph_gpu_ms` (one CUDA-graph replay, CUDA events: pure GPU time), `graph_roundtrip_ms` (replay +
  sampled ids copied to the host + synchronise, wall clock) and `eager_ms` (op-by-op launches from
  Python, wall clock). simsched uses `graph_roundtrip_ms - graph_gpu_ms` as the `overlapped` engine's
  per-iteration gap and `graph_gpu_ms` to check whole-step GPU time.
"""


def bundle(root: Path, dest: Path, iteration_json: str | None = None) -> None:
    """Write h200/*.csv, real_serving/splitwise.csv and their README/LICENSE files."""
    dest = Path(dest)
    h200 = dest / "h200"
    h200.mkdir(parents=True, exist_ok=True)
    for name in ("linear", "attn_prefill", "attn_decode"):
        df = pd.read_csv(root / "h200-profiling" / f"{name}.csv")
        df.to_csv(h200 / f"{name}.csv", index=False, float_format="%.6g")
    shutil.copy(root / "h200-profiling" / "README.md", h200 / "README.md")
    if iteration_json:
        rows = json.loads(Path(iteration_json).read_text())["rows"]
        dec = pd.DataFrame([r for r in rows if r.get("phase") == "decode" and "error" not in r])
        dec[["batch", "context", "graph_gpu_ms", "graph_roundtrip_ms", "eager_ms"]].to_csv(
            h200 / "iteration.csv", index=False, float_format="%.6g")
    if (h200 / "iteration.csv").exists():       # bundled earlier, or just now
        with open(h200 / "README.md", "a") as readme:
            readme.write(ITERATION_NOTE)

    real = dest / "real_serving"
    real.mkdir(parents=True, exist_ok=True)
    df = pd.read_csv(root / "real-serving" / "splitwise-perf-model.csv")
    cols = ["model", "hardware", "tensor_parallel", "prompt_size", "batch_size", "token_size",
            "prompt_time", "token_time"]
    df[cols].to_csv(real / "splitwise.csv", index=False, float_format="%.6g")
    shutil.copy(root / "real-serving" / "LICENSE", real / "LICENSE")
    shutil.copy(root / "real-serving" / "README.md", real / "README.md")


def main(argv=None) -> int:
    """Entry point: ``SOURCE [--iteration-json FILE] (--out DIR | --write)``."""
    p = bundle_parser("_bundle_h200_real", __doc__,
                      "the shared data folder holding h200-profiling/ and real-serving/ "
                      "(e.g. ../shared/data)")
    p.add_argument("--iteration-json", metavar="FILE",
                   help="benchmarks/device/h200_iteration_results.json: adds h200/iteration.csv")
    args, source, out = bundle_args(p, argv, NEEDS)
    if args.iteration_json and not Path(args.iteration_json).is_file():
        p.error(f"--iteration-json: {args.iteration_json} does not exist")
    bundle(source, out, args.iteration_json)
    print(f"wrote {out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
