"""Hostile input, as a careless or hostile user would try it (issue 17 item 21), as one table.

Each row is a request table, an optional cost model and config changes, and what must happen:
a ``ValueError`` (or subclass) whose message matches, or a run that completes and passes a check.
Rows marked ``# 13`` are the thirteen cases the issue found failing.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

import simsched
from simsched import SimConfig, UnitCostModel
from simsched.engine.replica import IterationTimeError


class Returns:
    """A cost model returning a fixed value, whatever the batch."""

    def __init__(self, value):
        self.value = value

    def iteration_time(self, batch):
        return self.value


OK3 = [(0.0, 3, 3), (0.5, 2, 2)]
# One turn of a closed-loop session (session_id and think_time make the table closed-loop).
SESSION = {"arrival_at": 0.0, "num_prompt_tokens": 3, "num_output_tokens": 2, "session_id": 1,
           "think_time": 0.5}
REQ = r"requests\[0\]"
INT64 = "an integer >= 1 within int64"
COST = r"cost model Returns returned {} .*for Batch\(prefill_new_tokens=\[3\].* at t=0\.0"


def rejected(n):
    return lambda res: res.summary()["num_rejected"] == n


def finished(res):
    return (res.requests["status"] == "finished").all()


def exact_e2el(e2el):
    return lambda res: list(res.requests["e2el"]) == e2el


CASES = [
    # ---------------------------------------------------------------- integers beyond int64
    ("output 2**64", [(0.0, 1, 2**64)], None, {},                                   # 13
     ValueError, rf"{REQ}\.num_output_tokens must be {INT64}, got 18446744073709551616"),
    ("output 2**63", [(0.0, 1, 2**63)], None, {}, ValueError, rf"{REQ}\.num_output_tokens"),
    ("priority 2**63", [(0.0, 1, 1, 2**63)], None, {},                              # 13
     ValueError, rf"{REQ}\.priority must be an integer within int64, got 9223372036854775808"),
    ("priority -2**63-1", [(0.0, 1, 1, -2**63 - 1)], None, {}, ValueError, rf"{REQ}\.priority"),
    ("prompt 2**63", [(0.0, 2**63, 1)], None, {},                                   # 13
     ValueError, rf"{REQ}\.num_prompt_tokens must be {INT64}, got 9223372036854775808"),
    ("prompt 1e19", [(0.0, 1e19, 1)], None, {},                                     # 13
     ValueError, rf"{REQ}\.num_prompt_tokens must be {INT64}, got 1e\+19"),
    ("prompt -2**64", [(0.0, -2**64, 1)], None, {}, ValueError, rf"{REQ}\.num_prompt_tokens"),
    ("second row 2**70", [(0.0, 1, 1), (1.0, 2**70, 1)], None, {},
     ValueError, r"requests\[1\]\.num_prompt_tokens"),
    ("prompt 2**62 (fits int64)", [(0.0, 2**62, 1), (0.0, 3, 3)], None, {}, None, rejected(1)),
    ("output 2**40", [(0.0, 3, 2**40)], None, {}, None, rejected(1)),
    ("priority -2**63", [(0.0, 3, 3, -2**63)], None, {}, None, finished),
    # ---------------------------------------------------------------- booleans are not numbers
    ("prompt True among ints", [(0.0, True, 5), (1.0, 3, 4)], None, {},             # 13
     ValueError, rf"{REQ}\.num_prompt_tokens must be {INT64}, got True"),
    ("prompt column all bool", [(0.0, True, 5)], None, {}, ValueError, rf"{REQ}\.num_prompt"),
    ("output np.True_", [(0.0, 3, np.True_), (0.0, 3, 3)], None, {},
     ValueError, rf"{REQ}\.num_output_tokens"),
    ("arrival True", [(True, 1, 1), (0.5, 1, 1)], None, {},
     ValueError, rf"{REQ}\.arrival_at must be a finite number >= 0, got True"),
    ("priority True", [(0.0, 1, 1, True), (0.0, 1, 1, 2)], None, {},
     ValueError, rf"{REQ}\.priority"),
    # ---------------------------------------------------------------- other bad values
    ("arrival NaN", [(math.nan, 1, 1)], None, {}, ValueError, rf"{REQ}\.arrival_at"),
    ("arrival inf", [(math.inf, 1, 1)], None, {}, ValueError, rf"{REQ}\.arrival_at"),
    ("arrival -1", [(-1.0, 1, 1)], None, {}, ValueError, rf"{REQ}\.arrival_at.*>= 0"),
    ("arrival text", [("soon", 1, 1)], None, {}, ValueError, rf"{REQ}\.arrival_at.*'soon'"),
    ("arrival None", [(None, 1, 1)], None, {}, ValueError, rf"{REQ}\.arrival_at"),
    ("prompt 0", [(0.0, 0, 1)], None, {}, ValueError, rf"{REQ}\.num_prompt_tokens.*got 0"),
    ("prompt -1", [(0.0, -1, 1)], None, {}, ValueError, rf"{REQ}\.num_prompt_tokens"),
    ("prompt 1.5", [(0.0, 1.5, 1)], None, {}, ValueError, rf"{REQ}\.num_prompt_tokens.*1\.5"),
    ("prompt text", [(0.0, "ten", 1)], None, {}, ValueError, rf"{REQ}\.num_prompt_tokens"),
    ("prompt None", [(0.0, None, 1)], None, {}, ValueError, rf"{REQ}\.num_prompt_tokens"),
    ("prompt NaN", [(0.0, math.nan, 1)], None, {}, ValueError, rf"{REQ}\.num_prompt_tokens"),
    ("output 0", [(0.0, 1, 0)], None, {}, ValueError, rf"{REQ}\.num_output_tokens.*got 0"),
    ("priority 1.5", [(0.0, 1, 1, 1.5)], None, {}, ValueError, rf"{REQ}\.priority"),
    ("priority text", [(0.0, 1, 1, "high")], None, {}, ValueError, rf"{REQ}\.priority"),
    ("row too short", [(0.0, 1)], None, {}, ValueError, rf"{REQ}: expected \(arrival_at"),
    ("row too long", [(0.0, 1, 1, 0, "t", 9)], None, {}, ValueError, rf"{REQ}: expected"),
    ("row a number", [5], None, {}, ValueError, rf"{REQ}: expected"),
    ("dict without output", [{"arrival_at": 0, "num_prompt_tokens": 1}], None, {},
     ValueError, r"lacks column\(s\) \['num_output_tokens'\]"),
    # ---------------------------------------------------------------- tenants
    ("list tenant, fair", [(0.0, 1, 1, 0, ["a"])], None, {"policy": "fair"},        # 13
     ValueError, rf"{REQ}\.tenant must be a hashable label .*got \['a'\]"),
    ("dict tenant, fcfs", [(0.0, 1, 1, 0, {"a": 1})], None, {}, ValueError, rf"{REQ}\.tenant"),
    ("int tenants, fair", [(0.0, 3, 3, 0, 7), (0.0, 3, 3, 0, 8)], None, {"policy": "fair"},
     None, finished),
    ("NaN tenant", [(0.0, 3, 3, 0, math.nan), (0.0, 3, 3, 0, "b")], None, {"policy": "fair"},
     None, finished),
    # ---------------------------------------------------------------- times and resolution
    ("arrival 1e17, unit cost", [(1e17, 3, 3)], None, {},                           # 13
     IterationTimeError, r"returned 1\.0 s .* at t=1e\+17 s, below the clock's float resolution"),
    ("arrival 1e300, unit cost", [(1e300, 3, 3)], None, {},                         # 13
     IterationTimeError, r"at t=1e\+300 s, below the clock's float resolution"),
    ("arrival 1e15, unit cost", [(1e15, 3, 3)], None, {}, IterationTimeError, "resolution"),
    ("unix-epoch arrivals", [(1.7e9, 3, 3), (1.7e9 + 0.5, 2, 2)], None, {},
     None, exact_e2el([3.0, 2.5])),
    ("unsorted and tied arrivals", [(2.0, 1, 1), (0.0, 1, 1), (2.0, 1, 1)], None, {},
     None, lambda res: list(res.requests["arrival_at"]) == [0.0, 2.0, 2.0]),
    # ---------------------------------------------------------------- cost model return values
    ("cost None", OK3, Returns(None), {}, IterationTimeError,                       # 13
     COST.format(r"None \(NoneType, not a number of seconds\)")),
    ("cost str", OK3, Returns("0.1"), {}, IterationTimeError, COST.format("'0.1'")),  # 13
    ("cost complex", OK3, Returns(1j), {}, IterationTimeError, COST.format("1j")),  # 13
    ("cost list", OK3, Returns([0.1]), {}, IterationTimeError, COST.format(r"\[0\.1\]")),
    ("cost bool", OK3, Returns(True), {}, IterationTimeError, COST.format("True")),
    ("cost 0", OK3, Returns(0), {}, IterationTimeError,
     COST.format(r"0\.0 s") + " s: an iteration time must be a finite number > 0"),
    ("cost negative", OK3, Returns(-0.1), {}, IterationTimeError, COST.format(r"-0\.1 s")),
    ("cost -0.0", OK3, Returns(-0.0), {}, IterationTimeError, COST.format(r"-0\.0 s")),
    ("cost NaN", OK3, Returns(math.nan), {}, IterationTimeError, COST.format("nan s")),
    ("cost inf", OK3, Returns(math.inf), {}, IterationTimeError,
     COST.format("inf s") + " s: an iteration time overflows the clock"),
    ("cost 1e308", OK3, Returns(1e308), {}, IterationTimeError,                     # 13
     r"returned 1e\+308 s .* overflows the clock"),
    ("cost 5e-324", OK3, Returns(5e-324), {}, IterationTimeError,                   # 13
     COST.format("5e-324 s") + r" s, below the clock's float resolution"),
    ("cost np.float32", OK3, Returns(np.float32(0.5)), {}, None, exact_e2el([1.5, 1.0])),
    ("cost int", OK3, Returns(2), {}, None, exact_e2el([6.0, 5.5])),
    ("cost np.int64", OK3, Returns(np.int64(1)), {}, None, exact_e2el([3.0, 2.5])),
    ("cost Fraction", OK3, Returns(Fraction(1, 2)), {}, None, exact_e2el([1.5, 1.0])),
    ("cost without iteration_time", OK3, object(), {}, ValueError, "iteration_time"),
    # ---------------------------------------------------------------- closed-loop session tables
    ("session priority 2**64", [SESSION | {"priority": 2**64}], None, {},
     ValueError, rf"{REQ}\.priority must be an integer within int64"),
    ("session priority True", [SESSION | {"priority": True}], None, {},
     ValueError, rf"{REQ}\.priority must be an integer within int64, got True"),
    ("session tenant list", [SESSION | {"tenant": ["a"]}], None, {},
     ValueError, rf"{REQ}\.tenant must be a hashable label"),
    ("session plain", [SESSION | {"priority": 3, "tenant": "t"}], None, {}, None, finished),
]


@pytest.mark.parametrize("name,requests,cost,changes,error,check", CASES,
                         ids=[c[0] for c in CASES])
def test_hostile_input(name, requests, cost, changes, error, check):
    config = SimConfig(check_invariants=True).replace(**changes)
    cost = UnitCostModel() if cost is None else cost
    if error is not None:
        with pytest.raises(error, match=check):
            simsched.simulate(config, requests=requests, cost_model=cost)
        return
    res = simsched.simulate(config, requests=requests, cost_model=cost)
    assert check(res), res.requests.to_string()


def test_the_table_holds_the_issues_thirteen_failures():
    import inspect

    assert inspect.getsource(inspect.getmodule(test_hostile_input)).count("# 13\n") == 13


def test_dataframe_input_is_validated_the_same_way():
    frame = pd.DataFrame({"arrival_at": [0.0, 1.0], "num_prompt_tokens": [3, 2**63],
                          "num_output_tokens": [1, 1]}, dtype=object)
    with pytest.raises(ValueError, match=r"requests\[1\]\.num_prompt_tokens .*int64"):
        simsched.simulate(SimConfig(), requests=frame, cost_model=UnitCostModel())
    frame = pd.DataFrame({"arrival_at": [0.0], "num_prompt_tokens": np.array([2**63], np.uint64),
                          "num_output_tokens": [1]})
    with pytest.raises(ValueError, match=r"requests\[0\]\.num_prompt_tokens"):
        simsched.simulate(SimConfig(), requests=frame, cost_model=UnitCostModel())
