"""Measured kernel tables from AIConfigurator, and how times are read off them.

The tables (``cost/data/aiconfigurator/<gpu>.npz``, reduced from github.com/ai-dynamo/
aiconfigurator's vLLM kernel databases by ``python -m tools.reduce_aiconfigurator``;
Apache-2.0, licence beside them) hold, per GPU, latencies in milliseconds of the kernels below.
The same arrays measured under SGLang 0.5.9 and TensorRT-LLM 1.2.0rc5 on the H100 and H200 are
the table sets ``<engine>-<gpu>`` (:func:`engine_sets`; ``sglang-h200.npz``, ...): every function
here takes a GPU name or such a set name.

* GEMMs by tokens ``m`` x output width ``n`` x input width ``k`` for bf16, fp8, fp8 block-scaled
  and NVFP4 weights;
* context attention of one sequence by query heads x tokens, and generation attention by query
  heads x batch x KV tokens, per KV dtype, KV heads and head size;
* all-reduces by GPUs x message bytes (vLLM's custom all-reduce in a CUDA graph, and NCCL);
* (H100 and H200) vLLM's whole MLA attention module of DeepSeek-V3's shape, context by query heads
  x batch x tokens and generation by query heads x batch x KV tokens, per GEMM weights and KV
  dtype; :mod:`simsched.cost.aiconfigurator_mla` reads it.

Reading rule (every query says whether it stayed inside the measured grid): inside, times are
interpolated (GEMM: log time bilinear in log n, log k, piecewise linear in m; attention:
piecewise linear in heads, log-log in tokens; all-reduce: log-log in bytes). Outside, and only
there, they are extrapolated: a GEMM wider than the grid grows in proportion to its width, one
with more tokens in proportion to the tokens; prefill attention past the longest measured prompt
grows with its causal FLOPs (quadratically); an all-reduce past the largest message with its
bytes. :func:`coverage` reports the extrapolated parts.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent / "data" / "aiconfigurator"
GEMM_DTYPES = ("bfloat16", "fp8", "fp8_block", "nvfp4")
MS = 1e-3


@functools.lru_cache(maxsize=None)
def manifest() -> dict:
    """``manifest.json``: the source commit and, per GPU, the vLLM version and kernel sources."""
    return json.loads((DATA / "manifest.json").read_text())


def gpus() -> list[str]:
    """The simsched GPU names with shipped AIConfigurator (vLLM) tables."""
    return sorted(manifest()["gpus"])


def engine_sets() -> list[str]:
    """The other engines' table sets, ``<engine>-<gpu>`` (SGLang's, TensorRT-LLM's)."""
    return sorted(manifest().get("engines", {}))


def entry(name: str) -> dict:
    """The manifest entry of a GPU's vLLM tables or of an engine's table set."""
    m = manifest()
    found = m["gpus"].get(name) or m.get("engines", {}).get(name)
    if found is None:
        raise ValueError(f"gpu: no AIConfigurator kernel tables for {name!r}; measured: "
                         f"{gpus()}; engine sets: {engine_sets()}")
    return found


@functools.lru_cache(maxsize=None)
def tables(gpu: str) -> dict[str, np.ndarray]:
    """Every array of ``gpu``'s table file (GEMM holes filled, see :func:`_fill_gemm`);
    ``gpu`` may be an engine's table set (:func:`engine_sets`)."""
    entry(gpu)
    with np.load(DATA / f"{gpu}.npz", allow_pickle=False) as z:
        arrays = {k: z[k].astype(float) if z[k].dtype.kind == "f" else z[k] for k in z.files}
    for key in [k for k in arrays if k.startswith("gemm_") and arrays[k].ndim == 3]:
        arrays[key] = _fill_gemm(arrays[key], arrays["gemm_n"], arrays["gemm_k"])
    return arrays


def _fill_gemm(grid: np.ndarray, n_axis: np.ndarray, k_axis: np.ndarray) -> np.ndarray:
    """Fill the few unmeasured cells (the widest shapes at few tokens, which ran out of memory):
    the next narrower measured cell along k (else n) scaled by the width ratio."""
    grid = grid.copy()
    for i, j, l in np.argwhere(np.isnan(grid)):
        narrower = [(j, x) for x in range(l - 1, -1, -1)] + [(x, l) for x in range(j - 1, -1, -1)]
        for jj, ll in narrower:
            if not np.isnan(grid[i, jj, ll]):
                width = (n_axis[j] * k_axis[l]) / (n_axis[jj] * k_axis[ll])
                grid[i, j, l] = grid[i, jj, ll] * width
                break
    return grid


