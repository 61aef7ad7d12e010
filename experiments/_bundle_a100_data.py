"""Reduce the raw Vidur A100 profiling folder to the small CSVs bundled in simsched/cost/data/.

Run once by hand; the package only ever reads the reduced files. Medians are kept (see
simsched.calibration)::

    python -m experiments._bundle_a100_data ../shared/data/a100-profiling --out /tmp/a100
    python -m experiments._bundle_a100_data ../shared/data/a100-profiling --write   # the bundle
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pandas as pd

from experiments._common import bundle_args, bundle_parser
MODELS = {"meta-llama/Llama-2-7b-hf": "llama-2-7b", "meta-llama/Llama-2-70b-hf": "llama-2-70b",
          "meta-llama/Meta-Llama-3-8B": "llama-3-8b", "meta-llama/Meta-Llama-3-70B": "llama-3-70b",
          "microsoft/phi-2": "phi-2"}
ELEMENTWISE = ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add")


def _med(df: pd.DataFrame, op: str) -> pd.Series:
    col = f"time_stats.{op}.median"
    return df[col] if col in df else pd.Series(0.0, index=df.index)


# What the source folder must hold (the raw Vidur profiling layout).
NEEDS = ("compute", "attention/llama-70b-shape-tp2.csv", "network/a100_dgx/all_reduce.csv",
         "cpu/cpu_overheads.csv", "LICENSE")


def bundle(root: Path, dest: Path) -> None:
    """Write compute.csv, attention_*.csv, all_reduce.csv, cpu_overheads.csv and LICENSE."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    rows, shapes = [], []
    for hf, name in MODELS.items():
        df = pd.read_csv(root / "compute" / hf / "mlp.csv")
        df = df.rename(columns={"num_tensor_parallel_work": "tp",
                                "num_tensor_parallel_workers": "tp"})
        out = pd.DataFrame({"model": name, "tp": df["tp"], "num_tokens": df["num_tokens"],
                            "qkv": _med(df, "attn_pre_proj"), "out": _med(df, "attn_post_proj"),
                            "up": _med(df, "mlp_up_proj"), "down": _med(df, "mlp_down_proj"),
                            "elementwise": sum(_med(df, op) for op in ELEMENTWISE),
                            "emb": _med(df, "emb")})
        # Beyond the 4096-token range the engine rarely batches; keep a coarse tail only.
        out = out[(out.num_tokens <= 4096) | (out.num_tokens % 1024 == 0)]
        rows.append(out.groupby(["model", "tp", "num_tokens"], as_index=False).mean())
        r = df.iloc[0]
        shapes.append({"model": name, "n_head": r.n_head, "n_kv_head": r.n_kv_head,
                       "n_embd": r.n_embd, "n_expanded_embd": r.n_expanded_embd,
                       "vocab_size": r.vocab_size, "use_gated_mlp": bool(r.use_gated_mlp)})
    pd.concat(rows).to_csv(dest / "compute.csv", index=False, float_format="%.5g")
    pd.DataFrame(shapes).to_csv(dest / "profiled_shapes.csv", index=False)

    att = pd.read_csv(root / "attention" / "llama-70b-shape-tp2.csv")
    pre = att[att.is_prefill]
    pd.DataFrame({"chunk": pre.prefill_chunk_size, "kv": pre.kv_cache_size,
                  "time_ms": pre["time_stats.attn_prefill.median"]
                  + pre["time_stats.attn_output_reshape.median"]}) \
        .groupby(["chunk", "kv"], as_index=False).mean() \
        .to_csv(dest / "attention_prefill.csv", index=False, float_format="%.5g")
    dec = att[~att.is_prefill]
    keep = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 80, 96, 112, 128}
    dec = dec[dec.batch_size.isin(keep)]
    pd.DataFrame({"batch": dec.batch_size, "kv": dec.kv_cache_size,
                  "time_ms": dec["time_stats.attn_decode.median"]
                  + dec["time_stats.attn_output_reshape.median"]}) \
        .groupby(["batch", "kv"], as_index=False).mean() \
        .to_csv(dest / "attention_decode.csv", index=False, float_format="%.5g")

    net = pd.read_csv(root / "network" / "a100_dgx" / "all_reduce.csv")
    # Tensor parallelism stays inside one DGX node: all workers on the same node.
    net = net[(net.devices_per_node == net.num_workers) & (net.num_workers <= 8)]
    pd.DataFrame({"num_workers": net.num_workers, "size": net["size"],
                  "time_ms": net["time_stats.all_reduce.median"]}) \
        .groupby(["num_workers", "size"], as_index=False).mean() \
        .to_csv(dest / "all_reduce.csv", index=False, float_format="%.5g")

    cpu = pd.read_csv(root / "cpu" / "cpu_overheads.csv")
    cols = ["schedule_median", "sampler_e2e_median", "prepare_inputs_e2e_median",
            "process_model_outputs_median", "ray_comm_time_mean"]
    cpu = cpu[["model_name", "tensor_parallel_degree", "batch_size"] + cols]
    cpu = cpu.rename(columns={"tensor_parallel_degree": "tp", "batch_size": "batch"})
    cpu.groupby(["model_name", "tp", "batch"], as_index=False).mean() \
        .to_csv(dest / "cpu_overheads.csv", index=False, float_format="%.5g")
    shutil.copy(root / "LICENSE", dest / "LICENSE")


def main(argv=None) -> int:
    """Entry point: ``SOURCE (--out DIR | --write)``; see :func:`experiments._common.bundle_args`."""
    p = bundle_parser("_bundle_a100_data", __doc__,
                      "the raw Vidur A100 profiling folder (e.g. ../shared/data/a100-profiling)")
    _, source, out = bundle_args(p, argv, NEEDS)
    bundle(source, out)
    print(f"wrote {out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
