"""Invariants of a run: per-iteration state checks and end-of-run checks.

:func:`check_invariants` runs after every iteration when ``config.check_invariants`` is on;
:func:`check_final_state` is for tests and fuzzing, after a run, as is
:func:`~simsched.engine.result_checks.check_results` (the result frames).
Each violation raises :class:`InvariantError` naming the invariant, the request and the time.
"""

from __future__ import annotations

import math

from simsched.request import Status

_OPEN = (Status.WAITING, Status.RUNNING, Status.SWAPPED)
_CLOSED = (Status.FINISHED, Status.REJECTED, Status.ABORTED, Status.TIMED_OUT, Status.CANCELLED,
           Status.FAILED)


class InvariantError(AssertionError):
    """An invariant of the simulation does not hold; names the invariant, request and time."""

    def __init__(self, name: str, now: float, detail: str, request_id: int | None = None) -> None:
        # All fields go into args: SimPy re-raises a process's exception as a copy built from
        # type(exc)(*exc.args), and the copy must keep the invariant's name.
        super().__init__(name, now, detail, request_id)
        self.invariant = name
        self.request_id = request_id
        self.at = now
        self.detail = detail

    def __str__(self) -> str:
        who = f" request {self.request_id}" if self.request_id is not None else ""
        return f"invariant '{self.invariant}' violated at t={self.at:.6f}{who}: {self.detail}"


def _swapped(sched) -> dict:
    """Requests swapped out to CPU memory, if the scheduler supports swap preemption."""
    swapped = getattr(sched, "swapped", None)
    if swapped is None:
        return {}
    if isinstance(swapped, dict):
        return swapped
    return {r.id: r for r in swapped}


def check_invariants(cluster, replica, batch) -> None:
    """Verify KV accounting, budgets, membership and per-request progress; raise InvariantError.

    ``replica`` just ran ``batch``; its KV cache, budgets and members are checked, and every
    arrived request of ``cluster`` is checked against the collections of all replicas.
    """
    now = cluster.env.now
    _check_kv_and_batch(replica.scheduler, replica.kv, batch, now)
    waiting_ids = []
    for other in cluster.replicas:
        # Another replica may be mid-iteration (blocks allocated for a batch not yet
        # committed): only its membership is checked now, its KV at its own commits.
        waiting_ids += _check_membership(other.scheduler, other.kv, now,
                                         exact=other is replica)
        # Async scheduling: arrivals the next plan cannot see yet are waiting too.
        waiting_ids += [req.id for _, req in getattr(other, "pending", ())]
    # Requests migrating from a removed replica (autoscaling) wait between replicas.
    remover = getattr(getattr(cluster, "fleet", None), "remover", None)
    if remover is not None:
        waiting_ids += list(remover.in_transit)
    _check_requests(cluster, [r.scheduler for r in cluster.replicas], waiting_ids, now)


def _check_kv_and_batch(sched, kv, batch, now: float) -> None:
    cfg = sched.cfg
    held = kv.holders()
    if kv.prefix_caching:       # its own structure (segments, reference counts, LRU) too
        _check_prefix_cache(sched, kv, held, now)
        tiers = getattr(kv, "tier_inconsistency", None)
        if tiers is not None:   # a tiered cache: each tier's books, blocks offered down
            problem = tiers()
            if problem:
                raise InvariantError("kv_tiers", now, problem)
    elif kv.num_free < 0 or kv.num_free + sum(held.values()) != kv.num_blocks:
        raise InvariantError("kv_conservation", now,
                             f"free {kv.num_free} + held {sum(held.values())} != {kv.num_blocks}")
    for rid, n in held.items():
        if n < 1:
            raise InvariantError("kv_conservation", now, f"holds {n} blocks", rid)
    # Only an unchunked prompt longer than the budget may exceed it, and then it runs alone.
    lone_prefill = (not sched.chunking and len(batch.prefill_new_tokens) == 1
                    and batch.num_decode_seqs == 0)
    # Another engine may bound its batches otherwise (SGLang without chunking: its
    # max_prefill_tokens).
    limit = getattr(sched, "batch_token_limit", cfg.max_num_batched_tokens)
    if batch.num_tokens > limit and not lone_prefill:
        raise InvariantError("token_budget", now,
                             f"{batch.num_tokens} tokens > {limit}: {batch!r}")
    if batch.num_seqs > cfg.max_num_seqs or len(sched.running) > cfg.max_num_seqs:
        raise InvariantError("max_num_seqs", now,
                             f"batch of {batch.num_seqs}, {len(sched.running)} running > "
                             f"{cfg.max_num_seqs}")
    if cfg.max_num_prefills is not None and len(batch.prefill_new_tokens) > cfg.max_num_prefills:
        raise InvariantError("max_num_prefills", now,
                             f"{len(batch.prefill_new_tokens)} prefills > {cfg.max_num_prefills}")
    if any(n < 1 for n in batch.prefill_new_tokens) or batch.num_decode_seqs < 0:
        raise InvariantError("batch_shape", now, f"empty prefill chunk or negative decodes: "
                                                 f"{batch!r}")


