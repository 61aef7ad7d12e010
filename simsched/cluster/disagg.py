"""Disaggregated prefill and decode: replica pools, KV-transfer links, a request's two-stage life.

A request goes to a prefill replica (``cluster.router`` over the prefill and mixed replicas),
which runs its prefill and emits the first token (its TTFT), then stops it with the prompt's KV
still held (:meth:`~simsched.engine.scheduler.core.Scheduler.release_held`). The decode router
(``cluster.decode_router`` over the decode and mixed replicas) picks a decode replica, which
reserves KV blocks for the prompt before the transfer starts; while it cannot, the request waits
with its KV held on the prefill replica (backpressure: those blocks count as used there and can
stall its admissions). The KV then moves over a :class:`~simsched.cluster.kv_transfer.Link`;
when the transfer ends the prefill replica frees its blocks and the request joins the decode
replica's decoders at its next iteration. The gap between the first and second token therefore
includes the wait for memory, the transfer and the wait for the decode replica's next iteration.

Topology: every prefill replica has one link per GPU (its NIC, or NVLink port) shared by all
its outgoing transfers. With tensor parallelism each of the TP shards moves its own share of
the KV (``hardware.kv_bytes_per_token`` is per GPU) over its own link, all in parallel, so a
transfer takes ``shard bytes / per-GPU bandwidth + latency``. The receiving side's links are not
modelled (a decode replica fed by many prefill replicas is assumed to have the ingress to match).
Concurrent transfers on one link share its bandwidth equally (processor sharing): each of ``n``
active transfers progresses at ``bandwidth / n``, and completion times are recomputed whenever
a transfer starts or ends. The latency is paid before a transfer joins the link.

A request routed to a mixed replica is served there whole. Prompts shorter than
``cluster.disagg_min_prompt_tokens`` go straight to the decode router and are prefilled on the
decode replica itself (conditional disaggregation, as in Splitwise and vLLM's remote-prefill
threshold). With a prefix cache on the decode replica, the part of the prefix it already holds
is not sent.

With ``router = "llm-d"`` and a config holding llm-d's P/D handler, the decode replica is
picked first and the handler's decider chooses whether a prefill replica runs the prompt
(:mod:`simsched.cluster.epp.pd`) instead of ``disagg_min_prompt_tokens``.

A request no replica can hold (no prefill replica holds its prompt, no decode replica its peak
KV, no mixed replica all of it) is rejected at arrival with its reason (:meth:`Disagg.why_not`);
a router's choice of a replica that can never hold the request is overridden
(:meth:`Disagg.refit`), so a servable request is never stranded.
"""

from __future__ import annotations

import sys
from array import array

import simpy

from simsched.cluster.flow import refuse_flow_control
# The link itself lives in simsched.cluster.kv_transfer; re-exported here, where callers have
# always imported it.
from simsched.cluster.kv_transfer import Link, transfer_time
from simsched.cluster.routers import make_router
from simsched.cluster.state import ReplicaLoad, Snapshot
from simsched.cost import hardware
from simsched.engine.simpy_fast import done_event
from simsched.request import Status

FAILED = Status.FAILED

__all__ = ["Link", "Disagg", "disagg_request", "transfer_time"]


class _Pool:
    """Replicas one router chooses among, with their own load view (local indices)."""

    def __init__(self, cluster, members: list[int], router_name: str, options, rng,
                 refresh: float) -> None:
        self.members = members
        replicas = [cluster.replicas[i] for i in members]
        n = len(members)
        self.router = make_router(router_name, options, n, rng) if n > 1 else None
        needs = self.router.needs if self.router is not None else ()
        self.load = ReplicaLoad(replicas, needs, getattr(self.router, "output_tokens", None))
        self.view = Snapshot(self.load) if n > 1 and refresh > 0 else self.load

    def choose(self, req) -> tuple[int, int]:
        """(local index, replica index) for ``req``."""
        k = self.router.choose(self.view, req) if self.router is not None else 0
        return k, self.members[k]


