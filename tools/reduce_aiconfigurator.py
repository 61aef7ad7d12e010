"""Reduce AIConfigurator's measured kernel databases to the tables simsched ships.

AIConfigurator (github.com/ai-dynamo/aiconfigurator, Apache-2.0) measures kernels per GPU, op,
serving framework and version under ``aic-core/src/aiconfigurator_core/systems/data/<gpu>/<op>/
<framework>/<version>/*.parquet``. This script reads the vLLM tables of the nine GPUs simsched
covers, and the SGLang and TensorRT-LLM tables of the H100 and H200 (:data:`ENGINE_SYSTEMS`), from
a Git checkout or mirror of that repository (read with ``git show``, so a bare mirror works and
the commit is recorded), keeps what the cost model uses and writes one compressed ``.npz`` per
GPU (``<gpu>.npz``: vLLM's; ``<engine>-<gpu>.npz``: another engine's, the same arrays) plus
``manifest.json`` (``gpus``: the vLLM sets; ``engines``: the others) to
``simsched/cost/data/aiconfigurator/``:

Latencies are float16 milliseconds.

* ``gemm_<dtype>``: GEMM latency (ms) on the grid ``gemm_m`` x ``gemm_n`` x ``gemm_k`` (NaN where
  not measured) for ``bfloat16``, ``fp8`` (per-tensor scales), ``fp8_block`` and ``nvfp4``; where a
  dtype has several kernels (fp8_block: DeepGEMM, CUTLASS, FlashInfer) the fastest per shape, as
  vLLM's kernel selection aims for. ``m`` (tokens) keeps the grid's main points, not the
  ``+1`` points AIConfigurator adds to catch tile boundaries;
* ``ctx_<kv>_<nkv>_<hd>``: context (prefill) attention of one sequence (batch 1), latency (ms) by
  ``ctx_heads`` (query heads per GPU) x ``ctx_isl`` (tokens), for KV dtype ``kv``, ``nkv`` KV
  heads per GPU (0: as many as query heads) and head size ``hd`` (64, 128), no sliding window;
* ``gen_<kv>_<nkv>_<hd>``: generation (decode) attention by ``gen_heads`` x ``gen_batch`` x
  ``gen_seq`` (KV tokens per sequence, ``isl + step``);
* ``ar_custom`` / ``ar_nccl``: all-reduce latency (ms) by ``ar_gpus`` (2, 4, 8) x ``ar_bytes``:
  vLLM's custom all-reduce captured in a CUDA graph, and NCCL's (fp16/bf16);
* ``moe_lat``: one fused MoE layer (routing, permutation, both expert GEMMs, activation and the
  weighted sum; not the router GEMM or shared experts) by ``moe_keys`` rows (index into
  ``MOE_DTYPES``, hidden size, expert width, top-k, experts, MoE TP, MoE EP) x ``moe_tokens``
  (tokens entering the layer), the fastest measured kernel per point, under AIConfigurator's
  ``power_law_1.01`` routing (skewed as trained routers are; ``balanced`` where not measured);
* ``mla_ctx_<gemm>_<kv>`` / ``mla_gen_<gemm>_<kv>`` (the GPUs of :data:`MLA_GPUS` only): vLLM's
  whole MLA attention module of DeepSeek-V3's shape (``DeepseekV2MLAAttention``: the low-rank
  projections, norms, rope, the attention kernel and the output projection; ``mla/vllm/<version>/
  mla_{context,generation}_module_perf.parquet``) for ``gemm`` weights (bfloat16, fp8_block) and
  KV dtype ``kv``: context by ``mla_ctx_heads`` (query heads per GPU) x ``mla_ctx_batch`` x
  ``mla_ctx_isl``, generation by ``mla_gen_heads`` x ``mla_gen_batch`` x ``mla_gen_seq`` (KV
  tokens per sequence); per point the fastest measured attention backend (vLLM picks the
  backend by phase and KV dtype: FlashAttention for long prefills, FlashAttention-MLA or
  FlashMLA otherwise).

The attention and GEMM tables take, per GPU, the kernel source vLLM uses by default there (the
one with the most rows); ``manifest.json`` records it, the vLLM and NCCL versions and the commit.
Deterministic: the same commit gives byte-identical files (sorted keys, fixed zip timestamps).

Run (maintainers; needs pyarrow)::

    python -m tools.reduce_aiconfigurator --repo /path/to/aiconfigurator[.git] [--commit REV]
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = "aic-core/src/aiconfigurator_core/systems"
OUT = Path(__file__).resolve().parents[1] / "simsched" / "cost" / "data" / "aiconfigurator"
# simsched GPU name -> (AIConfigurator system, vLLM version of the kernel tables). The newest
# vLLM version with GEMM, attention and all-reduce tables; the A100 has only 0.14.0's.
SYSTEMS = {
    "a100-80gb": ("a100_sxm", "0.14.0"),
    "h100-sxm": ("h100_sxm", "0.24.0"),
    "h200": ("h200_sxm", "0.24.0"),
    "b200": ("b200_sxm", "0.24.0"),
    "b300": ("b300_sxm", "0.24.0"),
    "gb200": ("gb200", "0.24.0"),
    "gb300": ("gb300", "0.24.0"),
    "l40s": ("l40s", "0.24.0"),
    "rtx-pro-6000": ("rtx_pro_6000_server", "0.24.0"),
}
# The other engines' tables: engine -> (its version whose tables are read, simsched GPU ->
# AIConfigurator system). SGLang 0.5.9 is the sglang engine's version; TensorRT-LLM 1.2.0rc5 is
# the oldest 1.x with tables on both GPUs (the silicon rows run 1.0-1.3).
ENGINE_SYSTEMS = {
    "sglang": ("0.5.9", {"h100-sxm": "h100_sxm", "h200": "h200_sxm"}),
    "trtllm": ("1.2.0rc5", {"h100-sxm": "h100_sxm", "h200": "h200_sxm"}),
}
# Each framework's custom all-reduce as captured in a CUDA graph (kernel_source).
CUSTOM_ALLREDUCE = {"vllm": "vLLM_custom_graph", "sglang": "SGLang_CustomAllReduce_graph",
                    "trtllm": "TRTLLM"}
GEMM_DTYPES = ("bfloat16", "fp8", "fp8_block", "nvfp4")
HEAD_DIMS = (64, 128)
# GPUs whose vLLM MLA module tables are shipped (the Hopper GPUs of the silicon rows).
MLA_GPUS = ("h100-sxm", "h200")
MLA_GEMMS = ("bfloat16", "fp8_block")
# MoE weight formats (index = the dtype code in moe_keys' first column).
MOE_DTYPES = ("bfloat16", "fp8", "fp8_block", "int4_wo", "w4a16_mxfp4", "nvfp4",
              "w4a8_mxfp4_fp8")
MOE_KEY = ["moe_dtype", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size",
           "moe_ep_size"]
# Latencies are stored in float16 (relative rounding under 0.05 %, far below the measurements'
# own run-to-run spread; it halves the package data).
DTYPE = np.float16
M_KEEP = {1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 384, 512, 768, 1024,
          1536, 2048, 2560, 3072, 3584, 4096, 8192, 16384, 32768}


class Repo:
    """Files of one commit of the AIConfigurator repository, read with ``git show``."""

    def __init__(self, path: str, commit: str) -> None:
        self.path = path
        self.commit = self._git("rev-parse", commit).decode().strip()

    def _git(self, *args: str) -> bytes:
        return subprocess.run(["git", "--git-dir", self._git_dir(), *args], check=True,
                              capture_output=True).stdout

    def _git_dir(self) -> str:
        p = Path(self.path)
        return str(p / ".git") if (p / ".git").exists() else str(p)

    def exists(self, rel: str) -> bool:
        out = self._git("ls-tree", "--name-only", self.commit, f"{ROOT}/{rel}")
        return bool(out.strip())

    def read(self, rel: str) -> bytes:
        return self._git("show", f"{self.commit}:{ROOT}/{rel}")

    def parquet(self, rel: str) -> pd.DataFrame:
        return pd.read_parquet(io.BytesIO(self.read(rel)))

    def table(self, system: str, op: str, version: str, name: str,
              framework: str = "vllm") -> pd.DataFrame:
        """A ``framework``'s table, following the version's ``reuse.yaml`` (a table measured
        once and declared valid for a later version) when the version has no file of its own."""
        rel = f"data/{system}/{op}/{framework}/{version}/{name}.parquet"
        if self.exists(rel):
            return self.parquet(rel)
        reuse = f"data/{system}/{op}/{framework}/{version}/reuse.yaml"
        if self.exists(reuse):
            for line in self.read(reuse).decode().splitlines():
                if line.strip().startswith("from_version:"):
                    donor = line.split(":", 1)[1].strip()
                    return self.parquet(
                        f"data/{system}/{op}/{framework}/{donor}/{name}.parquet")
        raise ValueError(f"{rel}: not in the repository at {self.commit[:10]}")


def _main_source(df: pd.DataFrame) -> str:
    counts = df.groupby("kernel_source").size()
    return str(counts.sort_values(kind="stable").index[-1])


def gemm_tables(df: pd.DataFrame) -> tuple[dict, dict]:
    """GEMM grids per dtype (fastest kernel per shape) and the kernels they come from."""
    # Token counts kept: powers of two, and the 16-step (to 256) and 512-step (to 4096) points
    # between them; AIConfigurator's "+1" tile-boundary points (33, 49, ...) are dropped.
    m = np.array([x for x in sorted(df.m.unique()) if x in M_KEEP])
    n = np.array(sorted(df.n.unique()))
    k = np.array(sorted(df.k.unique()))
    arrays, sources = {"gemm_m": m, "gemm_n": n, "gemm_k": k}, {}
    for dtype in GEMM_DTYPES:
        d = df[(df.gemm_dtype == dtype) & df.m.isin(m)]
        if d.empty:
            continue
        sources[dtype] = sorted(d.kernel_source.unique())
        best = d.groupby(["m", "n", "k"]).latency.min().reset_index()
        grid = np.full((len(m), len(n), len(k)), np.nan, dtype=DTYPE)
        grid[np.searchsorted(m, best.m), np.searchsorted(n, best.n),
             np.searchsorted(k, best.k)] = best.latency.to_numpy()
        arrays[f"gemm_{dtype}"] = grid
    return arrays, sources


def _attn(df: pd.DataFrame) -> pd.DataFrame:
    if "window_size" not in df:
        df = df.assign(window_size=0)
    df = df[(df.window_size == 0) & df.head_dim.isin(HEAD_DIMS) & (df.attn_dtype == "bfloat16")]
    return df.assign(nkv=np.where(df.num_key_value_heads == df.num_heads, 0,
                                  df.num_key_value_heads))


def context_tables(df: pd.DataFrame) -> tuple[dict, dict]:
    """Context attention of one sequence by (heads, tokens), per (KV dtype, KV heads, head size)."""
    df = _attn(df)
    df = df[df.batch_size == 1]
    heads = np.array(sorted(df.num_heads.unique()))
    isl = np.array(sorted(df.isl.unique()))
    arrays, sources = {"ctx_heads": heads, "ctx_isl": isl}, {}
    for kv in sorted(df.kv_cache_dtype.unique()):
        d = df[df.kv_cache_dtype == kv]
        src = _main_source(d)
        sources[kv] = src
        d = d[d.kernel_source == src]
        for (nkv, hd), g in sorted(d.groupby(["nkv", "head_dim"])):
            g = g.groupby(["num_heads", "isl"]).latency.min().reset_index()
            grid = np.full((len(heads), len(isl)), np.nan, dtype=DTYPE)
            grid[np.searchsorted(heads, g.num_heads), np.searchsorted(isl, g.isl)] = g.latency
            arrays[f"ctx_{kv}_{nkv}_{hd}"] = grid
    return arrays, sources


def generation_tables(df: pd.DataFrame) -> tuple[dict, dict]:
    """Generation attention by (heads, batch, KV tokens), per (KV dtype, KV heads, head size)."""
    df = _attn(df)
    df = df.assign(seq=df.isl + df.step)
    heads = np.array(sorted(df.num_heads.unique()))
    batch = np.array(sorted(df.batch_size.unique()))
    seq = np.array(sorted(df.seq.unique()))
    arrays, sources = {"gen_heads": heads, "gen_batch": batch, "gen_seq": seq}, {}
    for kv in sorted(df.kv_cache_dtype.unique()):
        d = df[df.kv_cache_dtype == kv]
        src = _main_source(d)
        sources[kv] = src
        d = d[d.kernel_source == src]
        for (nkv, hd), g in sorted(d.groupby(["nkv", "head_dim"])):
            g = g.groupby(["num_heads", "batch_size", "seq"]).latency.min().reset_index()
            grid = np.full((len(heads), len(batch), len(seq)), np.nan, dtype=DTYPE)
            grid[np.searchsorted(heads, g.num_heads), np.searchsorted(batch, g.batch_size),
                 np.searchsorted(seq, g.seq)] = g.latency
            arrays[f"gen_{kv}_{nkv}_{hd}"] = grid
    return arrays, sources


def _version_key(v: str) -> tuple:
    """Order of version strings such as 0.24.0, 0.5.6.post2, 1.2.0rc5 (numbers, then the rest)."""
    import re
    return tuple(int(x) if x.isdigit() else -1 for x in re.findall(r"\d+|[a-z]+", v))


def allreduce_tables(repo: Repo, system: str, version: str,
                     framework: str = "vllm") -> tuple[dict, dict]:
    """Custom (CUDA-graph) and NCCL all-reduce latency by (GPUs, message bytes)."""
    # The newest version up to the kernels' one with an all-reduce table (the L40S has none
    # for vLLM 0.24.0: 0.22.0's).
    versions = [v.rsplit("/", 1)[1] for v in repo._git(
        "ls-tree", "--name-only", repo.commit,
        f"{ROOT}/data/{system}/comm/{framework}/").decode().split()]
    key = _version_key
    ar_version = max((v for v in versions if key(v) <= key(version)
                      and repo.exists(f"data/{system}/comm/{framework}/{v}/"
                                      "custom_allreduce_perf.parquet")), key=key)
    custom = repo.table(system, "comm", ar_version, "custom_allreduce_perf", framework)
    custom = custom[custom.kernel_source == CUSTOM_ALLREDUCE[framework]]
    nccl_versions = sorted(
        repo._git("ls-tree", "--name-only", repo.commit, f"{ROOT}/data/{system}/comm/nccl/")
        .decode().split(), key=lambda p: tuple(int(x) for x in p.rsplit("/", 1)[1].split(".")))
    nccl_version = nccl_versions[-1].rsplit("/", 1)[1]
    nccl = repo.parquet(f"data/{system}/comm/nccl/{nccl_version}/nccl_perf.parquet")
    nccl = nccl[(nccl.op_name == "all_reduce") & (nccl.nccl_dtype == "half")]
    gpus = np.array([2, 4, 8])
    sizes = np.array(sorted(set(custom.message_size) | set(nccl.message_size)))
    arrays = {"ar_gpus": gpus, "ar_bytes": sizes}
    for name, d in (("ar_custom", custom), ("ar_nccl", nccl)):
        d = d.groupby(["num_gpus", "message_size"]).latency.min().reset_index()
        d = d[d.num_gpus.isin(gpus)]
        grid = np.full((len(gpus), len(sizes)), np.nan, dtype=DTYPE)
        grid[np.searchsorted(gpus, d.num_gpus), np.searchsorted(sizes, d.message_size)] = d.latency
        arrays[name] = grid
    return arrays, {"custom": f"{CUSTOM_ALLREDUCE[framework]} ({framework} {ar_version})",
                    "nccl": nccl_version}


def moe_tables(df: pd.DataFrame) -> tuple[dict, dict]:
    """Fused MoE layer latency by (dtype, shape, MoE TP, MoE EP) x tokens, and the kernels."""
    df = df[df.moe_dtype.isin(MOE_DTYPES)]
    skewed = df[df.distribution == "power_law_1.01"]
    # A shape measured only balanced keeps its balanced rows.
    have = set(map(tuple, skewed[MOE_KEY].to_numpy().tolist()))
    unmeasured = np.array([tuple(k) not in have for k in df[MOE_KEY].to_numpy().tolist()])
    rest = df[(df.distribution == "balanced").to_numpy() & unmeasured]
    df = pd.concat([skewed, rest])
    tokens = np.array(sorted(df.num_tokens.unique()))
    best = df.groupby(MOE_KEY + ["num_tokens"]).latency.min().reset_index()
    keys = best[MOE_KEY].drop_duplicates().sort_values(MOE_KEY).reset_index(drop=True)
    lat = np.full((len(keys), len(tokens)), np.nan, dtype=DTYPE)
    index = {tuple(k): i for i, k in enumerate(keys.to_numpy().tolist())}
    rows = [index[tuple(k)] for k in best[MOE_KEY].to_numpy().tolist()]
    lat[rows, np.searchsorted(tokens, best.num_tokens)] = best.latency.to_numpy()
    codes = keys.assign(moe_dtype=keys.moe_dtype.map(MOE_DTYPES.index))
    sources = {d: sorted(g.kernel_source.unique()) for d, g in df.groupby("moe_dtype")}
    return {"moe_tokens": tokens, "moe_keys": codes.to_numpy().astype(np.int32),
            "moe_lat": lat}, sources


def mla_tables(ctx: pd.DataFrame, gen: pd.DataFrame) -> tuple[dict, dict]:
    """vLLM's MLA attention module (DeepSeek-V3's shape) by (heads, batch, tokens), per
    (GEMM weights, KV dtype), the fastest measured backend per point; and those backends."""
    arrays, sources = {}, {}
    for name, df, col in (("ctx", ctx, "isl"), ("gen", gen, "seq")):
        df = df[(df.mla_dtype == "bfloat16") & df.gemm_type.isin(MLA_GEMMS)]
        df = df.assign(seq=df.isl + df.step)
        heads = np.array(sorted(df.num_heads.unique()))
        batch = np.array(sorted(df.batch_size.unique()))
        tok = np.array(sorted(df[col].unique()))
        arrays.update({f"mla_{name}_heads": heads, f"mla_{name}_batch": batch,
                       f"mla_{name}_{col}": tok})
        for (gemm, kv), d in sorted(df.groupby(["gemm_type", "kv_cache_dtype"])):
            sources[f"{name} {gemm} {kv}"] = sorted(d.kernel_source.unique())
            g = d.groupby(["num_heads", "batch_size", col]).latency.min().reset_index()
            grid = np.full((len(heads), len(batch), len(tok)), np.nan, dtype=DTYPE)
            grid[np.searchsorted(heads, g.num_heads), np.searchsorted(batch, g.batch_size),
                 np.searchsorted(tok, g[col])] = g.latency
            arrays[f"mla_{name}_{gemm}_{kv}"] = grid
    return arrays, sources


def write_npz(path: Path, arrays: dict) -> None:
    """A compressed .npz whose bytes depend on the arrays only (sorted, fixed timestamps)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for key in sorted(arrays):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arrays[key]),
                                      allow_pickle=False)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, buf.getvalue(), compresslevel=9)


