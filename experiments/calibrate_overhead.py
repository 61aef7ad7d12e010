"""How much each engine-overhead choice moves TTFT and TPOT, on the main job and the Azure replay.

    python -m experiments.calibrate_overhead [--quick] [--gpus a100-80gb,h200] [--out DIR]

For every ``hardware.engine_overhead`` choice (``vllm_v1`` default, ``measured_2023``,
``eager_2023``, ``overlapped``, ``none``) and GPU, runs the main job
(``experiments.policy_comparison``'s FCFS setting: lesson workload at 30 req/s, 1,000 requests, 96
KV blocks, 16 sequences, budget 2,048) and the Azure 2023 conversation trace (one hour, default
engine: Llama-2-7B, FCFS; ``--quick``: its first 600 s). Also prints each choice's iteration time
on a hand-built batch. Prints TTFT and TPOT (mean and p90) with the change against the default, and
writes ``summary.csv``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from experiments.policy_comparison import base_config
from simsched import SimConfig, simulate
from simsched.config import HardwareConfig
from simsched.cost.base import Batch
from simsched.cost.factory import make_cost_model
from simsched.cost.overhead import DEFAULT_ENGINE_OVERHEAD, ENGINE_OVERHEADS
from simsched.workloads.workload import WorkloadConfig
from experiments._common import parser as make_parser

BATCHES = {"decode 1 x 1,000": Batch([], [], 1, 1000),
           "decode 64 x 1,000": Batch([], [], 64, 64000),
           "prefill 512 + decode 32 x 1,000": Batch([512], [0], 32, 32000)}


def jobs(quick: bool) -> dict:
    """Job name -> SimConfig (default GPU; the caller sets GPU and overhead)."""
    main_job = base_config(rate=30.0, num_blocks=96, num_requests=1000, seed=0)
    azure = SimConfig.preset("classic", workload=WorkloadConfig.preset(
        "azure-conv", duration=600.0 if quick else None))
    return {"main job (policy_comparison, FCFS)": main_job, "azure-conv replay": azure}


def hand_built(gpus) -> pd.DataFrame:
    """Iteration time (ms) of each choice on a few hand-built batches, Llama-2-7B."""
    rows = []
    for gpu in gpus:
        for choice in ENGINE_OVERHEADS:
            m = make_cost_model(HardwareConfig(gpu=gpu, engine_overhead=choice))
            rows.append({"gpu": gpu, "engine_overhead": choice,
                         **{k: m.iteration_time(b) * 1e3 for k, b in BATCHES.items()}})
    return pd.DataFrame(rows)


def run_all(gpus, quick: bool) -> pd.DataFrame:
    """One row per (job, GPU, overhead choice) with TTFT/TPOT figures."""
    rows = []
    for job, base in jobs(quick).items():
        for gpu in gpus:
            for choice in ENGINE_OVERHEADS:
                s = simulate(base.replace(gpu=gpu, engine_overhead=choice)).summary()
                rows.append({"job": job, "gpu": gpu, "engine_overhead": choice,
                             "ttft_mean_s": s["ttft_mean"], "ttft_p90_s": s["ttft_p90"],
                             "tpot_mean_ms": s["tpot_mean"] * 1e3,
                             "tpot_p90_ms": s["tpot_p90"] * 1e3,
                             "num_finished": s["num_finished"]})
    df = pd.DataFrame(rows)
    base = df[df.engine_overhead == DEFAULT_ENGINE_OVERHEAD].set_index(["job", "gpu"])
    for col in ("ttft_mean_s", "tpot_mean_ms"):
        ref = base[col].reindex(pd.MultiIndex.from_frame(df[["job", "gpu"]])).to_numpy()
        df[col.split("_")[0] + "_change_%"] = (df[col] / ref - 1) * 100
    return df


def main(argv=None) -> pd.DataFrame:
    """Print the tables and write summary.csv."""
    parser = make_parser("calibrate_overhead", __doc__, "first 600 s of the trace only")
    parser.add_argument("--gpus", default="a100-80gb,h200", help="comma-separated GPUs")
    args = parser.parse_args(argv)
    gpus = [g.strip() for g in args.gpus.split(",") if g.strip()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with pd.option_context("display.width", 200, "display.float_format", "{:.2f}".format):
        print("iteration time (ms) of each engine_overhead choice, Llama-2-7B, TP 1:")
        print(hand_built(gpus).to_string(index=False))
        df = run_all(gpus, args.quick)
        print(f"\nTTFT and TPOT per engine_overhead (change against {DEFAULT_ENGINE_OVERHEAD})"
              + (" [quick: azure first 600 s]" if args.quick else ""))
        print(df.to_string(index=False))
    df.to_csv(out / "summary.csv", index=False)
    print(f"\nwrote {out / 'summary.csv'}")
    return df


if __name__ == "__main__":
    main()