class Disagg:
    """A disaggregated cluster's roles, pools, links and per-request transfer records."""

    def __init__(self, cluster, cl, rng) -> None:
        self.roles = cl.replica_roles()
        n = len(cluster.replicas)
        first = [i for i in range(n) if self.roles[i] != "decode"]
        second = [i for i in range(n) if self.roles[i] != "prefill"]
        self.prefill = _Pool(cluster, first, cl.router, cl.router_options, rng,
                             cl.refresh_interval)
        self.decode = _Pool(cluster, second, cl.decode_router or cl.router, cl.router_options,
                            rng, cl.refresh_interval)
        # llm-d's P/D handler: one config, its decode profile over the decode pool, then (when
        # the decider says so) its prefill profile over the prefill pool (simsched.cluster.epp.pd).
        self.pd = getattr(self.decode.router, "handler", None) if cl.router == "llm-d" else None
        if self.pd is not None:
            _pd_pools(self, cl, rng)
        self.admit = getattr(self.decode.router, "admit", None)
        refuse_flow_control(self.decode.router, "a disaggregated cluster")
        # Each replica reports its KV use to every pool it belongs to.
        for i, replica in enumerate(cluster.replicas):
            hooks = [(pool.load, pool.members.index(i)) for pool in (self.prefill, self.decode)
                     if i in pool.members]
            replica.on_kv = _kv_hook(hooks)
        bandwidth, latency = cl.link_spec()
        self.links = {i: Link(cluster.env, bandwidth, latency) for i in first
                      if self.roles[i] == "prefill"}
        self.min_prompt = cl.disagg_min_prompt_tokens
        self.down: set[int] = set()     # failed replicas (simsched.cluster.disagg_failures)
        # What each replica can ever hold (admitted once it is empty): KV tokens, and the longest
        # prompt + output it may serve (max_model_len); a decode (or whole) stage needs the
        # peak KV, prompt + output - 1 tokens, a prefill stage handing off only the prompt's.
        self.kv_tokens = [r.kv.num_blocks * r.kv.block_size for r in cluster.replicas]
        self.max_len = [r.scheduler.max_model_len or sys.maxsize for r in cluster.replicas]
        self.whole = [min(c + 1, m) for c, m in zip(self.kv_tokens, self.max_len)]
        self.decode_limit = max(self.whole[j] for j in second)
        self.kv_bytes = [hardware.kv_bytes_per_token(r.config.hardware) for r in cluster.replicas]
        self.tp = [r.config.hardware.tensor_parallel_size for r in cluster.replicas]
        m = len(cluster.requests)
        self.prefill_replica = array("i", [-1]) * m
        self.decode_replica = array("i", [-1]) * m
        self.kv_transfer_bytes = array("d", [0.0]) * m
        self.kv_transfer_time = array("d", [0.0]) * m
        self.kv_wait_time = array("d", [0.0]) * m

    def fits(self, i: int, req, handoff: bool) -> bool:
        """Whether replica ``i`` can take ``req``: its prompt (``handoff``: a prefill replica
        hands it off, so only the prompt's KV stays there, and a decode replica must take its
        peak KV) or all of it."""
        total = req.num_prompt_tokens + req.num_output_tokens
        if handoff:
            return req.num_prompt_tokens <= self.kv_tokens[i] and total <= self.max_len[i] \
                and total <= self.decode_limit
        return total <= self.whole[i]

    def refit(self, pool: "_Pool", k: int, i: int, req, first: bool) -> tuple[int, int]:
        """``(k, i)``, the router's choice, if replica ``i`` can take ``req``; else the pool's
        replica that can with the fewest outstanding requests (lowest index on ties), or
        ``(-1, -1)`` if none can.

        A router knows nothing of the replicas' sizes (as a gateway does not), and handing a
        request to one that can never hold it would strand it, so its choice is overridden.
        """
        handoff = first and req.num_output_tokens > 1
        roles, down = self.roles, self.down
        if self.fits(i, req, handoff and roles[i] == "prefill") and i not in down:
            return k, i
        outstanding = pool.view.outstanding
        able = [k for k, i in enumerate(pool.members)
                if self.fits(i, req, handoff and roles[i] == "prefill")]
        if down and able:               # all that can are down: (-2, -2)
            able = [k for k in able if pool.members[k] not in down]
            if not able:
                return -2, -2
        if not able:
            return -1, -1
        k = min(able, key=outstanding.__getitem__)
        return k, pool.members[k]

    def why_not(self, req, local: bool) -> str:
        """Why no replica can serve ``req`` (its reject reason); ``local``: a short prompt
        prefilled on a decode replica."""
        total = req.num_prompt_tokens + req.num_output_tokens
        decode = self.decode.members
        if local:
            return (f"no decode or mixed replica can serve prompt + output = {total} tokens "
                    f"(a prompt under disagg_min_prompt_tokens is served there whole): "
                    + self._limits(decode))
        prefill = [i for i in self.prefill.members if self.roles[i] == "prefill"]
        if any(req.num_prompt_tokens <= self.kv_tokens[i] and total <= self.max_len[i]
               for i in prefill):
            return (f"no decode or mixed replica can hold its peak KV of {total - 1} tokens "
                    f"(prompt + output = {total}): " + self._limits(decode))
        mixed = [i for i in self.prefill.members if self.roles[i] == "mixed"]
        reasons = []
        if prefill:
            reasons.append(f"no prefill replica can hold its {req.num_prompt_tokens}-token "
                           f"prompt within max_model_len (prompt + output = {total} tokens): "
                           + self._limits(prefill))
        if mixed:
            reasons.append(f"no mixed replica can serve prompt + output = {total} tokens: "
                           + self._limits(mixed))
        return "; ".join(reasons)

    def _limits(self, members: list[int]) -> str:
        """The largest KV cache and max_model_len among replicas ``members``, in words."""
        words = f"the largest KV cache holds {max(self.kv_tokens[i] for i in members)} tokens"
        longest = max(self.max_len[i] for i in members)
        return words + (f", the longest max_model_len is {longest}"
                        if longest < sys.maxsize else "")

    def views(self):
        """The pools' snapshots (refreshed by the cluster), if any."""
        return [p.view for p in (self.prefill, self.decode) if p.view is not p.load]

    def grow(self, n: int) -> None:
        """Make room for request ids below ``n`` (session turns created during the run)."""
        extra = n - len(self.prefill_replica)
        if extra > 0:
            self.prefill_replica.extend([-1] * extra)
            self.decode_replica.extend([-1] * extra)
            for a in (self.kv_transfer_bytes, self.kv_transfer_time, self.kv_wait_time):
                a.extend([0.0] * extra)

    def columns(self) -> dict[str, list]:
        """The per-request frame columns, by request id."""
        return {"prefill_replica": self.prefill_replica.tolist(),
                "decode_replica": self.decode_replica.tolist(),
                "kv_transfer_bytes": self.kv_transfer_bytes.tolist(),
                "kv_transfer_time": self.kv_transfer_time.tolist(),
                "kv_wait_time": self.kv_wait_time.tolist()}


