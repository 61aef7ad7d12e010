"""The generated blocks of docs/gpus.md (see tools.docs.check_docs): per-GPU coverage, the
AIConfigurator tables against this project's measured kernels, and leave one GPU out, all from
:mod:`tools.gpu_kernels` (``python -m tools.gpu_kernels`` prints them)."""

from __future__ import annotations

from tools import gpu_kernels as gk
from tools.docs.doc_format import claim


def gpus_coverage(runs) -> str:
    """The catalog's spec-sheet facts and, per GPU, the source of each kernel class."""
    from simsched.cost import aiconfigurator as aic

    bf16, fp8 = (aic.gemm("b200", d, [16], 2 * 14336, 4096) for d in ("bfloat16", "fp8"))
    claim(fp8[0] < 0.8 * bf16[0], "B200 FP8 GEMM far shorter than bf16 at 16 tokens")
    for gpu in ("b200", "b300", "gb200", "gb300"):
        t = aic.tables(gpu)
        j, k = list(t["gemm_n"]).index(8192), list(t["gemm_k"]).index(8192)
        raw = t["gemm_fp8"][:, j, k].astype(float)
        claim(raw[0] > 1.5 * raw[1:].min(), f"{gpu}: a 1-token FP8 GEMM measured well above "
              "a larger one (the padding envelope's case)")
    return gk.catalog_table() + "\n\n" + gk.coverage_table()


def gpus_compare(runs) -> str:
    """The A100/H200 tables at the shapes simsched's own profiles measured; whole H200 steps."""
    rows = {(g, c): (mape, signed) for g, c, _, mape, signed in gk.compare_rows()}
    claim(all(abs(v[1]) <= 5 for (g, c), v in rows.items() if g == "h200" and "GEMM" in c),
          "the H200 GEMMs agree within 5 % in the median")
    claim(all(v[1] < 0 for (g, c), v in rows.items() if g == "a100-80gb"
              and ("GEMM" in c or "prefill" in c)),
          "Vidur's A100 GEMMs and prefill attention are slower than the tables'")
    claim(rows[("a100-80gb", "all-reduce (NCCL, TP 2-8)")][1] > 0,
          "Vidur's NCCL all-reduce is faster than the tables'")
    steps = gk.step_rows()
    claim(all(abs(tab - meas) < abs(own - meas) for _, meas, own, tab in steps),
          "the AIConfigurator tables are closer to every measured H200 step than the profile")
    claim(all(tab < meas and own < meas for _, meas, own, tab in steps),
          "both models are under every measured H200 step")
    return gk.compare_table() + "\n\n" + gk.step_table()


def gpus_loo(runs) -> str:
    """Each GPU's kernels from the other GPUs' efficiencies and its own spec sheet."""
    res = gk.loo_rows()
    claim(all(res[g]["decode attention"][1] <= 10
              for g in ("b200", "b300", "gb200", "gb300", "h200")),
          "decode attention within 10 % on every Blackwell and the H200")
    claim(all(res[g][c][1] > 50 for g in ("l40s", "rtx-pro-6000")
              for c in ("GEMM bf16", "decode attention")),
          "the L40S and RTX Pro 6000 are more than 50 % off on GEMMs and decode attention")
    return gk.loo_table()
