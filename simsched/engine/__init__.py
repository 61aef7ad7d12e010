"""One serving replica: request state, KV cache, scheduler, preemption, swap, and its SimPy loop.

Everything here except :mod:`simsched.engine.replica` is a plain object, testable without SimPy.
"""
