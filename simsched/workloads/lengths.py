"""Prompt and output length distributions: how many tokens each request reads and writes.

Every sampler returns ``(num_prompt_tokens, num_output_tokens)`` as two int64 arrays of length
``n``, drawn with the run's ``numpy.random.Generator``. Empirical samplers resample whole
(prompt, output) pairs so the correlation between the two is kept.
"""

from __future__ import annotations

import numpy as np

LENGTHS = ("lognormal", "fixed", "uniform", "empirical", "trace")


def lognormal(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The lesson's lengths: prompt lognormal(3.5, 1.0)+10, output lognormal(3.0, 0.8)+10, in [10, 512]."""
    prompt = np.clip(rng.lognormal(3.5, 1.0, n) + 10, 10, 512).astype(np.int64)
    output = np.clip(rng.lognormal(3.0, 0.8, n) + 10, 10, 512).astype(np.int64)
    return prompt, output


def fixed(n: int, prompt_len: int, output_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Every request has ``prompt_len`` prompt and ``output_len`` output tokens."""
    return np.full(n, prompt_len, dtype=np.int64), np.full(n, output_len, dtype=np.int64)


def uniform(rng: np.random.Generator, n: int, prompt_range: tuple[int, int],
            output_range: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Independent uniform integers in the inclusive ``prompt_range`` and ``output_range``."""
    prompt = rng.integers(prompt_range[0], prompt_range[1], n, endpoint=True, dtype=np.int64)
    output = rng.integers(output_range[0], output_range[1], n, endpoint=True, dtype=np.int64)
    return prompt, output


def empirical(rng: np.random.Generator, n: int, prompt: np.ndarray,
              output: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Resample ``n`` (prompt, output) pairs with replacement from the observed pairs."""
    if len(prompt) == 0:
        raise ValueError("cannot resample lengths from an empty set of pairs")
    idx = rng.integers(0, len(prompt), n)
    return np.asarray(prompt, dtype=np.int64)[idx], np.asarray(output, dtype=np.int64)[idx]


def in_order(n: int, prompt: np.ndarray, output: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first ``n`` recorded pairs, in trace order (``n`` must not exceed the trace)."""
    if n > len(prompt):
        raise ValueError(f"the trace has {len(prompt)} length pairs, {n} requested")
    return (np.asarray(prompt[:n], dtype=np.int64), np.asarray(output[:n], dtype=np.int64))
