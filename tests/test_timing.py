"""Arrival times are kept exactly, ties are simultaneous, and an arrival at a batch-forming instant
joins that batch (issue 17, items 19 and 20)."""

import numpy as np
import pytest

import simsched
from simsched import SimConfig, UnitCostModel

COLS = ["request_id", "arrival_at", "first_scheduled_at", "finished_at"]


def _run(requests, cost=1.0, **changes):
    res = simsched.simulate(SimConfig(check_invariants=True).replace(**changes),
                            requests=requests, cost_model=UnitCostModel(cost))
    return res.requests.set_index("request_id")


def test_equal_arrival_times_keep_fcfs_order():
    # 0.3 + 0.6 lands one ulp off 0.9: the first 0.9 request used to be served second.
    df = _run([(0.3, 1, 1), (0.9, 1, 1), (0.9, 1, 1)], max_num_seqs=1)
    assert list(df["arrival_at"]) == [0.3, 0.9, 0.9]
    assert list(df["first_scheduled_at"]) == [0.3, 1.3, 2.3]


def test_simultaneous_arrivals_share_an_idle_gpu_iteration():
    # 0.2 + d is never exactly 0.9: both 0.9 arrivals must still land on the same instant.
    df = _run([(0.2, 1, 1), (0.9, 1, 1), (0.9, 1, 1)], cost=0.25)
    assert list(df["arrival_at"]) == [0.2, 0.9, 0.9]
    assert list(df["first_scheduled_at"]) == [0.2, 0.9, 0.9]


@pytest.mark.parametrize("b", [0.5, 1.0, 1.5, 1.999])
def test_arrival_at_batch_forming_instant_joins_that_batch(b):
    # Request 0 decodes in iterations ending at 1, 2, 3, 4, 5; request 2 arrives exactly at 2.0,
    # when an iteration ends and the next batch forms: it joins that batch whatever b is.
    df = _run([(0.0, 1, 5), (b, 1, 1), (2.0, 1, 1)])
    assert df.loc[2, "first_scheduled_at"] == 2.0
    assert df.loc[2, "finished_at"] == 3.0


def test_arrival_at_idle_wake_instant_joins_batch():
    # Three arrivals at one instant after an idle GPU, given in reverse id order of the tuple list
    # positions: all three are in the first batch, and the frame keeps their times exactly.
    t = 0.1 + 0.2                     # 0.30000000000000004, not 0.3
    df = _run([(t, 3, 1), (t, 2, 1), (0.0, 1, 1), (t, 1, 1)], cost=0.1)
    assert (df["arrival_at"].iloc[1:] == t).all()
    assert (df["first_scheduled_at"].iloc[1:] == t).all()


def test_random_ties_are_served_in_arrival_then_id_order():
    rng = np.random.default_rng(3)
    times = np.round(rng.uniform(0, 20, 300), 1)    # many exact ties, decimal times
    reqs = [(float(t), 1, 1) for t in times]
    df = _run(reqs, cost=0.3, max_num_seqs=1)
    assert (df["arrival_at"].to_numpy() == np.sort(times)).all()
    order = df.sort_values("first_scheduled_at", kind="stable")
    keys = list(zip(order["arrival_at"], order.index))
    assert keys == sorted(keys)
