"""Speculative decoding: the proposer, how many tokens it proposes, and how many are accepted.

``SchedulerConfig.speculative`` holds a :class:`SpeculativeConfig` (``None``, the default, is
off; so is ``num_speculative_tokens=0``: results are then bit-identical to a run without it).
The engine side is :mod:`simsched.engine.scheduler.speculative`, the cost side
:mod:`simsched.cost.speculative`.

Acceptance is given, in order of precedence, as a per-request ``acceptance_trace`` (a CSV file
of ``request_id,num_accepted`` rows, one per verification of that request, replayed in order),
a single i.i.d. ``acceptance_rate`` α (position ``i`` is accepted with probability α^i, so the
expected accepted length is ``(1 - α^(K+1)) / (1 - α)`` including the bonus token), or the
per-position vector ``acceptance`` (a tuple or list, or a 1-D numpy array; a mapping, a set
or a string is refused; default: the method's, :data:`DEFAULT_ACCEPTANCE`).
``acceptance[i-1]`` is the probability that draft position ``i`` is accepted (which needs every
earlier position accepted): vLLM's "per-position acceptance rate". ``concentration`` adds
per-request heterogeneity: each request draws its conditional acceptance at each position from
a Beta distribution with that mean and ``concentration`` as a + b (the expected vector is
unchanged; smaller is more spread).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from simsched.config.checks import check_choice, check_float, check_int, from_fields, plain

SPEC_METHODS = ("draft_model", "eagle", "mtp", "ngram")
MAX_SPECULATIVE_TOKENS = 16

# Per-position acceptance (probability that draft position i is accepted) by method. EAGLE's
# first three are vLLM's own test figures for EAGLE-3, K = 3, Llama-3.1-8B (0.73, 0.52, 0.35:
# mean accepted length 2.6 with the bonus token); the rest are illustrative, of the magnitude
# published for each method (MTP heads accept more, n-gram lookup much less off repetitive text).
DEFAULT_ACCEPTANCE = {
    "eagle": (0.73, 0.52, 0.35, 0.24, 0.16, 0.11, 0.07, 0.05),
    "mtp": (0.85, 0.68, 0.52, 0.39, 0.29, 0.21, 0.15, 0.11),
    "draft_model": (0.70, 0.49, 0.34, 0.24, 0.17, 0.12, 0.08, 0.06),
    "ngram": (0.45, 0.27, 0.17, 0.11, 0.07, 0.05, 0.03, 0.02),
}


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding (vLLM's ``speculative_config``), on one scheduler section.

    ``method``: ``draft_model`` (a smaller model, ``draft_model`` names it in the catalog: K
    sequential decode steps of it per step), ``eagle`` / ``mtp`` (a head costing about
    ``proposer_layers`` decoder layers of the target model per proposed token) or ``ngram``
    (prompt lookup: no GPU work). ``num_speculative_tokens`` is K. Acceptance: see the module
    docstring.
    """

    method: str = "eagle"
    num_speculative_tokens: int = 3
    acceptance: tuple | None = None
    acceptance_rate: float | None = None
    acceptance_trace: str | None = None
    concentration: float | None = None
    draft_model: str | None = None
    proposer_layers: float = 1.0

    def __post_init__(self) -> None:
        plain(self)
        o = "scheduler.speculative"
        check_choice(o, "method", self.method, SPEC_METHODS)
        check_int(o, "num_speculative_tokens", self.num_speculative_tokens, 0,
                  MAX_SPECULATIVE_TOKENS)
        if self.acceptance is not None:
            vec = self.acceptance
            if isinstance(vec, np.ndarray) and vec.ndim == 1:
                vec = vec.tolist()
            # A tuple or a list (JSON's form) only: a dict or a set iterates over its keys, a
            # string over characters; taking those as positions would be a silent misreading.
            if not isinstance(vec, (tuple, list)):
                raise ValueError(f"{o}.acceptance must be a tuple or list of per-position "
                                 f"probabilities, got {type(self.acceptance).__name__} "
                                 f"{self.acceptance!r}")
            vec = tuple(vec)
            for i, p in enumerate(vec):
                check_float(o, f"acceptance[{i}]", p, 0.0, 1.0)
            if not vec or any(b > a for a, b in zip(vec, vec[1:])):
                raise ValueError(f"{o}.acceptance must be non-empty and non-increasing (position "
                                 f"i needs every earlier one accepted), got {vec!r}")
            object.__setattr__(self, "acceptance", tuple(float(p) for p in vec))
        if self.acceptance_rate is not None:
            check_float(o, "acceptance_rate", self.acceptance_rate, 0.0, 1.0)
            if self.acceptance is not None:
                raise ValueError(f"{o}: give acceptance (per position) or acceptance_rate "
                                 "(one i.i.d. rate), not both")
        if self.acceptance_trace is not None:
            if not isinstance(self.acceptance_trace, str) or not self.acceptance_trace:
                raise ValueError(f"{o}.acceptance_trace must be the path of a CSV file, got "
                                 f"{self.acceptance_trace!r}")
            read_acceptance_trace(self.acceptance_trace)       # fail at configuration time
        if self.concentration is not None:
            check_float(o, "concentration", self.concentration, 0.0, low_open=True, finite=True)
        if self.method == "draft_model":
            from simsched.cost.hardware import MODELS

            if self.draft_model not in MODELS:
                raise ValueError(f"{o}.draft_model must name a catalog model for method "
                                 f"'draft_model' (one of {sorted(MODELS)}), got "
                                 f"{self.draft_model!r}")
        elif self.draft_model is not None:
            raise ValueError(f"{o}.draft_model is only for method 'draft_model', not "
                             f"{self.method!r}")
        check_float(o, "proposer_layers", self.proposer_layers, 0.0, finite=True)

    @property
    def enabled(self) -> bool:
        """Whether any token is proposed (K = 0 runs the plain engine)."""
        return self.num_speculative_tokens > 0

    def position_acceptance(self) -> tuple:
        """The K per-position acceptance probabilities (non-increasing)."""
        k = self.num_speculative_tokens
        if self.acceptance_rate is not None:
            return tuple(self.acceptance_rate ** i for i in range(1, k + 1))
        vec = list(self.acceptance if self.acceptance is not None
                   else DEFAULT_ACCEPTANCE[self.method])
        # Past the vector's end: its last ratio continues (geometrically).
        ratio = vec[-1] / vec[-2] if len(vec) > 1 and vec[-2] > 0 else vec[-1]
        while len(vec) < k:
            vec.append(vec[-1] * ratio)
        return tuple(vec[:k])

    def mean_accepted_length(self) -> float:
        """Expected tokens per verification with all K proposed (accepted + the bonus token)."""
        if self.acceptance_rate is not None and self.acceptance_rate < 1.0:
            a, k = self.acceptance_rate, self.num_speculative_tokens
            return (1 - a ** (k + 1)) / (1 - a)
        return 1.0 + math.fsum(self.position_acceptance())