ROLE_LABELS = {"prefill": "prefill", "decode": "decode", "mixed": "both"}


def _pd_pools(d: "Disagg", cl, rng) -> None:
    """Give the pools llm-d P/D routers: the decode profile's (even for a pool of one, whose
    prefix match the decider reads) and its prefill-profile sibling, sharing the plugins. The
    replicas are labelled with their roles (``llm-d.ai/role``: prefill, decode, both) over any
    ``labels`` option (one mapping per cluster replica)."""
    if cl.decode_router not in (None, "llm-d"):
        raise ValueError(f"cluster.decode_router {cl.decode_router!r}: llm-d's P/D handler "
                         "picks the decode replica itself (leave decode_router unset)")
    if cl.disagg_min_prompt_tokens:
        raise ValueError("cluster.disagg_min_prompt_tokens: with llm-d's P/D handler its decider "
                         "decides which prompts are disaggregated (set nonCachedTokens instead)")
    decode = d.decode.router
    if decode is None:
        decode = make_router("llm-d", cl.router_options, 1, rng)
        d.decode.router = decode
    given = decode.labels or ()
    for pool, router in ((d.decode, decode),
                         (d.prefill, decode.sibling(decode.handler.prefill_profile,
                                                    len(d.prefill.members)))):
        router.labels = tuple({**(given[i] if i < len(given) else {}),
                               "llm-d.ai/role": ROLE_LABELS[d.roles[i]]} for i in pool.members)
        pool.router = router
    d.prefill.router.needs = d.decode.router.needs


def _pd_choose(d: "Disagg", req):
    """llm-d's P/D decision for ``req``: ``(local, (k, i), decode choice or None)``."""
    kd = d.decode.router.choose(d.decode.view, req)
    blocks, size = d.decode.router.matched_blocks(kd)
    if d.pd.run_prefill(req.num_prompt_tokens, blocks, size):
        return False, d.prefill.choose(req), (kd, d.decode.members[kd])
    return True, (kd, d.decode.members[kd]), None


def _kv_hook(hooks):
    def on_kv(_index, num_used, num_blocks):
        for load, k in hooks:
            load.kv_changed(k, num_used, num_blocks)
    return on_kv


def _wait(cluster, req, event):
    """Wait for ``event``, recording preemption interrupts as the routed path does."""
    while True:
        try:
            yield event
            cluster.num_events += 1
            return
        except simpy.Interrupt as interrupt:
            cluster.preempted(req, interrupt)