def _bracket(axis: np.ndarray, x: float) -> tuple[int, int, float, float]:
    """Neighbouring grid indices of ``x`` on a log axis, the weight of the upper one, and the
    proportional scale for ``x`` outside the axis (1 inside)."""
    if x <= axis[0]:
        return 0, 0, 0.0, x / axis[0]
    if x >= axis[-1]:
        return len(axis) - 1, len(axis) - 1, 0.0, x / axis[-1]
    hi = int(np.searchsorted(axis, x))
    lo = hi - 1
    w = (np.log(x) - np.log(axis[lo])) / (np.log(axis[hi]) - np.log(axis[lo]))
    return lo, hi, float(w), 1.0


def _padded(times: np.ndarray) -> np.ndarray:
    """Times along increasing token counts, each the least at that count or more: a kernel of
    m tokens never takes longer than the same kernel of more (it can be padded to them). It
    drops the tables' single slow points (the Blackwell FP8 GEMM tables' 1-token points and
    isolated spikes, fused-MoE rows' points up to 20x their neighbours), which the running
    maximum of the step tables (KernelTables.finish_linear) would otherwise carry to every
    larger batch; points no larger count undercuts are read as measured."""
    return np.minimum.accumulate(times[::-1])[::-1]


def gemm(gpu: str, dtype: str, m, n: int, k: int) -> np.ndarray:
    """Seconds of an ``m x k`` by ``k x n`` GEMM with ``dtype`` weights on ``gpu`` (``m`` may be
    an array of token counts; 0 tokens take 0 s). Each measured token count reads the least
    time measured at that many tokens or more (a GEMM can be padded to more rows)."""
    t = tables(gpu)
    key = f"gemm_{dtype}"
    if key not in t:
        have = [d for d in GEMM_DTYPES if f"gemm_{d}" in t]
        raise ValueError(f"dtype: {gpu} has no measured {dtype!r} GEMMs (measured: {have})")
    grid, m_axis = t[key], t["gemm_m"].astype(float)
    nl, nh, nw, ns = _bracket(t["gemm_n"].astype(float), float(n))
    kl, kh, kw, ks = _bracket(t["gemm_k"].astype(float), float(k))
    # Log time bilinear in (log n, log k), for each measured token count.
    log = np.log(grid)
    col = np.exp((1 - nw) * (1 - kw) * log[:, nl, kl] + nw * (1 - kw) * log[:, nh, kl]
                 + (1 - nw) * kw * log[:, nl, kh] + nw * kw * log[:, nh, kh])
    col = _padded(col * ns * ks)
    m = np.asarray(m, dtype=float)
    out = np.interp(m, m_axis, col)
    past = m > m_axis[-1]
    out = np.where(past, col[-1] * m / m_axis[-1], out)
    return np.where(m > 0, out, 0.0) * MS


def _nkv_key(t: dict, prefix: str, kv: str, hq: int, hkv: int, hd: int) -> tuple[str, float, float]:
    """The measured table for (KV dtype, KV heads, head size), the factor by which KV-bound time
    scales when the exact KV-head count was not measured (the nearest smaller one is used), and
    the factor for a head size not measured (the nearest measured one, time in proportion)."""
    sizes = sorted({int(x.split("_")[3]) for x in t if x.startswith(f"{prefix}_{kv}_")
                    and t[x].ndim >= 2})
    if not sizes:
        raise ValueError(f"no measured {prefix} attention with {kv} KV")
    near = min(sizes, key=lambda x: (abs(x - hd), x))
    hd_scale = hd / near
    want = 0 if hkv == hq else hkv
    key = f"{prefix}_{kv}_{want}_{near}"
    if key in t:
        return key, 1.0, hd_scale
    have = sorted(int(x.split("_")[2]) for x in t
                  if x.startswith(f"{prefix}_{kv}_") and x.endswith(f"_{near}") and t[x].ndim >= 2)
    below = [x for x in have if 0 < x <= hkv] or [min(x for x in have if x > 0)]
    return f"{prefix}_{kv}_{below[-1]}_{near}", hkv / below[-1], hd_scale


