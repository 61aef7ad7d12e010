"""What benchmark clients send and when: their datasets' lengths and their send schedules.

Pure draws (numpy, no clock): the client process that sends them, waits for slots and reacts to
finishes is :mod:`simsched.cluster.clients`; its config is
:class:`simsched.config.client.ClientConfig`. Each function follows one named tool's source:

* ``vllm bench serve`` (vLLM, ``vllm/benchmarks/serve.py`` at commit 009e6d4 and
  ``vllm/benchmarks/datasets.py`` at commit 0056b87): :func:`vllm_random_bounds`,
  :func:`vllm_send_offsets`.
* InferenceX (SemiAnalysisAI/InferenceX, ``utils/bench_serving/benchmark_serving.py`` at commit
  8b4dcfa, run by ``benchmarks/benchmark_lib.sh``): :func:`inferencex_random_bounds`,
  :func:`inferencex_send_offsets`.
* inference-perf (kubernetes-sigs/inference-perf v0.4.0, ``inference_perf/loadgen/
  load_timer.py``): :func:`constant_stage_offsets`, :func:`poisson_stage_offsets`.
* aiperf (ai-dynamo/aiperf: its dataset manager's sampling strategies ``sequential``,
  ``random`` and ``shuffle`` over ``--num-dataset-entries`` prompts): :func:`prompt_indices`.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

__all__ = ["PROMPT_ORDERS", "constant_stage_offsets", "inferencex_random_bounds",
           "inferencex_send_offsets", "poisson_stage_offsets", "prompt_indices", "random_dataset",
           "vllm_random_bounds", "vllm_send_offsets"]

PROMPT_ORDERS = ("sequential", "shuffle", "random")


def vllm_random_bounds(input_len: int, output_len: int, range_ratio: float,
                       num_special_tokens: int = 0) -> tuple[int, int, int, int]:
    """``(input_low, input_high, output_low, output_high)``, inclusive, of vLLM's ``random``
    dataset (``RandomDataset.get_sampling_params``).

    The sampled input excludes the tokenizer's special tokens (``real = max(0, input_len -
    num_special_tokens)``); low bounds are ``floor(L * (1 - r))``, high ``ceil(L * (1 + r))``,
    and the output's bounds are at least 1.
    """
    real = max(0, int(input_len) - int(num_special_tokens))
    return (math.floor(real * (1 - range_ratio)), math.ceil(real * (1 + range_ratio)),
            max(math.floor(output_len * (1 - range_ratio)), 1),
            max(math.ceil(output_len * (1 + range_ratio)), 1))


def inferencex_random_bounds(input_len: int, output_len: int,
                             range_ratio: float) -> tuple[int, int, int, int]:
    """InferenceX's bounds (``sample_random_requests``' ``sample_uniform``): ``[int(L * r), L]``
    inclusive for both lengths (its ratio is the lower bound's share of ``L``: 1 keeps ``L``)."""
    return int(input_len * range_ratio), int(input_len), int(output_len * range_ratio), \
        int(output_len)


def random_dataset(n: int, seed: int, input_len: int, output_len: int, range_ratio: float,
                   prefix_len: int = 0, num_special_tokens: int = 0,
                   variant: str = "vllm") -> pd.DataFrame:
    """``n`` prompts of the ``random`` dataset as a request table (``arrival_at`` 0: the
    client decides when each is sent).

    Lengths are drawn as the tool draws them, input lengths first, then output lengths, from
    a generator seeded with ``seed``: vLLM's ``np.random.default_rng(seed).integers(low, high +
    1)`` (``variant='vllm'``), InferenceX's legacy ``np.random.randint`` seeded with ``seed``
    (``variant='inferencex'``). A prompt the server sees is ``num_special_tokens`` (the BOS
    token the server's tokenizer adds) + ``prefix_len`` tokens shared by every request + its
    drawn tokens; with a prefix, ``prefix_group``/``prefix_len`` columns name the shared part
    for the prefix cache. Outputs are exactly the drawn lengths (``ignore_eos``).
    """
    if variant == "vllm":
        in_lo, in_hi, out_lo, out_hi = vllm_random_bounds(input_len, output_len, range_ratio,
                                                          num_special_tokens)
        rng = np.random.default_rng(seed)
        inputs = rng.integers(in_lo, in_hi + 1, size=n)
        outputs = rng.integers(out_lo, out_hi + 1, size=n)
    else:
        in_lo, in_hi, out_lo, out_hi = inferencex_random_bounds(input_len, output_len,
                                                                range_ratio)
        legacy = np.random.RandomState(seed % 2**32)
        inputs = legacy.randint(in_lo, in_hi + 1, size=n)
        outputs = legacy.randint(out_lo, out_hi + 1, size=n)
    shared = prefix_len + num_special_tokens
    frame = pd.DataFrame({"arrival_at": np.zeros(n),
                          "num_prompt_tokens": (np.asarray(inputs, dtype=np.int64) + shared),
                          "num_output_tokens": np.asarray(outputs, dtype=np.int64),
                          "priority": np.zeros(n, dtype=np.int64),
                          "tenant": pd.Series([None] * n, dtype=object)})
    if prefix_len:
        frame["prefix_group"] = np.zeros(n, dtype=np.int64)
        frame["prefix_len"] = shared
    return frame


def vllm_send_offsets(rng: np.random.Generator, n: int, rate: float,
                      burstiness: float) -> np.ndarray:
    """When ``vllm bench serve`` means to send each of ``n`` requests, in seconds from the
    benchmark's start (``get_request`` without ramp-up).

    Infinite ``rate``: all at 0. Otherwise gap ``i`` is gamma(shape=burstiness, scale=1 /
    (rate * burstiness)) (exponential at burstiness 1; ``1 / rate`` at infinite burstiness),
    the first gap included; the cumulative times are then scaled so the last is ``n / rate``
    (vLLM closes the 1-2 % gap a plain sum leaves, to steady throughput across seeds).
    """
    if math.isinf(rate):
        return np.zeros(n)
    if math.isinf(burstiness):
        gaps = np.full(n, 1.0 / rate)
    else:
        gaps = rng.gamma(burstiness, 1.0 / (rate * burstiness), n)
    times = np.cumsum(gaps)
    if times[-1] != 0:
        times = times * ((n / rate) / times[-1])
    return times


def inferencex_send_offsets(rng: np.random.Generator, n: int, rate: float,
                            burstiness: float) -> np.ndarray:
    """InferenceX's ``get_request``: the first request at 0, then a gamma(burstiness, 1 /
    (rate * burstiness)) gap after each one (no rescaling); all at 0 at infinite ``rate``."""
    if math.isinf(rate):
        return np.zeros(n)
    times = np.zeros(n)
    if n > 1:
        times[1:] = np.cumsum(rng.gamma(burstiness, 1.0 / (rate * burstiness), n - 1))
    return times


def constant_stage_offsets(rng: np.random.Generator, rate: float,
                           duration: float) -> np.ndarray:
    """inference-perf's ``constant`` stage (``ConstantLoadTimer``): ``int(rate * duration)``
    requests whose exponential(1 / rate) gaps are scaled to sum to ``duration``, the first gap
    included; seconds from the stage's timer start (so the last request is at ``duration``)."""
    n = int(rate * duration)
    if n == 0:
        return np.zeros(0)
    gaps = rng.exponential(1.0 / rate, n)
    return np.cumsum(gaps * (duration / gaps.sum()))


def poisson_stage_offsets(rng: np.random.Generator, rate: float,
                          duration: float) -> np.ndarray:
    """inference-perf's ``poisson`` stage (``PoissonLoadTimer``): ``int(rate * duration)``
    requests; each second holds a Poisson(rate) count of them (an empty second is skipped),
    spread over that second as a constant stage of that count and 1 s spreads them."""
    n = int(rate * duration)
    out: list[float] = []
    start = 0.0
    while len(out) < n:
        count = int(rng.poisson(rate))
        if count < 1:
            start += 1.0
            continue
        times = start + constant_stage_offsets(rng, count, 1.0)
        out.extend(times.tolist())
        start = out[-1]
    return np.asarray(out[:n])


def prompt_indices(rng: np.random.Generator, order: str, pool: int, count: int) -> list[int]:
    """The prompts (indices into a pool of ``pool``) of ``count`` requests, in send order:
    ``sequential`` cycles ``0, 1, ..., pool - 1, 0, ...``; ``shuffle`` walks a fresh random
    permutation of the pool each pass (aiperf's default: no prompt repeats within a pass);
    ``random`` draws each with replacement (aiperf before its ``shuffle`` default)."""
    if order not in PROMPT_ORDERS:
        raise ValueError(f"prompt order must be one of {list(PROMPT_ORDERS)}, got {order!r}")
    if pool < 1:
        raise ValueError(f"prompt pool must hold at least 1 prompt, got {pool}")
    if count <= 0:
        return []
    if order == "sequential":
        return [i % pool for i in range(count)]
    if order == "random":
        return rng.integers(0, pool, count).tolist()
    passes = -(-count // pool)
    return np.concatenate([rng.permutation(pool) for _ in range(passes)])[:count].tolist()
