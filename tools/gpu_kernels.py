"""Kernel-level checks of the AIConfigurator tables (docs/gpus.md prints these tables).

Three parts, every figure computed here from the shipped data:

* **coverage**: per GPU, the source of each kernel class (measured / derived / extrapolated);
* **against this project's measurements**: the AIConfigurator A100 and H200 tables read at the
  shapes simsched's own A100 (Vidur) and H200 (operator) profiles measured, per kernel class:
  MAPE and the median signed difference (tables / measured - 1), and whole H200 decode steps of a
  Llama-3-8B shape (``h200/iteration.csv``) under both profiles (``engine_overhead="none"``);
* **leave one GPU out**: each GPU's measured kernels predicted from the other eight GPUs' and its
  own spec sheet: time = roofline on its datasheet (bf16 FLOP/s, HBM bandwidth) / the median
  efficiency the other GPUs reach at the same shape, on measured grid points only (no
  interpolation): GEMMs (n, k 1,024-16,384, tokens 1-8,192), prefill attention (32 query / 8 KV
  heads, 512-16,384 tokens), decode attention (32 / 8 heads, batch 1-256, 1,024-16,384 tokens).

Run: ``python -m tools.gpu_kernels [--part coverage|compare|loo|all]``.
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import pandas as pd

from simsched.cost import aiconfigurator as aic
from simsched.cost import calibration as cal
from simsched.cost import calibration_h200 as h200cal
from simsched.cost.base import Batch
from simsched.cost.calibrated import CalibratedCostModel
from simsched.cost.hardware import GPUS, MODELS
from simsched.cost.profiles.aiconfigurator import AIConfiguratorProfile

MODELS_A100 = ("llama-2-7b", "llama-2-70b", "llama-3-8b", "llama-3-70b")
OPS = {"qkv": 0, "out": 1, "up": 2, "down": 3}
H200_OPS = {"attn_pre_proj": 0, "attn_post_proj": 1, "mlp_up_proj": 2, "mlp_down_proj": 3}


def _stats(pred: np.ndarray, meas: np.ndarray) -> tuple[int, float, float]:
    rel = np.asarray(pred) / np.asarray(meas) - 1.0
    return len(rel), float(np.mean(np.abs(rel)) * 100), float(np.median(rel) * 100)


def coverage_table() -> str:
    """Markdown: per GPU, the source of each kernel class."""
    rows = ["| GPU | vLLM | GEMM | prefill attention | decode attention | all-reduce |",
            "|---|---|---|---|---|---|"]
    for g in aic.gpus():
        c = aic.coverage(g)
        rows.append(f"| {g} | {aic.manifest()['gpus'][g]['vllm']} | {c['gemm']} | "
                    f"{c['context attention']} | {c['generation attention']} | "
                    f"{c['all-reduce']} |")
    return "\n".join(rows)


def _gemm_rows(gpu: str, frame: pd.DataFrame, ops: dict, spec_of) -> list[tuple]:
    out = []
    for name, i in ops.items():
        pred, meas = [], []
        for (model, tp), d in frame.groupby(["model", "tp"]):
            k, n = cal.gemm_shapes(spec_of(model), int(tp))[i]
            pred.append(aic.gemm(gpu, "bfloat16", d.num_tokens.to_numpy(), n, k))
            meas.append(d[name].to_numpy() * 1e-3)
        out.append((f"GEMM {list(OPS)[i]}",) + _stats(np.concatenate(pred), np.concatenate(meas)))
    return out


def compare_rows() -> list[tuple[str, str, int, float, float]]:
    """(GPU, kernel class, points, MAPE %, median signed %): the AIConfigurator A100/H200 tables
    against this project's measured kernels."""
    rows = []
    # A100: Vidur's per-op GEMMs, the 70B-shape TP2 attention (32 query, 4 KV heads), NCCL.
    comp = cal.load("compute")
    comp = comp[comp.model.isin(MODELS_A100)]
    res = _gemm_rows("a100-80gb", comp, OPS, MODELS.__getitem__)
    pre = cal.load("attention_prefill")
    pre = pre[pre.kv == 0]
    res.append(("prefill attention",) + _stats(
        aic.context_attention("a100-80gb", 32, 4, 128, pre.chunk.to_numpy()),
        pre.time_ms.to_numpy() * 1e-3))
    res.append(("decode attention",) + _decode_stats("a100-80gb", cal.load("attention_decode"),
                                                     32, 4, "batch", "kv"))
    ar = cal.load("all_reduce")
    ar_pred = np.concatenate([aic.all_reduce("a100-80gb", int(w), d["size"].to_numpy())
                              for w, d in ar.groupby("num_workers")])
    ar_meas = np.concatenate([d.time_ms.to_numpy() * 1e-3 for _, d in ar.groupby("num_workers")])
    res.append(("all-reduce (NCCL, TP 2-8)",) + _stats(ar_pred, ar_meas))
    rows += [("a100-80gb",) + r for r in res]
    # H200: this project's operator profiles.
    lin = h200cal.load("linear")
    res = _gemm_rows("h200", lin, H200_OPS, MODELS.__getitem__)
    pre = h200cal.load("attn_prefill")
    p, m = [], []
    for (model, tp), d in pre.groupby(["model", "tp"]):
        s = MODELS[model]
        p.append(aic.context_attention("h200", s.num_heads // tp, max(1, s.num_kv_heads // tp),
                                       s.head_dim, d.num_tokens.to_numpy()))
        m.append(d.prefill_attention_ms.to_numpy() * 1e-3)
    res.append(("prefill attention",) + _stats(np.concatenate(p), np.concatenate(m)))
    dec = h200cal.load("attn_decode")
    p, m = [], []
    for (model, tp), d in dec.groupby(["model", "tp"]):
        s = MODELS[model]
        n = _decode_stats("h200", d, s.num_heads // tp, max(1, s.num_kv_heads // tp), "batch",
                          "context", "decode_attention_ms", raw=True)
        p.append(n[0])
        m.append(n[1])
    res.append(("decode attention",) + _stats(np.concatenate(p), np.concatenate(m)))
    rows += [("h200",) + r for r in res]
    return rows