def _check_prefix_cache(sched, kv, held: dict, now: float) -> None:
    """Reference counts, the evictable pool and block conservation of a prefix cache."""
    if not hasattr(kv, "nodes"):        # a block-by-block pool (block_pool.py) checks its books
        problem = kv.inconsistency(held)
        if problem:
            raise InvariantError("kv_conservation", now, problem)
        return
    nodes = kv.nodes()
    registered = kv.registered()
    expected: dict = {}
    private = 0
    for rid, n in held.items():
        reg = registered.get(rid, (0,))[0]
        if not 0 <= reg <= n:
            raise InvariantError("prefix_refcount", now, f"{reg} registered of {n} held", rid)
        private += n - reg
    transfer = _transfer_ids(sched)
    for rid, (reg, keys, los, his) in registered.items():
        if rid not in sched.running and rid not in transfer:
            raise InvariantError("kv_leak", now, "references cached blocks but is not running",
                                 rid)
        for key, lo, hi in zip(keys, los, his):
            if lo >= reg:
                break
            reach = expected.setdefault(key, {})
            r = min(hi, reg) - lo
            reach[r] = reach.get(r, 0) + 1
    referenced = evictable = 0
    for key, (num_cached, max_reach, reach, runs) in nodes.items():
        # A block's reference count is the number of running requests reaching past it.
        if reach != expected.get(key, {}):
            raise InvariantError("prefix_refcount", now,
                                 f"segment {key}: holders by reach {reach}, running requests "
                                 f"{expected.get(key, {})}")
        if max_reach != max(reach, default=0) or not 0 < num_cached or max_reach > num_cached:
            raise InvariantError("prefix_refcount", now, f"segment {key}: {num_cached} cached, "
                                                         f"referenced up to {max_reach}")
        # Evictable runs tile [max_reach, num_cached), deepest first: none is referenced.
        edge = num_cached
        for lo, hi in runs:
            if hi != edge or not lo < hi:
                raise InvariantError("prefix_evictable_unreferenced", now,
                                     f"segment {key}: runs {runs} do not tile "
                                     f"[{max_reach}, {num_cached})")
            edge = lo
        if edge != max_reach:
            raise InvariantError("prefix_evictable_unreferenced", now,
                                 f"segment {key}: runs {runs} do not tile "
                                 f"[{max_reach}, {num_cached})")
        referenced += max_reach
        evictable += num_cached - max_reach
    missing = set(expected) - set(nodes)
    if missing:
        raise InvariantError("prefix_refcount", now, f"held segments not cached: {missing}")
    lru = kv.lru_runs()
    if evictable != kv.num_evictable or sum(hi - lo for _, lo, hi in lru) != evictable:
        raise InvariantError("prefix_evictable_unreferenced", now,
                             f"evictable: {kv.num_evictable} counted, {evictable} in segments, "
                             f"{sum(hi - lo for _, lo, hi in lru)} queued")
    empty = kv.num_free - kv.num_evictable
    if empty < 0 or referenced + private + kv.num_evictable + empty != kv.num_blocks:
        raise InvariantError("kv_conservation", now,
                             f"used {referenced} shared + {private} private, evictable "
                             f"{kv.num_evictable}, empty {empty} != {kv.num_blocks} blocks")


