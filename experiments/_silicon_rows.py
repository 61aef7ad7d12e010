"""The silicon rows as ``experiments.validate_silicon`` reads them: the CSV's path, its GPUs and
models mapped onto simsched's catalog, and the fields derived per row (concurrency, precision,
whether the row is one of AIConfigurator's own runs)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from simsched.cost import aiconfigurator as aic
from experiments._common import ROOT
from experiments import _silicon_layout as deployments

DATA = ROOT.parent / "shared" / "data" / "real-serving" / "silicon" / "hopper.csv"
# AIConfigurator's system name -> simsched's GPU: every GPU with shipped AIConfigurator tables
# (the manifest records each one's system), Hopper and Blackwell alike.
GPUS = {aic.entry(gpu)["system"]: gpu for gpu in aic.gpus()}
# (Hugging Face id, precision column) -> simsched preset. A precision not listed is a reason.
MODEL_PRESETS = {
    ("meta-llama/Llama-3.1-70B", "fp8"): "llama-3.1-70b-fp8",
    ("nvidia/Llama-3.1-8B-Instruct-FP8", "fp8"): "llama-3.1-8b-fp8",
    ("Qwen/Qwen3-32B", "bf16"): "qwen3-32b",
    ("Qwen/Qwen3-32B", "fp8"): "qwen3-32b-fp8",
    ("Qwen/Qwen3-235B-A22B-FP8", "fp8"): "qwen3-235b-a22b-fp8",
    ("MiniMaxAI/MiniMax-M2.5", "fp8"): "minimax-m2.5",
    # The silicon set labels gpt-oss "fp4 / nvfp4"; the checkpoint's experts are MXFP4 (the
    # only gpt-oss-120b weights published), attention bf16: the preset is that checkpoint.
    ("openai/gpt-oss-120b", "fp4"): "gpt-oss-120b",
    ("moonshotai/Kimi-K2.5", "int4"): "kimi-k2.5",
    ("deepseek-ai/DeepSeek-V3", "fp8"): "deepseek-v3",
    ("deepseek-ai/DeepSeek-R1", "fp8"): "deepseek-r1",
    # NVIDIA's NVFP4 checkpoints (Blackwell): routed experts NVFP4 (simsched.cost.deployed).
    **{(path, p): preset for path, preset in (
        ("deepseek-ai/DeepSeek-R1", "deepseek-r1-nvfp4"),
        ("deepseek-ai/DeepSeek-V3", "deepseek-v3-nvfp4"),
        ("moonshotai/Kimi-K2.5", "kimi-k2.5-nvfp4"),
        ("MiniMaxAI/MiniMax-M2.5", "minimax-m2.5-nvfp4")) for p in ("fp4", "nvfp4")},
}


def load(path: Path = DATA) -> pd.DataFrame | None:
    """The silicon rows with the fields this experiment derives (None when the file is absent)."""
    path = Path(path)
    if not path.exists():
        return None
    raw = pd.read_csv(path)
    conc = raw.silicon_data_source.str.extract(r"silicon_concurrency=(\d+)")[0].astype(float)
    adp = raw.attention_dp_size.fillna(1.0)
    raw["concurrency"] = conc.fillna(raw.batch_size * adp).fillna(deployments.concurrency(raw))
    raw["precision"] = raw.precision.fillna("bf16")
    raw["gpu"] = raw.system.map(GPUS)
    raw["model"] = [MODEL_PRESETS.get((m, p)) for m, p in zip(raw.model_path, raw.precision)]
    raw["aic_run"] = raw.silicon_data_source.str.contains("aic-auto-gap-analysis")
    return raw


def load_or_skip(path, experiment: str) -> pd.DataFrame | None:
    """:func:`load`, or None after saying that ``experiment`` is skipped."""
    rows = load(Path(path))
    if rows is None:
        print(f"{experiment} skipped: {path} not found (the silicon rows live in the shared "
              f"data beside the checkout; the package never needs them)")
    return rows
