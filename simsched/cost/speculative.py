"""What a speculative step costs: the target model verifying 1 + K tokens per sequence, plus the
proposer's own forward passes, on top of any cost model.

:class:`SpecBatch` is the batch the speculative scheduler (:mod:`simsched.engine.scheduler.speculative`)
hands out: a :class:`~simsched.cost.base.Batch` whose decodes also verify ``num_spec_tokens``
proposed tokens in all. :class:`SpeculativeCostModel` wraps the run's cost model (any of them:
it asks only ``iteration_time`` and, for the proposer, ``breakdown``):

* **verify**: a decode whose sequences each compute 1 + k query tokens. The GEMMs, the LM head
  and the sampler see every token; attention reads each sequence's context once (decode
  attention is memory-bound: its cost follows the KV bytes read, not the queries). The wrapped
  model is asked for a batch whose decodes count ``num_decode_seqs + num_spec_tokens`` query
  rows and the same ``decode_context_sum``: exact for the token-proportional parts, and it
  charges the per-sequence terms (decode-attention launch, CPU bookkeeping) once per query row,
  an over-estimate of a few percent at most where those terms are small.
* **proposer** (for the decoders of the step, proposing the next step's drafts):
  ``draft_model``: K sequential decode steps of the draft model on the same GPU and
  tensor-parallel degree (their GPU time: the breakdown without its overhead part; the engine
  overhead is paid once per step, by the target); ``eagle`` / ``mtp``: K forward passes of about
  ``proposer_layers`` decoder layers each, priced as that share of the target's own decode GPU
  time; ``ngram``: nothing.
"""

from __future__ import annotations

from simsched.cost.base import Batch


class SpecBatch(Batch):
    """A batch whose decodes verify proposed tokens: ``num_spec_tokens`` beyond one per
    decoder, in all (``num_tokens`` counts them: they take the token budget)."""

    __slots__ = ("num_spec_tokens",)

    @property
    def num_tokens(self) -> int:
        """All tokens computed: prefill chunks, one per decode and the verified proposals."""
        return sum(self.prefill_new_tokens) + self.num_decode_seqs + self.num_spec_tokens

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f", num_spec_tokens={self.num_spec_tokens})"


def _gpu_time(model, batch: Batch) -> float:
    """Kernel time of ``batch`` under ``model``: its breakdown without the engine overhead
    (the whole iteration time for a model without a breakdown)."""
    breakdown = getattr(model, "breakdown", None)
    if breakdown is None:
        return model.iteration_time(batch)
    parts = breakdown(batch)
    return sum(v for k, v in parts.items() if k != "overhead")


class SpeculativeCostModel:
    """``base``'s iteration time for a speculative step (see the module docstring).

    ``proposer`` is None (``ngram``), ``("draft", draft_cost_model)`` or ``("layers",
    fraction)`` with ``fraction`` = proposer_layers / target layers. Attributes other than the
    cost methods (``output_delay``, ``engine_overhead``, ...) are the base model's.
    """

    def __init__(self, base, num_speculative_tokens: int, proposer=None) -> None:
        self.base = base
        self.k = num_speculative_tokens
        self.proposer = proposer

    def __getattr__(self, name):
        return getattr(self.base, name)

    def __repr__(self) -> str:
        return f"SpeculativeCostModel({self.base!r}, k={self.k}, proposer={self.proposer!r})"

    def _verify_batch(self, batch: Batch) -> Batch:
        plain = Batch(batch.prefill_new_tokens, batch.prefill_cached_tokens,
                      batch.num_decode_seqs + getattr(batch, "num_spec_tokens", 0),
                      batch.decode_context_sum)
        plain.swap_out_bytes = batch.swap_out_bytes
        plain.swap_in_bytes = batch.swap_in_bytes
        return plain

    def proposer_time(self, batch: Batch) -> float:
        """Seconds the proposer takes for the step's decoders (K drafts each)."""
        n = batch.num_decode_seqs
        if not n or self.proposer is None or not self.k:
            return 0.0
        kind, what = self.proposer
        decode = Batch((), (), n, batch.decode_context_sum)
        if kind == "draft":
            # K sequential decode steps of the draft; its context grows by a token per step.
            return sum(_gpu_time(what, Batch((), (), n, batch.decode_context_sum + i * n))
                       for i in range(self.k))
        return self.k * what * _gpu_time(self.base, decode)

    def iteration_time(self, batch: Batch) -> float:
        """Verify (the wrapped model's time) plus the proposer."""
        return self.base.iteration_time(self._verify_batch(batch)) + self.proposer_time(batch)

    def breakdown(self, batch: Batch) -> dict:
        """The wrapped model's breakdown of the verify step, plus ``proposer``."""
        verify = self._verify_batch(batch)
        inner = getattr(self.base, "breakdown", None)
        parts = dict(inner(verify)) if inner is not None else {
            "overhead": self.base.iteration_time(verify)}
        parts["proposer"] = self.proposer_time(batch)
        return parts


def speculative_cost_model(base, spec, hardware):
    """Wrap ``base`` (the run's cost model for ``hardware``) for ``spec`` (a SpeculativeConfig
    that is on)."""
    from simsched.cost.factory import make_cost_model
    from simsched.cost.hardware import model_spec

    proposer = None
    if spec.method == "draft_model":
        import dataclasses

        draft_hw = dataclasses.replace(hardware, model=spec.draft_model, model_spec=None,
                                       max_model_len=None)
        proposer = ("draft", make_cost_model(draft_hw))
    elif spec.method in ("eagle", "mtp"):
        proposer = ("layers", spec.proposer_layers / model_spec(hardware).num_layers)
    return SpeculativeCostModel(base, spec.num_speculative_tokens, proposer)
