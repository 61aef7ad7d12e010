"""A first look at the TensorRT-LLM engine against measured silicon rows (not the validation).

The Llama-3.1-8B TensorRT-LLM 1.0.0rc3 aggregated rows on H100 of
``../shared/data/real-serving/silicon/hopper.csv`` (the first ``--rows``), each run as its
benchmark ran it (``vllm bench serve``-style concurrency client, fixed ISL/OSL) with the
``trtllm`` preset and, for comparison, the default vLLM preset; prints the median signed and
absolute relative errors of mean TTFT and TPOT. ``experiments.validate_silicon`` (another issue)
is the validation proper::

    python -m benchmarks.engines.silicon_check [--rows 40]
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import pandas as pd

import simsched
from simsched import SimConfig

SILICON = Path(__file__).resolve().parents[3] / "shared" / "data" / "real-serving" / "silicon" \
    / "hopper.csv"


def main(argv=None) -> pd.DataFrame:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=40)
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    d = pd.read_csv(SILICON)
    rows = d[d.model_path.str.contains("Llama-3.1-8B") & (d.backend == "trtllm")
             & (d["mode"] == "agg")].head(args.rows)
    out = []
    for _, r in rows.iterrows():
        c = int(r.batch_size)
        for preset in ("trtllm", "vllm_v1"):
            cfg = SimConfig.preset(
                preset, model="llama-3.1-8b", gpu="h100-sxm", tensor_parallel_size=int(r.tp_size),
                lengths="fixed", prompt_len=int(r.isl), output_len=int(r.osl),
                num_requests=max(4 * c, 32), rate=1000.0, seed=0,
                **{"client.client_type": "concurrency", "client.max_concurrency": c})
            s = simsched.simulate(cfg).summary()
            out.append({"preset": preset, "id": r.id,
                        "ttft_error": s["ttft_mean"] * 1e3 / r.silicon_ttft_ms - 1,
                        "tpot_error": s["tpot_mean"] * 1e3 / r.silicon_tpot_ms - 1})
    table = pd.DataFrame(out)
    summary = table.groupby("preset")[["ttft_error", "tpot_error"]].agg(
        ["median", lambda x: x.abs().median()])
    summary.columns = ["ttft_median", "ttft_abs_median", "tpot_median", "tpot_abs_median"]
    print(summary.round(3).to_string())
    print(f"{len(rows)} rows")
    return table


if __name__ == "__main__":
    main()
