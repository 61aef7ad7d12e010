"""Invariants of a run's result frames: every request closed as it should be, and the iterations'
token totals matching what the requests needed (:func:`check_results`).

For tests and fuzzing, after a run that ended without a time limit; each violation raises
:class:`~simsched.engine.invariants.InvariantError` naming the invariant, the request and the
time. The per-iteration and end-of-run state checks are in :mod:`simsched.engine.invariants`.
"""

from __future__ import annotations

import math

import numpy as np

from simsched.engine.invariants import InvariantError
from simsched.request import Status


# Attempts given up by their client or lost with their replica (simsched.config.faults).
GIVEN_UP = (Status.TIMED_OUT.value, Status.CANCELLED.value, Status.FAILED.value)
UNFINISHED = (Status.ABORTED.value,) + GIVEN_UP
# How a user request can end (its deciding attempt's status).
USER_ENDS = (Status.FINISHED.value, Status.REJECTED.value) + UNFINISHED


def _check_attempts(requests, attempts, now: float) -> None:
    """Every attempt ended exactly once, with the outcome its status says; every user request
    ended finished (by one of its attempts), given up after its last attempt, or rejected."""
    if attempts["attempt_id"].duplicated().any():
        rid = int(attempts.loc[attempts["attempt_id"].duplicated(), "attempt_id"].iloc[0])
        raise InvariantError("attempt_ends_once", now, "two rows for one attempt", rid)
    status = attempts["status"].to_numpy()
    outcome = attempts["outcome"].to_numpy()
    shed = (outcome == "shed") & (status == Status.REJECTED.value)
    bad = (outcome != status) & ~shed
    if bad.any():
        k = int(np.argmax(bad))
        raise InvariantError("attempt_ends_once", now, f"outcome {outcome[k]!r} but status "
                             f"{status[k]!r}", int(attempts["attempt_id"].iloc[k]))
    ended = attempts["ended_at"].to_numpy()
    if (ended < attempts["sent_at"].to_numpy()).any() or (ended > now).any():
        k = int(np.argmax((ended < attempts["sent_at"].to_numpy()) | (ended > now)))
        raise InvariantError("attempt_ends_once", now, f"ends at {ended[k]} before its send "
                             "or after the run", int(attempts["attempt_id"].iloc[k]))
    counts = attempts.groupby("request_id")["attempt"].agg(["count", "max"])
    if (counts["count"] != counts["max"]).any() or len(counts) != len(requests):
        raise InvariantError("attempt_numbers", now, "attempts of a request are not numbered "
                             "1..n, or a request has no attempt")
    for row in requests.itertuples(index=False):
        finished = row.status == Status.FINISHED.value
        if row.status not in USER_ENDS or row.num_attempts != counts["count"].get(
                row.request_id, 0):
            raise InvariantError("request_closed", now, f"ends {row.status} after "
                                 f"{row.num_attempts} attempts", int(row.request_id))
        if not finished and (attempts.loc[attempts["request_id"] == row.request_id, "status"]
                             == Status.FINISHED.value).any():
            raise InvariantError("request_closed", now, "an attempt finished but the request "
                                 f"ends {row.status}", int(row.request_id))