def along_heads(grid: np.ndarray, heads: np.ndarray, hq: int) -> np.ndarray:
    """The grid's rows interpolated (piecewise linear) to ``hq`` query heads over the measured
    head counts; proportional beyond them."""
    ok = ~np.isnan(grid).all(axis=tuple(range(1, grid.ndim)))
    h, g = heads[ok].astype(float), grid[ok]
    if hq >= h[-1]:
        return g[-1] * hq / h[-1]
    if hq <= h[0]:
        return g[0] * hq / h[0]
    hi = int(np.searchsorted(h, hq))
    w = (hq - h[hi - 1]) / (h[hi] - h[hi - 1])
    return (1 - w) * g[hi - 1] + w * g[hi]


def context_attention(gpu: str, hq: int, hkv: int, hd: int, tokens, kv: str = "bfloat16"):
    """Seconds of causal prefill attention for one sequence of ``tokens`` (array) with ``hq`` query
    and ``hkv`` KV heads per GPU; past the longest measured prompt it grows quadratically."""
    t = tables(gpu)
    key, _, hd_scale = _nkv_key(t, "ctx", kv, hq, hkv, hd)
    row = along_heads(t[key], t["ctx_heads"], hq) * hd_scale
    isl = t["ctx_isl"].astype(float)
    ok = ~np.isnan(row)
    isl, row = isl[ok], row[ok]
    x = np.asarray(tokens, dtype=float)
    out = np.exp(np.interp(np.log(np.maximum(x, 1.0)), np.log(isl), np.log(row)))
    out = np.where(x > isl[-1], row[-1] * (x / isl[-1]) ** 2, out)
    return np.where(x > 0, out, 0.0) * MS


def _measured_row(t: dict, key: str, heads: int) -> bool:
    hs = list(t["gen_heads"])
    return key in t and heads in hs and not np.isnan(t[key][hs.index(heads)]).all()