def _check_membership(sched, kv, now: float, exact: bool = True) -> list[int]:
    # plan_ahead: arrivals not yet seen by a plan are waiting too.
    waiting_ids = [r.id for r in sched.queue] + [r.id for r in sched._requeue] \
        + [r.id for r in sched._unseen]
    if len(waiting_ids) != len(set(waiting_ids)):
        dup = min(i for i in waiting_ids if waiting_ids.count(i) > 1)
        raise InvariantError("unique_waiting", now, "request queued twice", dup)
    swapped = _swapped(sched)
    for name, group in (("waiting_xor_running", set(sched.running)),
                        ("waiting_xor_swapped", set(swapped))):
        both = set(waiting_ids) & group
        if both:
            raise InvariantError(name, now, "request in two states at once", min(both))
    both = set(sched.running) & set(swapped)
    if both:
        raise InvariantError("running_xor_swapped", now, "request in two states", min(both))
    held = kv.holders()
    transfer = _transfer_ids(sched)
    for rid in held:
        if rid not in sched.running and rid not in transfer:
            raise InvariantError("kv_leak", now, f"holds {held[rid]} blocks but is not running",
                                 rid)
    # A request whose KV waits for (or is in) a transfer holds exactly its prompt's blocks.
    for group in (getattr(sched, "held", {}), getattr(sched, "incoming", {})):
        for rid, req in group.items():
            if rid in sched.running or kv.num_held(rid) != kv.blocks_for(req.num_computed_tokens):
                raise InvariantError("kv_transfer_blocks", now,
                                     f"holds {kv.num_held(rid)} blocks for "
                                     f"{req.num_computed_tokens} tokens in transfer (running: "
                                     f"{rid in sched.running})", rid)
    zombies = {r.id for r in sched._zombies}
    spec_k = getattr(sched, "_k", 0)
    for rid, req in sched.running.items():
        if req.status is not Status.RUNNING:
            # plan_ahead: finished in the last batch, its blocks held until the next plan.
            if rid in zombies and req.status is Status.FINISHED \
                    and kv.num_held(rid) == kv.blocks_for(req.num_prompt_tokens
                                                          + req.num_output_tokens - 1):
                continue
            raise InvariantError("running_status", now, f"status {req.status.value}", rid)
        if not exact:
            continue
        cached = sched.num_cached(req)
        held_blocks = kv.num_held(rid)
        # Speculation: a verification's rejected slots stay the request's (as in vLLM), so it
        # may hold the blocks of up to K tokens more (no step grants more than 1 + K).
        if not kv.blocks_for(cached) <= held_blocks <= kv.blocks_for(cached + spec_k):
            raise InvariantError("kv_exact_blocks", now,
                                 f"holds {held_blocks} blocks for {cached} cached tokens", rid)
        generated = sched.num_generated(req)
        if not 0 <= generated < req.num_output_tokens:
            raise InvariantError("generated_within_target", now,
                                 f"{generated} generated of {req.num_output_tokens}", rid)
    return waiting_ids


def _transfer_ids(sched) -> set:
    """Requests not running here whose KV blocks are held here for a KV transfer."""
    held, incoming = getattr(sched, "held", None), getattr(sched, "incoming", None)
    if not held and not incoming:
        return set()
    return set(held) | set(incoming)


def _check_one_place(scheds: list, now: float) -> None:
    """No request is queued, running, swapped or holding KV for a transfer on two replicas; a
    decode replica's reservation matches a request held on another replica or one arrived."""
    seen: dict = {}
    held_anywhere: set = set()
    for k, sched in enumerate(scheds):
        ids = (list(sched.running) + [r.id for r in sched.queue] + [r.id for r in sched._requeue]
               + list(_swapped(sched)) + list(getattr(sched, "held", ())))
        held_anywhere.update(getattr(sched, "held", ()))
        for rid in ids:
            if seen.setdefault(rid, k) != k:
                raise InvariantError("one_replica", now,
                                     f"on replicas {seen[rid]} and {k} at once", rid)
    for sched in scheds:
        ready = {r.id for r in getattr(sched, "ready", ())}
        for rid in getattr(sched, "incoming", ()):
            if (rid in held_anywhere) == (rid in ready) or rid in sched.held:
                raise InvariantError("one_replica", now, "KV reserved for a transfer that is "
                                     "neither in flight nor arrived", rid)