def check_results(results) -> None:
    """Check the frames of a run that ended without a time limit (every request closed).

    Every request is finished (all tokens generated, ordered timestamps, TTFT >= 0), rejected
    with a reason, or aborted unfinished with a reason (its replica was removed); the iterations'
    token total equals what the finished requests needed, recomputation included (and the work
    aborted requests lost), on every replica unless requests migrated; no iteration is empty.
    """
    it, now = results.iterations, results.sim_time
    attempts = getattr(results, "attempts", None)
    # With client retries the engine's requests are the attempts (one row each).
    df = results.requests if attempts is None else attempts
    if attempts is not None:
        _check_attempts(results.requests, attempts, now)
    ids = "request_id" if attempts is None else "attempt_id"
    for row in df.itertuples(index=False):
        rid = int(getattr(row, ids))
        if row.status == Status.REJECTED.value:
            if not row.reject_reason or not math.isnan(row.first_scheduled_at) \
                    or row.num_generated_tokens != 0:
                raise InvariantError("rejected_untouched", now,
                                     f"reason {row.reject_reason!r}, generated "
                                     f"{row.num_generated_tokens}", rid)
            continue
        if row.status == Status.ABORTED.value:
            if not row.reject_reason.startswith("aborted:") \
                    or row.num_generated_tokens >= row.num_output_tokens:
                raise InvariantError("aborted_unfinished", now,
                                     f"reason {row.reject_reason!r}, generated "
                                     f"{row.num_generated_tokens}", rid)
            continue
        if row.status in GIVEN_UP:
            # Timed out, cancelled or failed: closed unfinished, with a reason naming why.
            if not row.reject_reason.startswith(f"{row.status}:") \
                    or row.num_generated_tokens >= row.num_output_tokens:
                raise InvariantError("given_up_unfinished", now,
                                     f"{row.status}: reason {row.reject_reason!r}, generated "
                                     f"{row.num_generated_tokens}", rid)
            continue
        if row.status != Status.FINISHED.value:
            raise InvariantError("drained", now, f"ends {row.status}", rid)
        if row.num_generated_tokens != row.num_output_tokens:
            raise InvariantError("finished_complete", now,
                                 f"{row.num_generated_tokens}/{row.num_output_tokens}", rid)
        times = (row.arrival_at, row.first_scheduled_at, row.first_token_at, row.finished_at)
        # The client sees tokens after an output delay (vllm_v1): the engine's finish is <= now.
        if any(t != t for t in times) or any(b < a for a, b in zip(times, times[1:])) \
                or not row.ttft >= 0 or getattr(row, "engine_finished_at", times[-1]) > now:
            raise InvariantError("monotone_timestamps", now, f"timestamps {times}", rid)
        if row.num_output_tokens > 1 and not row.tpot >= 0:
            raise InvariantError("monotone_timestamps", now, f"tpot {row.tpot}", rid)
    done = df[df["status"] == Status.FINISHED.value]
    need = int((done["num_prompt_tokens"] + done["num_output_tokens"] - 1
                + done["num_recomputed_tokens"]).sum())
    # An aborted request's computed KV was all dropped: what its preemptions dropped (in its
    # num_recomputed_tokens) and what the abort threw away (the run's info).
    need += int(df.loc[df["status"].isin(UNFINISHED), "num_recomputed_tokens"].sum()) \
        + results.info.get("num_aborted_kv_tokens", 0)
    if attempts is not None:    # what the attempts' aborts threw away
        need += int(attempts["num_aborted_kv_tokens"].sum())
    if "num_cached_tokens" in it:     # tokens the prefix cache served were not computed
        need -= int(it["num_cached_tokens"].sum())
    spec = results.info.get("speculative")
    if spec is not None:
        # A verification's accepted proposals advance a decoder beyond its one logged token.
        need -= spec["num_accepted_tokens"]
    work = int(it["num_prefill_tokens"].sum() + it["num_decode_tokens"].sum()) if len(it) else 0
    if work != need:
        raise InvariantError("work_conservation", now,
                             f"iterations computed {work} tokens, finished requests need {need}")
    if len(it) and not (it["num_seqs"] >= 1).all():
        raise InvariantError("no_empty_iterations", now, "an iteration ran no sequence")
    steps_per_token = 1 + (spec["num_speculative_tokens"] if spec is not None else 0)
    if len(done) and len(it) * steps_per_token < done["num_output_tokens"].max():
        raise InvariantError("iteration_count", now,
                             f"{len(it)} iterations for a {done['num_output_tokens'].max()}"
                             "-token output")
    groups = it.groupby("replica")["started_at"] if "replica" in it else [(0, it["started_at"])]
    if len(it) and not ((it["duration"] > 0).all()
                        and all(g.is_monotonic_increasing for _, g in groups)):
        raise InvariantError("iteration_times", now, "durations <= 0 or start times out of order "
                                                     "within a replica")
    # A disaggregated request's prefill and decode ran on two replicas (recomputation on
    # either): only the total is checked.
    # A migrated request's work, too, was done on two replicas (autoscaling's migrate).
    if "replica" in df and "replica" in it and len(it) and "prefill_replica" not in df \
            and not ("num_migrations" in df and df["num_migrations"].any()):
        _check_replica_work(df, it, now, spec,
                            dict(results.info.get("aborted_kv_tokens_by_replica", ())))


def _check_replica_work(df, it, now: float, spec: dict | None = None,
                        aborted_kv: dict | None = None) -> None:
    """Each replica computed exactly what the finished requests routed to it needed (and the
    work aborted ones lost there: ``aborted_kv``, replica -> KV tokens the aborts threw away)."""
    done = df[df["status"] == Status.FINISHED.value]
    need = (done["num_prompt_tokens"] + done["num_output_tokens"] - 1
            + done["num_recomputed_tokens"]).groupby(done["replica"]).sum()
    aborted = df[df["status"].isin(UNFINISHED)]
    if len(aborted):
        need = need.add(aborted["num_recomputed_tokens"].groupby(aborted["replica"]).sum(),
                        fill_value=0)
    if "num_aborted_kv_tokens" in df:
        lost = df[df["num_aborted_kv_tokens"] > 0]
        need = need.add(lost["num_aborted_kv_tokens"].groupby(lost["replica"]).sum(),
                        fill_value=0)
    for replica, tokens in (aborted_kv or {}).items():
        need[replica] = need.get(replica, 0) + tokens
    if "num_cached_tokens" in it:     # tokens the prefix cache served were not computed
        need = need.sub(it["num_cached_tokens"].groupby(it["replica"]).sum(), fill_value=0)
    work = (it["num_prefill_tokens"] + it["num_decode_tokens"]).groupby(it["replica"]).sum()
    if spec is not None:
        for replica, accepted in spec["per_replica_accepted"].items():
            need[replica] = need.get(replica, 0) - accepted
    for replica in set(need.index) | set(work.index):
        if int(need.get(replica, 0)) != int(work.get(replica, 0)):
            raise InvariantError("work_conservation", now,
                                 f"replica {replica} computed {int(work.get(replica, 0))} tokens, "
                                 f"the finished requests routed to it need "
                                 f"{int(need.get(replica, 0))}")