def _no_replica_up(req, now: float) -> None:
    """Fail ``req``: every replica that could take it (or its decode stage) is down at ``now``."""
    req.status, req.reject_reason = FAILED, f"failed: no replica up at t={now:g} s"


def disagg_request(cluster, req, process=None, done=None):
    """A request's life in a disaggregated cluster (a SimPy process; ``process`` and ``done``
    as for :meth:`~simsched.cluster.cluster.Cluster._request`)."""
    env, d = cluster.env, cluster.disagg
    cluster.num_arrived += 1
    owners = cluster.replica_of
    if req.id >= len(owners):           # a session turn created after the run started
        owners.extend([-1] * (req.id + 1 - len(owners)))
        d.grow(req.id + 1)
    if cluster.rate_limited(req):
        return
    if d.admit is not None:             # a router's own admission control (llm-d's)
        why = d.admit(d.decode.view, req)
        if why is not None:
            cluster._shed(req, why)
            return
    planned = None
    if d.pd is None:
        local = req.num_prompt_tokens < d.min_prompt
        pool = d.decode if local else d.prefill
        k, i = d.refit(pool, *pool.choose(req), req, first=not local)
    else:                               # llm-d: decode first, prefill if the decider says so
        local, choice, planned = _pd_choose(d, req)
        pool = d.decode if local else d.prefill
        k, i = d.refit(pool, *choice, req, first=not local)
    if i < 0:
        if i == -2:     # every replica that could take it is down (disagg_failures)
            _no_replica_up(req, env.now)
        else:
            cluster.reject(req, d.why_not(req, local))
        return
    replica = cluster.replicas[i]
    if cluster.queue_full(req, i):
        return
    owners[req.id] = i
    d.prefill_replica[req.id] = i
    handoff = d.roles[i] == "prefill" and req.num_output_tokens > 1
    if handoff:
        replica.scheduler.handoff.add(req.id)
    if done is None:
        process, done = env.active_process, done_event(env)
    first = env.event()
    if not replica.add(req, (process, first, done), env.now):
        replica.scheduler.handoff.discard(req.id)
        return
    pool.load.routed(k, req)
    yield from _wait(cluster, req, first)
    # (A request whose replica failed ends there: simsched.cluster.disagg_failures.)
    if req.status is FAILED:
        pool.load.aborted(k, req)
        return
    pool.load.first_token(k, req)
    if not handoff:
        d.decode_replica[req.id] = i
        yield from _wait(cluster, req, done)
        pool.load.finished(k, req)
        return
    # Handed off: the prefill replica holds the prompt's KV until the transfer ends.
    pool.load.finished(k, req)
    kd, j = d.refit(d.decode, *(planned or d.decode.choose(req)), req, first=False)
    if j < 0:                   # every decode replica that could take it is down
        cluster.failures.num_aborted_kv_tokens += req.num_computed_tokens
        replica.release(req)
        _no_replica_up(req, env.now)
        return
    target = cluster.replicas[j]
    d.decode_replica[req.id] = j
    d.decode.load.routed(kd, req)
    d.decode.load.first_token(kd, req)
    asked = env.now
    while True:
        cached = target.scheduler.reserve(req)
        if cached is not None:
            break
        wake = env.event()
        target.kv_waiters.append(wake)
        yield wake
        if req.status is FAILED:
            d.decode.load.aborted(kd, req)
            return
    d.kv_wait_time[req.id] = env.now - asked
    shard_bytes = (req.num_computed_tokens - cached) * d.kv_bytes[i]
    d.kv_transfer_bytes[req.id] = shard_bytes * d.tp[i]
    started = env.now
    faults = cluster.link_faults
    if faults is None:
        arrived = (yield d.links[i].transfer(shard_bytes)) is not False
    else:   # degraded links (simsched.cluster.links): retried, or recomputed on the target
        arrived = yield from faults.move(req, i, j, shard_bytes, d.kv_transfer_bytes[req.id])
    d.kv_transfer_time[req.id] = env.now - started
    if req.status is FAILED:
        d.decode.load.aborted(kd, req)
        return
    replica.release(req)
    owners[req.id] = j
    if arrived:
        target.receive(req, (process, first, done))
    else:
        target.recompute(req, (process, first, done), cached, env.now)
    yield from _wait(cluster, req, done)
    d.decode.load.finished(kd, req)     # (finished or failed: off its figures alike)
