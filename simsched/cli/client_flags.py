"""The ``simsched`` command's benchmark-client flags (``SimConfig.client``,
:mod:`simsched.config.client`), named as ``vllm bench serve`` names its options."""

from __future__ import annotations

import argparse
import math

from simsched.config.client import (CLIENT_TYPES, DATASETS, PROMPT_ORDERS, STAGE_LOADS,
                                    WARMUP_PROMPTS)

__all__ = ["CLIENT_FLAG_FIELDS", "add_client_flags", "parse_stages"]

# flag destination -> config field
CLIENT_FLAG_FIELDS = {
    "client": "client.client_type", "max_concurrency": "client.max_concurrency",
    "request_rate": "client.request_rate", "burstiness": "client.burstiness",
    "num_prompts": "client.num_prompts", "num_warmups": "client.num_warmups",
    "dataset": "client.dataset", "random_input_len": "client.random_input_len",
    "random_output_len": "client.random_output_len",
    "random_range_ratio": "client.random_range_ratio",
    "random_prefix_len": "client.random_prefix_len",
    "num_unique_prompts": "client.num_unique_prompts", "prompt_order": "client.prompt_order",
    "warmup_prompts": "client.warmup_prompts", "stages": "client.stages",
    "stage_load": "client.stage_load"}


def parse_stages(text: str) -> tuple:
    """``RATExSECONDS[/RATExSECONDS...]`` (``8x600/20x600``: 8 req/s for 600 s, then 20 req/s
    for 600 s, as ``runs.csv`` of the vLLM 0.15 runs writes them) as ``((8.0, 600.0), ...)``."""
    stages = []
    for part in text.split("/"):
        rate, sep, seconds = part.strip().partition("x")
        try:
            stages.append((float(rate), float(seconds)))
        except ValueError:
            sep = ""
        if not sep:
            raise argparse.ArgumentTypeError(
                f"--stages expects RATExSECONDS[/RATExSECONDS...], e.g. 8x600/20x600, "
                f"got {text!r}")
    return tuple(stages)


def _rate(text: str) -> float:
    return math.inf if text.strip().lower() == "inf" else float(text)


def add_client_flags(p: argparse.ArgumentParser) -> None:
    """The ``client`` argument group of ``simsched run`` and its siblings."""
    g = p.add_argument_group("benchmark client (default: the workload's own arrival times)")
    g.add_argument("--client", choices=CLIENT_TYPES,
                   help="concurrency: vllm bench serve; staged: inference-perf's stages")
    g.add_argument("--max-concurrency", type=int, help="most requests in flight")
    g.add_argument("--request-rate", type=_rate, help="requests/s the client schedules (inf)")
    g.add_argument("--burstiness", type=float, help="gamma shape of the gaps (1: Poisson)")
    g.add_argument("--num-prompts", type=int, help="measured requests (random dataset: 1000)")
    g.add_argument("--num-warmups", type=int, help="warm-up requests, left out of the results")
    g.add_argument("--dataset", choices=DATASETS, help="the prompts (default: the workload's)")
    g.add_argument("--random-input-len", type=int, help="random dataset: mean input tokens")
    g.add_argument("--random-output-len", type=int, help="random dataset: mean output tokens")
    g.add_argument("--random-range-ratio", type=float, help="random dataset: range ratio")
    g.add_argument("--random-prefix-len", type=int, help="random dataset: shared prefix tokens")
    g.add_argument("--num-unique-prompts", type=int,
                   help="reuse the first K prompts (aiperf's --num-dataset-entries)")
    g.add_argument("--prompt-order", choices=PROMPT_ORDERS,
                   help="order of the reused prompts (aiperf's --dataset-sampling-strategy)")
    g.add_argument("--warmup-prompts", choices=WARMUP_PROMPTS,
                   help="warm-ups: copies of the first prompt, or drawn from the dataset")
    g.add_argument("--stages", type=parse_stages, metavar="RATExSECONDS/...",
                   help="inference-perf stages, e.g. 8x600/20x600")
    g.add_argument("--stage-load", choices=STAGE_LOADS, help="inference-perf load type")
