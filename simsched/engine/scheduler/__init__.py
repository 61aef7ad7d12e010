"""The vLLM V1 scheduler step and its collaborators.

:mod:`~simsched.engine.scheduler.core` owns the step's state and reads as vLLM's ``schedule()``;
admission (:mod:`.admission`, :mod:`.constraints`), decode grants (:mod:`.decode`), preemption
and swap (:mod:`.preemption`, :mod:`.swap`), disaggregated handoff (:mod:`.handoff`), async
plan-ahead (:mod:`.plan_ahead`), queue-policy binding (:mod:`.queue_binding`), speculative
decoding (:mod:`.speculative`) and the exact quiet-step fast path (:mod:`.quiet`) sit beside it.
"""