def _check_requests(engine, scheds: list, waiting_ids: list[int], now: float) -> None:
    counts = {s: 0 for s in Status}
    running: dict = {}
    swapped: dict = {}
    transfers = False
    for sched in scheds:
        running.update(sched.running)
        swapped.update(_swapped(sched))
        if getattr(sched, "held", None) or getattr(sched, "incoming", None):
            transfers = True
            running.update(sched.held)
            # An arrived request waiting to join the decoders is still running (between GPUs).
            running.update({r.id: r for r in sched.ready})
    if transfers or len(scheds) > 1:
        _check_one_place(scheds, now)
    members = {Status.WAITING: set(waiting_ids), Status.RUNNING: running,
               Status.SWAPPED: swapped}
    arrived, unsent = _arrived(engine)
    for req in arrived:
        counts[req.status] += 1
        if req.status in members and req.id not in members[req.status]:
            raise InvariantError("nothing_lost", now,
                                 f"status {req.status.value} but not in that collection", req.id)
        if req.status is Status.PENDING:
            raise InvariantError("nothing_lost", now, "arrived but never queued", req.id)
        _check_timestamps(req, now)
        if req.status is Status.FINISHED and req.num_generated != req.num_output_tokens:
            raise InvariantError("finished_complete", now,
                                 f"finished with {req.num_generated}/{req.num_output_tokens}",
                                 req.id)
        if req.status is Status.WAITING and not 0 <= req.num_generated < req.num_output_tokens:
            raise InvariantError("generated_within_target", now,
                                 f"waiting with {req.num_generated}/{req.num_output_tokens}",
                                 req.id)
        if not 0 <= req.num_cached_tokens <= max(0, req.num_prompt_tokens - 1):
            raise InvariantError("prefix_cached_le_prompt", now,
                                 f"{req.num_cached_tokens} cached of a "
                                 f"{req.num_prompt_tokens}-token prompt", req.id)
        if req.status is Status.REJECTED and not req.reject_reason:
            raise InvariantError("rejected_has_reason", now, "rejected without a reason", req.id)
    for req in unsent:
        if req.status is not Status.PENDING:
            raise InvariantError("nothing_lost", now,
                                 f"not arrived but status {req.status.value}", req.id)
    accounted = sum(counts[s] for s in _OPEN + _CLOSED)
    if len(arrived) != engine.num_arrived:
        raise InvariantError("nothing_lost", now, f"{engine.num_arrived} arrivals counted, "
                             f"{len(arrived)} requests sent")
    # plan_ahead: finished requests whose blocks wait for the next plan are in running.
    num_zombies = sum(len(sched._zombies) for sched in scheds)
    if accounted != engine.num_arrived or counts[Status.WAITING] != len(waiting_ids) \
            or counts[Status.RUNNING] != len(running) - num_zombies \
            or counts[Status.SWAPPED] != len(swapped):
        raise InvariantError("nothing_lost", now,
                             f"arrived {engine.num_arrived}, statuses "
                             f"{ {s.value: n for s, n in counts.items() if n} }, "
                             f"queue {len(waiting_ids)}, running {len(running)}")


def _arrived(engine) -> tuple[list, list]:
    """The requests that have arrived and those still to come. With client retries
    (simsched.cluster.retries) the list holds the workload's requests, which arrive in order,
    then every retry or hedge, appended as it is sent."""
    requests, clients = engine.requests, getattr(engine, "clients", None)
    if clients is None:
        return requests[:engine.num_arrived], requests[engine.num_arrived:]
    n0 = clients.num_given
    first = min(clients.num_first, n0)
    return requests[:first] + requests[n0:], requests[first:n0]


def _check_timestamps(req, now: float) -> None:
    times = (req.arrival_at, req.first_scheduled_at, req.first_token_at, req.finished_at)
    seen = [t for t in times if t == t]
    if any(b < a for a, b in zip(seen, seen[1:])) or (seen and seen[-1] > now):
        raise InvariantError("monotone_timestamps", now,
                             "arrival <= first scheduled <= first token <= finished <= now "
                             f"fails: {times}", req.id)


def check_final_state(engine) -> None:
    """After a run without a time limit: nothing waits or runs and every KV cache is all free."""
    now = engine.env.now
    for replica in engine.replicas:
        sched, kv = replica.scheduler, replica.kv
        if sched.has_work() or _swapped(sched) or getattr(replica, "pending", None):
            raise InvariantError("drained", now, f"replica {replica.index}: "
                                                 f"{len(sched.running)} running, "
                                                 f"{sched.num_waiting} waiting at the end")
        if kv.num_free != kv.num_blocks or kv.holders() or kv.registered():
            raise InvariantError("kv_all_free", now,
                                 f"replica {replica.index}: {kv.num_free} of {kv.num_blocks} "
                                 f"blocks free, held {kv.holders()}")
    if engine.num_arrived != len(engine.requests):
        raise InvariantError("nothing_lost", now,
                             f"{engine.num_arrived} of {len(engine.requests)} requests arrived")
    for req in engine.requests:
        if req.status not in _CLOSED:
            raise InvariantError("drained", now, f"ends {req.status.value}", req.id)

