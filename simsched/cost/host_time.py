"""Host time a vLLM-form engine spends on every step when it does not pipeline its steps.

With async scheduling (``scheduler.async_scheduling``; vLLM's default since PR #27614, after
0.12; SGLang's and TensorRT-LLM's overlap schedulers) the engine plans step k + 1 and takes in
step k's output while step k runs on the GPU, so its host work is hidden unless it is longer
than the GPU's (the vLLM-form profiles' ``max(G, cpu) + step_gap``, :mod:`simsched.cost.vllm_v1`).
Without it (vLLM up to 0.12 by default, ``--no-async-scheduling``; SGLang's
``--disable-overlap-schedule``) the GPU waits every step for ``schedule()`` and the model
runner's input preparation before it starts, and the host for the sampled tokens' copy and
``update_from_output`` after it ends. Two engine terms time that, each per step:

* ``sync_step_time`` (s): the part that does not grow with the batch;
* ``sync_seq_time`` (s per sequence): the part per sequence in the step.

A step of ``s`` sequences of an engine that does not pipeline takes its pipelined time plus
``sync_step_time + sync_seq_time x s``
(:meth:`simsched.cost.calibrated.CalibratedCostModel.synchronous`; the replica asks for that
model when its engine is not pipelined, :func:`simsched.config.pipeline.pipelined`). Both are 0
(:data:`NEUTRAL`) in every shipped profile, so such a step takes what it did before unless
terms are given (``engine_terms``, or ``--terms`` of ``experiments.validate_silicon``).
"""

from __future__ import annotations

import math

TERMS = ("sync_step_time", "sync_seq_time")
NEUTRAL = {"sync_step_time": 0.0, "sync_seq_time": 0.0}
UNITS = {"sync_step_time": ("ms per step", 1e3),
         "sync_seq_time": ("us per sequence and step", 1e6)}


def check(terms: dict, where: str = "engine_terms") -> dict:
    """The two terms of ``terms`` (absent: 0), checked finite and >= 0; an error names
    ``where`` and the term."""
    out = {}
    for name in TERMS:
        value = terms.get(name, NEUTRAL[name])
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or value < 0:
            raise ValueError(f"{where}.{name} must be a finite number >= 0, got {value!r}")
        out[name] = float(value)
    return out
