"""The user's view of a run with client timeouts, retries or replica failures.

The engine sees attempts; the user sees requests. A run with
:class:`~simsched.config.faults.FaultsConfig`'s client behaviour builds its request frame with one
row per attempt, then :func:`split_attempts` turns it into

* the *attempts frame* (``Results.attempts``): one row per attempt, with ``attempt_id`` (the
  attempt's own request id), ``request_id`` (its user request), ``attempt`` (1, 2, ...),
  ``outcome`` (``finished``, ``timed_out``, ``cancelled``, ``failed``, ``shed``, ``rejected``,
  or ``waiting``/``running`` when ``max_sim_time`` cut the run), ``sent_at``, ``ended_at``, the
  KV tokens its abort threw away (``num_aborted_kv_tokens``) and its wasted prefill and decode
  tokens, next to every request-frame column of the attempt;
* the *request frame* (``Results.requests``): one row per user request, that of its deciding
  attempt (the first to finish, else the last sent), with ``arrival_at`` the first attempt's
  send, so TTFT, E2E latency and queue time, and with them goodput and SLO attainment, are the
  user's (the first successful attempt's latency from the first attempt's send);
  ``num_attempts`` and the wasted tokens of all its attempts added (a request the run ended
  before it was sent keeps its own row, status ``pending``, no attempt).

Inter-token gaps stay pooled over every attempt's tokens (the user saw the tokens of a stream
that broke off too).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

ATTEMPT_EXTRA = ("attempt_id", "request_id", "attempt", "outcome", "sent_at", "ended_at",
                 "num_aborted_kv_tokens", "num_wasted_prefill_tokens",
                 "num_wasted_decode_tokens")
WASTED = ("num_wasted_prefill_tokens", "num_wasted_decode_tokens")


def split_attempts(req_df: pd.DataFrame, rows: list, columns) -> tuple[pd.DataFrame,
                                                                         pd.DataFrame]:
    """``(requests, attempts)`` from the per-attempt request frame ``req_df`` (its
    ``request_id`` the attempt's id) and the clients' attempt ``rows`` (``columns``:
    :data:`simsched.cluster.retries.ATTEMPT_COLUMNS`)."""
    rows_df = pd.DataFrame(rows, columns=list(columns))
    by_id = req_df.set_index("request_id", drop=False)
    # Attempts in the order they were sent; their request-frame rows alongside.
    rows_df = rows_df.sort_values(["request_id", "attempt"], kind="stable")
    engine = by_id.loc[rows_df["attempt_id"].to_numpy()].reset_index(drop=True)
    attempts = engine.rename(columns={"request_id": "attempt_id"})
    attempts.insert(1, "request_id", rows_df["request_id"].to_numpy())
    attempts.insert(2, "attempt", rows_df["attempt"].to_numpy())
    # A run cut by max_sim_time leaves attempts open: their engine status says where.
    outcome = rows_df["outcome"].to_numpy(dtype=object, copy=True)
    open_ = outcome == ""
    outcome[open_] = attempts["status"].to_numpy(dtype=object)[open_]
    attempts.insert(3, "outcome", outcome)
    attempts.insert(4, "sent_at", rows_df["sent_at"].to_numpy())
    attempts.insert(5, "ended_at", rows_df["ended_at"].to_numpy())
    for name in ("num_aborted_kv_tokens",) + WASTED:
        attempts[name] = rows_df[name].to_numpy(dtype=np.int64)
    # The deciding attempt: the first to finish, else the last sent.
    finished = attempts["status"].to_numpy() == "finished"
    key = np.where(finished, attempts["finished_at"].to_numpy(), np.inf)
    order = pd.DataFrame({"user": attempts["request_id"].to_numpy(), "fin": ~finished,
                          "key": key, "neg": -attempts["attempt"].to_numpy(),
                          "pos": np.arange(len(attempts))})
    order = order.sort_values(["user", "fin", "key", "neg"], kind="stable")
    pick = order.drop_duplicates("user")["pos"].to_numpy()
    users = attempts.iloc[pick]
    first = attempts[attempts["attempt"] == 1].set_index("request_id")["sent_at"]
    requests = req_df.set_index("request_id").loc[users["attempt_id"].to_numpy()]
    requests = requests.reset_index()
    user_ids = users["request_id"].to_numpy()
    requests["request_id"] = user_ids
    arrival = first.loc[user_ids].to_numpy()
    requests["arrival_at"] = arrival
    requests["ttft"] = requests["first_token_at"].to_numpy() - arrival
    requests["e2el"] = requests["finished_at"].to_numpy() - arrival
    requests["queue_time"] = requests["first_scheduled_at"].to_numpy() - arrival
    grouped = attempts.groupby("request_id")
    requests["num_attempts"] = grouped["attempt"].count().loc[user_ids].to_numpy()
    for name in WASTED:
        requests[name] = grouped[name].sum().loc[user_ids].to_numpy()
    # Requests never sent (the run ended before their arrival): their own rows, no attempt.
    unsent = req_df[~req_df["request_id"].isin(attempts["attempt_id"])].copy()
    if len(unsent):
        unsent["num_attempts"] = 0
        for name in WASTED:
            unsent[name] = 0
        requests = unsent[requests.columns] if not len(requests) else pd.concat(
            [requests, unsent[requests.columns]], ignore_index=True)
    requests = requests.sort_values("request_id", kind="stable").reset_index(drop=True)
    return requests, attempts.reset_index(drop=True)