def _generation_source(t: dict, kv: str, hq: int, hkv: int, hd: int) -> tuple[str, int, int]:
    """(table, query heads, r) whose decode attention stands for ``hq`` query / ``hkv`` KV heads:
    the measured row itself (r = 1) or, when not measured, a row with the same query heads per
    KV head and ``hkv / r`` KV heads, read at ``r`` times the batch. A decode kernel works per
    (sequence, KV head): n sequences of ``hkv`` KV heads are r n sequences of ``hkv / r`` in
    work units and bytes (the MHA tables stop at 8 heads on most GPUs)."""
    group = max(1, hq // hkv)
    exact = f"gen_{kv}_{0 if hq == hkv else hkv}_{hd}"
    if _measured_row(t, exact, hq):
        return exact, hq, 1
    for r in range(2, hkv + 1):
        if hkv % r:
            continue
        sub = hkv // r
        key = f"gen_{kv}_{0 if group == 1 else sub}_{hd}"
        if _measured_row(t, key, sub * group):
            return key, sub * group, r
    return "", hq, 1


def generation_attention(gpu: str, hq: int, hkv: int, hd: int, kv: str = "bfloat16"):
    """Decode attention as ``(batch sizes, fixed seconds, seconds per KV token read)``: per
    measured batch size the chord ``a + s x (batch x KV tokens)`` through its measured times at
    the shortest context of at least 1,024 tokens and at the longest measured context (decode
    attention reads the KV cache: time is close to linear in it there). A chord of measured
    points, not a least-squares fit: runs read tables, they never fit. A head layout not
    measured is read off :func:`_generation_source`'s row (batch sizes divided by r, the cost
    per token times r); failing that, the nearest KV-head table along the heads."""
    t = tables(gpu)
    key, scale, hd_scale = _nkv_key(t, "gen", kv, hq, hkv, hd)
    near_hd = int(key.rsplit("_", 1)[1])
    src, src_hq, r = _generation_source(t, kv, hq, hkv, near_hd)
    if src:
        key, scale = src, 1.0
        grid = t[key][list(t["gen_heads"]).index(src_hq)]
    else:
        grid = along_heads(t[key], t["gen_heads"], hq)          # batch x seq
    scale *= hd_scale * r
    batch, seq = t["gen_batch"].astype(float), t["gen_seq"].astype(float)
    a, s = np.zeros(len(batch)), np.zeros(len(batch))
    for i, b in enumerate(batch):
        ok = ~np.isnan(grid[i]) & (seq >= 1024)
        if ok.sum() < 2:   # the large-batch corner measured at short contexts only
            ok = ~np.isnan(grid[i])
        x, y = b * seq[ok], grid[i][ok] * MS
        if len(x) < 2:
            a[i], s[i] = (a[i - 1], s[i - 1]) if i else (y[0], 0.0)
            continue
        slope = max((y[-1] - y[0]) / (x[-1] - x[0]), 0.0)
        a[i], s[i] = max(y[0] - slope * x[0], 0.0), slope * scale
    return batch / r, a, s


def _ar_row(t: dict, i: int) -> np.ndarray:
    """Per message size, the faster of the custom all-reduce and NCCL measured (NaN: neither)."""
    custom, nccl = t["ar_custom"][i], t["ar_nccl"][i]
    return np.where(np.isnan(custom), nccl, np.where(np.isnan(nccl), custom,
                                                     np.minimum(custom, nccl)))


def measured_all_reduce_gpus(gpu: str) -> list[int]:
    """The GPU counts with a measured all-reduce on ``gpu``."""
    t = tables(gpu)
    return [int(g) for i, g in enumerate(t["ar_gpus"]) if not np.isnan(_ar_row(t, i)).all()]


def all_reduce(gpu: str, num_gpus: int, nbytes) -> np.ndarray:
    """Seconds of one all-reduce of ``nbytes`` (array) over ``num_gpus`` GPUs: the faster of
    vLLM's custom all-reduce (CUDA graph) and NCCL as measured; past the largest message in
    proportion to the bytes. A GPU count not measured (8 GB200s: AIConfigurator measured 2 and
    4) is extrapolated from the largest measured one by the ring's bytes per GPU,
    2 (p - 1) / p."""
    nbytes = np.asarray(nbytes, dtype=float)
    if num_gpus == 1:
        return np.zeros_like(nbytes)
    t = tables(gpu)
    have = measured_all_reduce_gpus(gpu)
    if not have:
        raise ValueError(f"tensor_parallel_size: no all-reduce measured on {gpu}")
    base = num_gpus if num_gpus in have else max([g for g in have if g < num_gpus] or have)
    factor = (2.0 * (num_gpus - 1) / num_gpus) / (2.0 * (base - 1) / base)
    lat = _ar_row(t, list(t["ar_gpus"]).index(base))
    ok = ~np.isnan(lat)
    sizes, lat = t["ar_bytes"].astype(float)[ok], lat[ok]
    x = np.maximum(nbytes, sizes[0])
    out = np.exp(np.interp(np.log(x), np.log(sizes), np.log(lat)))
    out = np.where(x > sizes[-1], lat[-1] * x / sizes[-1], out)
    return out * factor * MS


# MoE weight formats of the tables (moe_keys' dtype codes, as tools.reduce_aiconfigurator
# writes them) and the tables a ModelSpec expert dtype reads, in order of preference (FP8
# checkpoints of MoE models ship block-scaled: Qwen3, MiniMax, DeepSeek).
MOE_DTYPES = ("bfloat16", "fp8", "fp8_block", "int4_wo", "w4a16_mxfp4", "nvfp4",
              "w4a8_mxfp4_fp8")
MOE_TABLES = {"auto": ("bfloat16",), "bf16": ("bfloat16",), "fp16": ("bfloat16",),
              "fp8": ("fp8_block", "fp8"), "int4": ("int4_wo",),
              "mxfp4": ("w4a16_mxfp4", "w4a8_mxfp4_fp8"), "nvfp4": ("nvfp4",)}


def moe(gpu: str, dtype: str, hidden: int, width: int, top_k: int, experts: int,
        moe_tp: int, moe_ep: int, tokens) -> np.ndarray | None:
    """Seconds of one fused MoE layer (routing, permutation, the experts' GEMMs, activation,
    weighted sum) for ``tokens`` (array) entering it, as measured for exactly this shape and
    dtype (``dtype``: a ``ModelSpec`` expert dtype) at ``moe_tp`` x ``moe_ep`` ranks, piecewise
    linear between measured token counts (each the least time measured at that many tokens or
    more, as :func:`gemm`), in proportion past the largest; None when that shape was not
    measured on ``gpu`` (the caller derives it instead)."""
    t = tables(gpu)
    if "moe_keys" not in t:
        return None
    keys, lat = t["moe_keys"], t["moe_lat"]
    for name in MOE_TABLES.get(dtype, ()):
        want = np.array([MOE_DTYPES.index(name), hidden, width, top_k, experts, moe_tp, moe_ep])
        rows = np.flatnonzero((keys == want).all(axis=1))
        if not len(rows):
            continue
        row = lat[rows[0]]
        ok = ~np.isnan(row)
        if ok.sum() < 2:
            continue
        m, y = t["moe_tokens"].astype(float)[ok], _padded(row[ok])
        x = np.asarray(tokens, dtype=float)
        out = np.interp(x, m, y)
        out = np.where(x > m[-1], y[-1] * x / m[-1], out)
        return np.where(x > 0, out, 0.0) * MS
    return None


# Each engine's custom all-reduce (the manifest's kernel source) as coverage() names it.
_AR_LABELS = {"vLLM_custom_graph": "vLLM custom all-reduce",
              "SGLang_CustomAllReduce_graph": "SGLang custom all-reduce",
              "TRTLLM": "TensorRT-LLM custom all-reduce"}


def coverage(gpu: str) -> dict[str, str]:
    """Per kernel class, what the tables hold for ``gpu`` (``describe()`` prints it)."""
    t, m = tables(gpu), entry(gpu)
    dtypes = [d for d in GEMM_DTYPES if f"gemm_{d}" in t]
    kv = sorted(m["generation_attention"])
    ar = measured_all_reduce_gpus(gpu)
    others = [g for g in (2, 4, 8) if g not in ar]
    return {
        "gemm": f"measured ({', '.join(dtypes)}; m {int(t['gemm_m'][0])}-{int(t['gemm_m'][-1])}, "
                f"n, k {int(t['gemm_n'][0])}-{int(t['gemm_n'][-1])}; beyond: extrapolated)",
        "context attention": f"measured (KV {', '.join(kv)}; up to {int(t['ctx_isl'][-1])} "
                             f"tokens, beyond: extrapolated quadratically)",
        "generation attention": f"measured (KV {', '.join(kv)}; batch up to "
                                f"{int(t['gen_batch'][-1])}, context up to "
                                f"{int(t['gen_seq'][-1])})",
        "all-reduce": f"measured ({_AR_LABELS.get(m['all_reduce']['custom'].split(' (')[0])} "
                      f"and NCCL, TP {ar})"
                      + (f"; TP {others} extrapolated" if others else ""),
        "element-wise, cached-prefix attention":
            "derived: H200 fits scaled by HBM bandwidth / FLOP/s",
        "MoE experts": (f"measured (fused MoE layers, {len(t['moe_keys'])} shapes x MoE TP/EP; "
                        "other shapes derived)" if "moe_keys" in t else
                        "derived: H200 fits scaled by the datasheet"),
        "MoE attention/dense parts, MLA projections, INT4 models": "derived: H200 fits "
            "scaled by the datasheet" + ("" if "gemm_fp8" in t else "; FP8 weights too"),
        "MLA attention": (
            f"measured (vLLM MLA module of DeepSeek-V3's shape, KV bf16/fp8, "
            f"{int(t['mla_ctx_heads'][0])}-{int(t['mla_ctx_heads'][-1])} heads; prefill: "
            f"the module's growth past 1 token less the derived projections', up to "
            f"{int(t['mla_ctx_isl'][-1])} tokens, beyond: extrapolated quadratically; decode: "
            f"per-KV-token cost, batch up to "
            f"{int(t['mla_gen_batch'][-1])}, context up to {int(t['mla_gen_seq'][-1])}; "
            "fixed part derived)" if "mla_gen_heads" in t else
            "derived: grouped-query attention reading the compressed latent's bytes"),
        **({"vllm": f"vLLM {m['vllm']} kernels"} if "engine" not in m else
           {m["engine"]: f"{m['engine']} {m[m['engine']]} kernels"}),
    }
