"""Mixture-of-experts serving: dense vs MoE, TP vs EP vs DP-attention + EP, FP8 vs BF16.

    python -m experiments.moe [--quick] [--out DIR] [--quiet]

Three studies on H100s, each with the same Poisson trace (fixed 512-token prompts and 256-token
outputs) for every variant, ``vllm_v1`` engine profile:

* ``dense_vs_moe``: Llama-2-13B (13 B parameters) against Mixtral-8x7B (13 B active of 47 B) on
  2 GPUs (TP 2): output throughput, mean TPOT and GPU-seconds per 1,000 output tokens;
* ``layouts``: Mixtral-8x22B on 8 GPUs as TP 8, TP 8 with expert parallelism, and data-parallel
  attention (8 ranks of TP 1) with expert parallelism;
* ``precision``: Mixtral-8x7B at TP 2 in BF16, with FP8 weights, and with FP8 weights and KV.

``--quick`` runs fewer requests at fewer rates; ``--img DIR`` also copies the plot there.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pandas as pd

import simsched
from simsched import SimConfig
from simsched.config.parallel import ParallelConfig
from simsched.cost import hardware
from simsched.cost.hardware import MODELS
from experiments._common import parser as make_parser
from experiments._common import print_table, try_plots, write_frames

PROMPT, OUTPUT = 512, 256


def _variant(model: str, tp: int, spec=None, parallel=None, name=None) -> dict:
    return {"name": name or model, "model": model, "tp": tp, "spec": spec,
            "parallel": parallel}


def variants() -> dict[str, list[dict]]:
    """Every study's variants (model, TP, shape override, parallel layout)."""
    mix = MODELS["mixtral-8x7b"]
    fp8 = dataclasses.replace(mix, weight_dtype="fp8")
    return {
        "dense_vs_moe": [_variant("llama-2-13b", 2), _variant("mixtral-8x7b", 2)],
        "layouts": [
            _variant("mixtral-8x22b", 8, name="TP 8"),
            _variant("mixtral-8x22b", 8, parallel=ParallelConfig(enable_expert_parallel=True),
                     name="TP 8 + EP"),
            _variant("mixtral-8x22b", 1, parallel=ParallelConfig(
                data_parallel_size=8, enable_expert_parallel=True, num_gpus=8),
                name="DP-attention 8 + EP")],
        "precision": [
            _variant("mixtral-8x7b", 2, name="BF16"),
            _variant("mixtral-8x7b-fp8", 2, spec=fp8, name="FP8 weights"),
            _variant("mixtral-8x7b-fp8kv", 2, spec=dataclasses.replace(fp8, kv_cache_dtype="fp8"),
                     name="FP8 weights + KV")],
    }


def _config(v: dict, rate: float, num_requests: int) -> SimConfig:
    return SimConfig.preset("classic").replace(
        model=v["model"], model_spec=v["spec"], gpu="h100-sxm", tensor_parallel_size=v["tp"],
        parallel=v["parallel"], rate=rate, num_requests=num_requests, lengths="fixed",
        prompt_len=PROMPT, output_len=OUTPUT, max_num_seqs=256, seed=0)


def run_study(study: str, rates, num_requests: int) -> pd.DataFrame:
    """One row per (variant, rate): throughput, TPOT, TTFT, KV blocks and GPU cost."""
    rows = []
    for v in variants()[study]:
        for rate in rates:
            cfg = _config(v, rate, num_requests)
            s = simsched.simulate(cfg).summary()
            par = cfg.hardware.parallel
            gpus = v["tp"] * (par.pipeline_parallel_size * par.data_parallel_size
                              if par is not None else 1)
            rows.append({
                "study": study, "variant": v["name"], "gpus": gpus, "rate": rate,
                "output_throughput": s["output_throughput"], "tpot_mean": s["tpot_mean"],
                "ttft_mean": s["ttft_mean"],
                "gpu_seconds_per_1k_tokens": gpus * 1000.0 / s["output_throughput"],
                "kv_blocks": hardware.kv_capacity_blocks(cfg.hardware, cfg.cache.block_size),
                "num_finished": s["num_finished"]})
    return pd.DataFrame(rows)


def plot(table: pd.DataFrame):
    """TPOT against output throughput per variant, one panel per study."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    studies = list(dict.fromkeys(table.study))
    fig, axes = plt.subplots(1, len(studies), figsize=(5 * len(studies), 4))
    for ax, study in zip(axes, studies):
        for name, g in table[table.study == study].groupby("variant", sort=False):
            ax.plot(g.output_throughput, g.tpot_mean * 1e3, marker="o", label=name)
        ax.set(xlabel="output tokens/s", ylabel="mean TPOT (ms)", title=study)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def main(argv=None) -> pd.DataFrame:
    """Run the three studies; print, write ``moe.csv`` and the plot; return the table."""
    parser = make_parser("moe", __doc__, "fewer requests and rates")
    parser.add_argument("--img", default=None, help="also copy the plot here (docs/img)")
    args = parser.parse_args(argv)
    rates = (2.0, 8.0) if args.quick else (2.0, 4.0, 8.0, 16.0)
    num = 120 if args.quick else 600
    table = pd.concat([run_study(s, rates, num) for s in variants()], ignore_index=True)
    print_table(table, args.out)
    out = Path(args.out)
    write_frames(out, moe=table)

    def draw():
        fig = plot(table)
        fig.savefig(out / "moe.png", dpi=110)
        return [out / "moe.png"]

    paths = try_plots(draw)
    if args.img:
        Path(args.img).mkdir(parents=True, exist_ok=True)
        for p in paths:
            shutil.copy(p, Path(args.img) / p.name)
    return table


if __name__ == "__main__":
    main()