def compare_table() -> str:
    """Markdown: :func:`compare_rows`."""
    rows = ["| GPU | kernel class | points | MAPE % | median signed % |", "|---|---|---|---|---|"]
    rows += [f"| {g} | {c} | {n} | {mape:.1f} | {signed:+.1f} |"
             for g, c, n, mape, signed in compare_rows()]
    return "\n".join(rows)


def _decode_stats(gpu, frame, hq, hkv, bcol, ccol, tcol="time_ms", raw=False):
    batch, a, s = aic.generation_attention(gpu, hq, hkv, 128)
    b = frame[bcol].to_numpy(dtype=float)
    pred = np.interp(b, batch, a) + np.interp(b, batch, s) * b * frame[ccol].to_numpy()
    meas = frame[tcol].to_numpy() * 1e-3
    return (pred, meas) if raw else _stats(pred, meas)


def step_rows() -> list[tuple[int, float, float, float]]:
    """Whole H200 decode steps (Llama-3-8B shape, context 1,024): (batch, measured GPU ms, H200
    profile ms, AIConfigurator tables ms), both models with ``engine_overhead="none"``."""
    steps = h200cal.load("iteration")
    spec, gpu = MODELS["llama-3-8b"], GPUS["h200"]
    own = CalibratedCostModel(spec, gpu, 1, "llama-3-8b", engine_overhead="none")
    tab = CalibratedCostModel(spec, dataclasses.replace(gpu, kernels="aic-h200"), 1,
                              "llama-3-8b", engine_overhead="none")
    out = []
    for r in steps.itertuples():
        b = Batch(num_decode_seqs=int(r.batch), decode_context_sum=int(r.batch * r.context))
        out.append((int(r.batch), float(r.graph_gpu_ms), own.iteration_time(b) * 1e3,
                    tab.iteration_time(b) * 1e3))
    return out


def step_table() -> str:
    """Markdown: :func:`step_rows` with each model's signed error."""
    rows = ["| batch | measured GPU ms | H200 profile (default) | AIConfigurator tables |",
            "|---|---|---|---|"]
    for b, meas, own, tab in step_rows():
        rows.append(f"| {b} | {meas:.2f} | {own:.2f} ({(own / meas - 1) * 100:+.0f} %) | "
                    f"{tab:.2f} ({(tab / meas - 1) * 100:+.0f} %) |")
    return "\n".join(rows)