def one_set(repo: Repo, system: str, version: str, framework: str = "vllm",
            mla: bool = False) -> tuple[dict, dict]:
    """The arrays and manifest entry of one (GPU, framework, version); ``mla``: with the MLA
    module tables."""
    arrays, entry = {}, {"system": system, framework: version}

    def table(op: str, name: str) -> pd.DataFrame:
        return repo.table(system, op, version, name, framework)

    a, entry["gemm"] = gemm_tables(table("gemm", "gemm_perf"))
    arrays.update(a)
    a, entry["context_attention"] = context_tables(table("attention", "context_attention_perf"))
    arrays.update(a)
    a, entry["generation_attention"] = generation_tables(
        table("attention", "generation_attention_perf"))
    arrays.update(a)
    a, entry["all_reduce"] = allreduce_tables(repo, system, version, framework)
    arrays.update(a)
    try:
        a, entry["moe"] = moe_tables(table("moe", "moe_perf"))
        arrays.update(a)
    except ValueError:          # no MoE table for this GPU and version
        pass
    if mla:
        a, entry["mla"] = mla_tables(table("mla", "mla_context_module_perf"),
                                     table("mla", "mla_generation_module_perf"))
        arrays.update(a)
    return arrays, entry


def reduce(repo: Repo, out: Path = OUT) -> dict:
    """Write every GPU's tables and the manifest; return the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"source": "github.com/ai-dynamo/aiconfigurator", "commit": repo.commit,
                "licence": "Apache-2.0", "gpus": {}, "engines": {}}
    for gpu, (system, version) in SYSTEMS.items():
        arrays, entry = one_set(repo, system, version, mla=gpu in MLA_GPUS)
        write_npz(out / f"{gpu}.npz", arrays)
        manifest["gpus"][gpu] = entry
        tables = [k for k in sorted(arrays) if arrays[k].ndim > 1]
        print(f"{gpu:<14} {system:<20} vllm {version}: {len(tables)} tables")
    for engine, (version, systems) in ENGINE_SYSTEMS.items():
        for gpu, system in systems.items():
            arrays, entry = one_set(repo, system, version, engine)
            write_npz(out / f"{engine}-{gpu}.npz", arrays)
            manifest["engines"][f"{engine}-{gpu}"] = {**entry, "engine": engine, "gpu": gpu}
            tables = [k for k in sorted(arrays) if arrays[k].ndim > 1]
            print(f"{engine}-{gpu:<7} {system:<20} {engine} {version}: {len(tables)} tables")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    (out / "LICENSE").write_bytes(repo._git("show", f"{repo.commit}:LICENSE"))
    return manifest


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repo", required=True, help="AIConfigurator checkout or bare mirror")
    p.add_argument("--commit", default="HEAD", help="revision to read (default HEAD)")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    reduce(Repo(args.repo, args.commit), args.out)


if __name__ == "__main__":
    main()
