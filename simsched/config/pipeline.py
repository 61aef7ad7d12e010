"""Which model of vLLM V1's async pipeline a replica runs: plan ahead, the arrival rule, or none.

:func:`simsched.cost.overhead.async_scheduling` says whether a replica's engine is pipelined
(``scheduler.async_scheduling`` if set, else the engine profile of the cost model that runs).
Since issue 40 ``scheduler.plan_ahead=None`` (the default) plans ahead exactly then: the
decisions of vLLM's ``AsyncScheduler``. The arrival rule alone (a plan sees only the requests
that arrived before the previous iteration started) is what a pipelined replica applies with
``plan_ahead=False``, the ``classic`` preset: one model of when an arrival becomes visible, not
two.
"""

from __future__ import annotations

from simsched.cost import overhead


def plan_ahead(config, cost_model) -> bool:
    """Whether a replica of ``config`` (a ``SimConfig``) timed by ``cost_model`` plans ahead:
    ``scheduler.plan_ahead`` if set; else off under speculative decoding (not modelled with plan
    ahead); else whether the replica is pipelined (:func:`overhead.async_scheduling`)."""
    sched = config.scheduler
    if sched.plan_ahead is not None:
        return sched.plan_ahead
    spec = sched.speculative
    if spec is not None and spec.enabled:
        return False
    return overhead.async_scheduling(config, cost_model)


def pipelined(config, cost_model) -> bool:
    """Whether the replica's engine overlaps its host work with the GPU's step: it plans ahead
    or applies the arrival rule (vLLM's async scheduling, SGLang's and TensorRT-LLM's overlap
    schedulers). A replica that does not pays the engine profile's host time on every step
    (:mod:`simsched.cost.host_time`)."""
    return plan_ahead(config, cost_model) or arrival_rule(config, cost_model)


def arrival_rule(config, cost_model) -> bool:
    """Whether the replica applies the pipeline's arrival rule: pipelined, not planning ahead.
    SGLang's and TensorRT-LLM's overlap schedulers pipeline the same way (a request arriving
    while step k runs joins step k + 2 at the earliest); for those engines the rule is their
    overlap scheduler (:func:`overhead.overlap_scheduling`: on under their profiles, off with
    ``scheduler.async_scheduling=False``)."""
    if config.scheduler.engine != "vllm":
        return overhead.overlap_scheduling(config, cost_model)
    return overhead.async_scheduling(config, cost_model) and not plan_ahead(config, cost_model)