def catalog_table() -> str:
    """Markdown: the spec-sheet facts of every catalog GPU."""
    rows = ["| GPU | kernels | bf16 TFLOP/s | FP8 | FP4 | HBM TB/s | memory GiB | link | "
            "NVLink domain |", "|---|---|---|---|---|---|---|---|---|"]
    for name, g in GPUS.items():
        rows.append(f"| {name} | {g.kernels} | {g.peak_flops / 1e12:.0f} | "
                    f"{g.fp8_flops / 1e12:.0f} | {g.fp4_flops / 1e12:.0f} | "
                    f"{g.mem_bandwidth / 1e12:.2f} | {g.memory_bytes / 2**30:.0f} | "
                    f"{g.nvlink} | {g.nvlink_domain} |")
    return "\n".join(rows)


# ----------------------------------------------------------------------------- leave one out


def _points(gpu: str) -> dict[str, dict[tuple, tuple[float, float]]]:
    """Per kernel class and measured grid point, (measured seconds, roofline seconds on the
    GPU's datasheet: bf16 FLOP/s and HBM bandwidth)."""
    t, g = aic.tables(gpu), GPUS[gpu]
    m_axis, n_axis, k_axis = list(t["gemm_m"]), list(t["gemm_n"]), list(t["gemm_k"])
    sizes = (1024, 2048, 4096, 8192, 16384)
    gemm = {}
    for m in (x for x in (1, 8, 64, 256, 1024, 4096, 8192) if x in m_axis):
        for n in sizes:
            for k in sizes:
                v = t["gemm_bfloat16"][m_axis.index(m), n_axis.index(n), k_axis.index(k)]
                gemm[(m, n, k)] = (v * 1e-3, max(2.0 * m * n * k / g.peak_flops,
                                                 2.0 * (m * k + k * n + m * n) / g.mem_bandwidth))
    hq, hkv, d = 32, 8, 128
    row = t[f"ctx_bfloat16_{hkv}_{d}"][list(t["ctx_heads"]).index(hq)]
    pre = {(int(s),): (row[i] * 1e-3, 2.0 * s * s * d * hq / g.peak_flops)
           for i, s in enumerate(t["ctx_isl"]) if 512 <= s <= 16384 and not np.isnan(row[i])}
    grid = t[f"gen_bfloat16_{hkv}_{d}"][list(t["gen_heads"]).index(hq)]
    dec = {(int(b), int(s)): (grid[i, j] * 1e-3, b * s * 2 * hkv * d * 2 / g.mem_bandwidth)
           for i, b in enumerate(t["gen_batch"]) for j, s in enumerate(t["gen_seq"])
           if b <= 256 and 1024 <= s <= 16384 and not np.isnan(grid[i, j])}
    return {"GEMM bf16": gemm, "prefill attention": pre, "decode attention": dec}


def loo_rows() -> dict[str, dict[str, tuple[int, float, float]]]:
    """Per held-out GPU and kernel class: (points, MAPE %, median signed %) of its measured
    kernels predicted from the other GPUs' efficiencies and its own spec sheet."""
    pts = {g: _points(g) for g in aic.gpus()}
    out = {}
    for g in aic.gpus():
        out[g] = {}
        for c in pts[g]:
            meas, pred = [], []
            for key, (t, roof) in pts[g][c].items():
                eff = [pts[o][c][key][0] / pts[o][c][key][1] for o in aic.gpus()
                       if o != g and key in pts[o][c]]
                if eff:
                    meas.append(t)
                    pred.append(roof * float(np.median(eff)))
            out[g][c] = _stats(np.array(pred), np.array(meas))
    return out


def loo_table() -> str:
    """Markdown: :func:`loo_rows`."""
    res = loo_rows()
    classes = list(next(iter(res.values())))
    rows = ["| GPU held out | " + " | ".join(f"{c}: MAPE % (signed median), points"
                                             for c in classes) + " |",
            "|---" * (len(classes) + 1) + "|"]
    for g, per in res.items():
        rows.append(f"| {g} | " + " | ".join(f"{mape:.0f} ({signed:+.0f}), {n}"
                                            for n, mape, signed in per.values()) + " |")
    return "\n".join(rows)


def main(argv=None) -> dict[str, str]:
    """Print the requested parts; return them as Markdown strings by name."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--part", default="all", choices=["coverage", "compare", "loo", "all"])
    args = p.parse_args(argv)
    parts = {"coverage": lambda: catalog_table() + "\n\n" + coverage_table(),
             "compare": lambda: compare_table() + "\n\n" + step_table(), "loo": loo_table}
    out = {}
    for name, fn in parts.items():
        if args.part in (name, "all"):
            out[name] = fn()
            print(out[name], end="\n\n")
    return out


if __name__ == "__main__":
    main()
