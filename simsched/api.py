"""The public Python entry points: ``simulate``, ``make_requests`` and ``simulate_checked``."""

from __future__ import annotations

import math

from simsched.analysis.runner import make_requests, run, simulate
from simsched.engine.invariants import check_final_state
from simsched.engine.result_checks import check_results

__all__ = ["make_requests", "simulate", "simulate_checked"]


def simulate_checked(config, requests=None, cost_model=None):
    """Run :func:`simulate` with every invariant checked; return (results, engine).

    Per-iteration invariants are switched on; if the run has no time limit the end-of-run state
    and the result frames are checked too. For tests and fuzzing.
    """
    results, engine = run(config.replace(check_invariants=True), requests, cost_model,
                          keep_engine=True)
    if math.isinf(config.max_sim_time):
        check_final_state(engine)
        check_results(results)
    return results, engine
