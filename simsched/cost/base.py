"""The cost-model interface and two simple models: unit iterations and a linear model.

A cost model is any object with ``iteration_time(batch) -> float`` (seconds) where ``batch`` is a
:class:`Batch`. Models may also offer ``breakdown(batch) -> dict`` whose values sum to the
iteration time. The A100-calibrated model lives in :mod:`simsched.calibrated`.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


class Batch:
    """What one iteration computes, as the cost model needs it.

    Prefill chunks are listed per sequence (few per iteration); decodes are summarised, because
    every decode costs the same apart from the KV it reads: ``num_decode_seqs`` sequences each
    computing one new token while attending to ``decode_context_sum`` cached tokens in total.
    """

    __slots__ = ("prefill_new_tokens", "prefill_cached_tokens", "num_decode_seqs",
                 "decode_context_sum", "swap_out_bytes", "swap_in_bytes")

    def __init__(self, prefill_new_tokens=(), prefill_cached_tokens=(), num_decode_seqs: int = 0,
                 decode_context_sum: int = 0) -> None:
        self.prefill_new_tokens = list(prefill_new_tokens)
        self.prefill_cached_tokens = list(prefill_cached_tokens)
        if len(self.prefill_new_tokens) != len(self.prefill_cached_tokens):
            raise ValueError("prefill_new_tokens and prefill_cached_tokens differ in length")
        self.num_decode_seqs = int(num_decode_seqs)
        self.decode_context_sum = int(decode_context_sum)
        self.swap_out_bytes = 0.0
        self.swap_in_bytes = 0.0

    @classmethod
    def from_sequences(cls, sequences) -> "Batch":
        """Build a batch from ``(num_new_tokens, num_cached_tokens)`` pairs, one per sequence.

        A sequence with one new token and a non-empty cache is a decode; anything else a prefill.
        """
        new, cached, n_dec, ctx = [], [], 0, 0
        for num_new, num_cached in sequences:
            if num_new < 1 or num_cached < 0:
                raise ValueError(f"bad sequence ({num_new}, {num_cached}): need new >= 1, cached >= 0")
            if num_new == 1 and num_cached > 0:
                n_dec += 1
                ctx += num_cached
            else:
                new.append(num_new)
                cached.append(num_cached)
        return cls(new, cached, n_dec, ctx)

    @property
    def num_prefill_tokens(self) -> int:
        """New tokens computed by prefill chunks."""
        return sum(self.prefill_new_tokens)

    @property
    def num_tokens(self) -> int:
        """All tokens computed this iteration (prefill chunks plus one per decode)."""
        return sum(self.prefill_new_tokens) + self.num_decode_seqs

    @property
    def num_seqs(self) -> int:
        """Sequences in the batch."""
        return len(self.prefill_new_tokens) + self.num_decode_seqs

    def __repr__(self) -> str:
        return (f"Batch(prefill_new_tokens={self.prefill_new_tokens}, "
                f"prefill_cached_tokens={self.prefill_cached_tokens}, "
                f"num_decode_seqs={self.num_decode_seqs}, "
                f"decode_context_sum={self.decode_context_sum})")


@runtime_checkable
class CostModel(Protocol):
    """Maps a batch to the seconds its iteration takes on the GPU."""

    def iteration_time(self, batch: Batch) -> float:  # pragma: no cover - protocol
        """Seconds the iteration takes."""


class UnitCostModel:
    """Every iteration takes the same time (1.0 by default): time is counted in iterations."""

    #: The time depends on the batch alone (quiet decode steps may be planned ahead).
    pure_iteration_time = True

    def __init__(self, time_per_iteration: float = 1.0) -> None:
        if not time_per_iteration > 0:
            raise ValueError(f"time_per_iteration must be > 0, got {time_per_iteration!r}")
        self.time_per_iteration = float(time_per_iteration)

    def iteration_time(self, batch: Batch) -> float:
        """A constant."""
        return self.time_per_iteration

    def breakdown(self, batch: Batch) -> dict:
        """All of the constant is overhead."""
        return {"linear": 0.0, "attention": 0.0, "communication": 0.0,
                "overhead": self.time_per_iteration}


class LinearCostModel:
    """Fixed overhead + per prefill token + per prefill attention pair + per decode + per KV read.

    ``t = overhead + prefill_token * P + prefill_attention * sum(chunk * (cached + chunk / 2))
    + decode_seq * D + cached_token * C`` where P is the prefill tokens, D the decode sequences and
    C the cached tokens the decodes read. The defaults are placeholders of the right magnitude for
    Llama-2-7B on one A100 (about 8 ms for a lone decode, about 0.13 s for a 2048-token prefill);
    use :mod:`simsched.calibrated` for times fitted to measurements.
    """

    #: The time depends on the batch alone (quiet decode steps may be planned ahead).
    pure_iteration_time = True

    def __init__(self, overhead: float = 8e-3, prefill_token: float = 6e-5,
                 prefill_attention: float = 3.5e-12, decode_seq: float = 1e-4,
                 cached_token: float = 2.6e-7) -> None:
        for name, value in (("overhead", overhead), ("prefill_token", prefill_token),
                            ("prefill_attention", prefill_attention),
                            ("decode_seq", decode_seq), ("cached_token", cached_token)):
            if not value >= 0:
                raise ValueError(f"LinearCostModel.{name} must be >= 0, got {value!r}")
        self.overhead = overhead
        self.prefill_token = prefill_token
        self.prefill_attention = prefill_attention
        self.decode_seq = decode_seq
        self.cached_token = cached_token
        if overhead == 0 and (prefill_token == 0 or decode_seq == 0):
            raise ValueError("LinearCostModel would give zero-time iterations")

    def breakdown(self, batch: Batch) -> dict:
        """Seconds per part: linear ops, attention, communication (none), overhead."""
        pairs = 0.0
        for new, cached in zip(batch.prefill_new_tokens, batch.prefill_cached_tokens):
            pairs += new * (cached + new / 2)
        return {
            "linear": self.prefill_token * sum(batch.prefill_new_tokens)
            + self.decode_seq * batch.num_decode_seqs,
            "attention": self.prefill_attention * pairs
            + self.cached_token * batch.decode_context_sum,
            "communication": 0.0,
            "overhead": self.overhead,
        }

    def iteration_time(self, batch: Batch) -> float:
        """Sum of the breakdown."""
        t = self.overhead + self.decode_seq * batch.num_decode_seqs \
            + self.cached_token * batch.decode_context_sum
        for new, cached in zip(batch.prefill_new_tokens, batch.prefill_cached_tokens):
            t += self.prefill_token * new + self.prefill_attention * new * (cached + new / 2)
        return t
