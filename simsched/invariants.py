"""Invariants of a run, checked after every iteration when ``check_invariants`` is on."""

from __future__ import annotations

from simsched.request import Status


class InvariantError(AssertionError):
    """An invariant of the simulation does not hold; names the invariant, request and time."""

    def __init__(self, name: str, now: float, detail: str, request_id: int | None = None) -> None:
        who = f" request {request_id}" if request_id is not None else ""
        super().__init__(f"invariant '{name}' violated at t={now:.6f}{who}: {detail}")
        self.invariant = name
        self.request_id = request_id
        self.at = now


def check_invariants(engine, batch) -> None:
    """Verify KV accounting, budgets, membership and per-request progress; raise InvariantError."""
    sched, kv, now = engine.scheduler, engine.kv, engine.env.now
    cfg = sched.cfg
    held = kv.holders()
    if kv.num_free < 0 or kv.num_free + sum(held.values()) != kv.num_blocks:
        raise InvariantError("kv_conservation", now,
                             f"free {kv.num_free} + held {sum(held.values())} != {kv.num_blocks}")
    if batch.num_tokens > cfg.max_num_batched_tokens and len(batch.prefill_new_tokens) != 1:
        raise InvariantError("token_budget", now,
                             f"{batch.num_tokens} tokens > {cfg.max_num_batched_tokens}")
    if len(sched.running) > cfg.max_num_seqs:
        raise InvariantError("max_num_seqs", now,
                             f"{len(sched.running)} running > {cfg.max_num_seqs}")
    waiting_ids = [r.id for r in sched.queue] + [r.id for r in sched._requeue]
    if len(waiting_ids) != len(set(waiting_ids)):
        raise InvariantError("unique_waiting", now, "a request is queued twice")
    both = set(waiting_ids) & set(sched.running)
    if both:
        rid = min(both)
        raise InvariantError("waiting_xor_running", now, "request both waiting and running", rid)
    for rid in held:
        if rid not in sched.running:
            raise InvariantError("kv_leak", now, f"holds {held[rid]} blocks but is not running",
                                 rid)
    for rid, req in sched.running.items():
        if req.status is not Status.RUNNING:
            raise InvariantError("running_status", now, f"status {req.status.value}", rid)
        cached = sched.num_cached(req)
        if kv.num_held(rid) != kv.blocks_for(cached):
            raise InvariantError("kv_exact_blocks", now,
                                 f"holds {kv.num_held(rid)} blocks for {cached} cached tokens", rid)
        generated = sched.num_generated(req)
        if not 0 <= generated < req.num_output_tokens:
            raise InvariantError("generated_within_target", now,
                                 f"{generated} generated of {req.num_output_tokens}", rid)
    counts = {s: 0 for s in Status}
    for req in engine.requests[:engine.num_arrived]:
        counts[req.status] += 1
        if req.status is Status.FINISHED and req.num_generated != req.num_output_tokens:
            raise InvariantError("finished_complete", now,
                                 f"finished with {req.num_generated}/{req.num_output_tokens}",
                                 req.id)
        times = (req.arrival_at, req.first_scheduled_at, req.first_token_at, req.finished_at)
        seen = [t for t in times if t == t]
        if any(b < a for a, b in zip(seen, seen[1:])):
            raise InvariantError("monotone_timestamps", now, f"timestamps {times}", req.id)
    accounted = (counts[Status.WAITING] + counts[Status.RUNNING] + counts[Status.SWAPPED]
                 + counts[Status.FINISHED] + counts[Status.REJECTED])
    if accounted != engine.num_arrived or counts[Status.WAITING] != len(waiting_ids) \
            or counts[Status.RUNNING] != len(sched.running):
        raise InvariantError("nothing_lost", now,
                             f"arrived {engine.num_arrived}, statuses {counts}, "
                             f"queue {len(waiting_ids)}, running {len(sched.running)}")
