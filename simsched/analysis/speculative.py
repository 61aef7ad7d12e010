"""Speculative-decoding metrics of a run (``scheduler.speculative`` on).

vLLM's names where it has them (``spec_decode`` metrics and ``vllm bench serve``):

* ``num_drafts``, ``num_draft_tokens``, ``num_accepted_tokens``; ``acceptance_rate``
  (accepted / draft tokens); ``mean_acceptance_length`` (1 + accepted / drafts: tokens a
  verification yields, the bonus token included); ``acceptance_per_position`` (the share of
  drafts whose position i was accepted);
* ``accepted_tokens_per_step``: tokens a decoder gains per verification, mean and distribution
  (``accepted_tokens_dist[a]``: the share of drafts accepting exactly ``a`` proposals);
  ``tokens_per_decode_step``: tokens all decoders gain per decode step;
* ``spec_efficiency``: tokens yielded / the most K proposals could yield ((accepted + drafts) /
  (drafts x (K + 1)), vLLM V0's "system efficiency");
* ITL as the client sees it. Several tokens may arrive in one chunk. ``itl_*`` (per chunk) are
  ``vllm bench serve``'s: one sample per streamed chunk, its gap since the previous one (the
  run summary's ``itl_*``, from the request frames). ``itl_per_token_*`` spread each chunk's gap
  over its tokens (a chunk of n tokens after gap g counts n samples of g / n; the first token,
  from the prefill, is not a decode chunk), so their mean is close to TPOT; TPOT is as always
  ``(e2el - ttft) / (output - 1)``.
"""

from __future__ import annotations

import math

import numpy as np

from simsched.analysis.itl import weighted_percentiles

PERCENTILES = (50, 90, 99)


def spec_counters(stats: dict) -> dict:
    """The speculation metrics that need only ``Results.info["speculative"]`` (``stats``):
    counts, acceptance, accepted tokens per step, efficiency and per-token ITL."""
    k = stats["num_speculative_tokens"]
    drafts = stats["num_drafts"]
    accepted = stats["num_accepted_tokens"]
    nan = math.nan
    out = {"num_speculative_tokens": k, "num_drafts": drafts,
           "num_draft_tokens": stats["num_draft_tokens"], "num_accepted_tokens": accepted}
    out["acceptance_rate"] = accepted / stats["num_draft_tokens"] \
        if stats["num_draft_tokens"] else nan
    out["mean_acceptance_length"] = 1 + accepted / drafts if drafts else nan
    out["acceptance_per_position"] = [n / drafts if drafts else nan
                                      for n in stats["accepted_per_pos"]]
    out["accepted_tokens_dist"] = [n / drafts if drafts else nan for n in stats["accepted_hist"]]
    ver = stats["num_verifications"]
    out["accepted_tokens_per_step"] = (accepted + ver) / ver if ver else nan
    out["tokens_per_decode_step"] = (accepted + ver) / stats["num_steps"] \
        if stats["num_steps"] else nan
    out["spec_efficiency"] = (accepted + drafts) / (drafts * (k + 1)) if drafts else nan
    out["num_skipped"] = stats["num_skipped"]
    gaps, tokens = stats["chunk_gaps"], stats["chunk_tokens"]
    per_token = gaps / np.maximum(tokens, 1)
    for q, v in zip(PERCENTILES, weighted_percentiles(per_token, tokens, PERCENTILES)):
        out[f"itl_per_token_p{q}"] = v
    out["itl_per_token_mean"] = float(gaps.sum() / tokens.sum()) if tokens.sum() else nan
    return out


def spec_summary(results) -> dict:
    """The speculation metrics of ``results`` (a :class:`~simsched.analysis.metrics.Results`):
    :func:`spec_counters` plus per-chunk ITL and TPOT percentiles; a ValueError if the run did
    not speculate."""
    stats = results.info.get("speculative")
    if stats is None:
        raise ValueError("this run did not speculate (scheduler.speculative is off or K = 0)")
    out = spec_counters(stats)
    summary = results.summary()
    nan = math.nan
    for q in PERCENTILES:
        out[f"itl_p{q}"] = summary.get(f"itl_p{q}", nan)
    out["itl_mean"] = summary.get("itl_mean", nan)
    tpot = results.requests["tpot"].dropna().to_numpy()
    for q in PERCENTILES:
        out[f"tpot_p{q}"] = float(np.percentile(tpot, q)) if len(tpot) else nan
    return out


# The scalars a speculating run's summary() adds.
SUMMARY_KEYS = ("mean_acceptance_length", "acceptance_rate", "spec_efficiency",
                "accepted_tokens_per_step", "itl_per_token_mean", "itl_per_token_p50",
                "itl_per_token_p99")