def read_acceptance_trace(path: str) -> dict[int, list[int]]:
    """``request_id -> [num_accepted, ...]`` from a CSV with those two columns (a header row).

    Each row is one verification of that request, in order. A ValueError names the file and line
    of anything unreadable.
    """
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"scheduler.speculative.acceptance_trace: file {path} not found")
    out: dict[int, list[int]] = {}
    with p.open(newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None or not {"request_id", "num_accepted"} <= set(
                reader.fieldnames):
            raise ValueError(f"{path}: needs columns request_id and num_accepted, got "
                             f"{reader.fieldnames}")
        for line, row in enumerate(reader, start=2):
            try:
                rid, n = int(row["request_id"]), int(row["num_accepted"])
            except (TypeError, ValueError):
                raise ValueError(f"{path}, line {line}: request_id and num_accepted must be "
                                 f"integers, got {row['request_id']!r}, "
                                 f"{row['num_accepted']!r}") from None
            if n < 0:
                raise ValueError(f"{path}, line {line}: num_accepted must be >= 0, got {n}")
            out.setdefault(rid, []).append(n)
    return out


def check_speculative(sched) -> SpeculativeConfig:
    """``sched.speculative`` (a SchedulerConfig's) as a SpeculativeConfig, checked against the
    scheduler's other fields (a mapping, as JSON gives it, is turned into one)."""
    spec = sched.speculative
    o = "scheduler.speculative"
    if isinstance(spec, Mapping):
        spec = from_fields(SpeculativeConfig, spec, o)
    if not isinstance(spec, SpeculativeConfig):
        raise ValueError(f"{o} must be a SpeculativeConfig, a mapping of its fields or None, "
                         f"got {spec!r}")
    if spec.enabled:
        # The eager decode path plans like vLLM V1: chunked, stall-free, planned after commit.
        if sched.style != "stall_free" or not sched.enable_chunked_prefill:
            raise ValueError(f"{o} needs scheduler.style 'stall_free' with "
                             "enable_chunked_prefill (vLLM V1's scheduling), got style "
                             f"{sched.style!r}, enable_chunked_prefill "
                             f"{sched.enable_chunked_prefill}")
        if sched.plan_ahead:
            raise ValueError(f"{o} is not modelled with scheduler.plan_ahead; turn one off")
    return spec
