"""Disaggregated prefill/decode on one replica, as methods the scheduler inherits.

A prefill replica hands a request off after its prefill (:meth:`HandoffMixin._hand_off`): it
leaves the batch but its KV blocks stay held until the transfer ends (``release_held``). A decode
replica reserves blocks for the incoming KV (``reserve``), and once it has arrived (``arrive``)
the request joins the decoders at the next iteration. The transfers themselves are SimPy
processes of :mod:`simsched.cluster.disagg`.
"""

from __future__ import annotations

from simsched.engine.scheduler.preemption import recompute_from_start
from simsched.request import Request


class HandoffMixin:
    """KV hand-off and reception for :class:`~simsched.engine.scheduler.core.Scheduler`.

    The scheduler owns the state. This part reads ``cfg``, ``kv``, ``max_model_len`` and
    ``_max_total`` (whether a handed-off prompt fits); it changes ``running``,
    ``running_version``, ``num_admitted`` and its own ``handoff``, ``held``, ``incoming`` and
    ``ready``. It calls down into decode (``_start_run``) only.
    """

    __slots__ = ()

    def _hand_off(self, req: Request) -> None:
        """Stop ``req`` after its prefill: it leaves the batch but its KV blocks stay held."""
        self.handoff.discard(req.id)
        del self.running[req.id]
        self.running_version += 1
        self.held[req.id] = req

    def _held_fits(self, req: Request, total: int) -> bool:
        """Whether ``req`` (``total`` tokens with its output), to be handed off after its prefill,
        fits here: only its prompt's KV is ever held, within ``max_model_len``."""
        return req.id in self.handoff and req.num_prompt_tokens < self._max_total \
            and (self.max_model_len is None or total <= self.max_model_len)

    def release_held(self, req: Request) -> int:
        """Free a handed-off request's KV blocks (its transfer ended); return how many."""
        del self.held[req.id]
        return self.kv.free(req.id, req.num_computed_tokens)

    def reserve(self, req: Request) -> int | None:
        """Reserve KV blocks for ``req``'s incoming prompt KV; the cached prefix tokens or None.

        With a prefix cache the cached part of the prefix is reused (only the rest is sent).
        None: not enough free blocks now (beyond the watermark while requests run).
        """
        kv = self.kv
        num_tokens = req.num_computed_tokens
        cached, hit, evictable = kv.match(req)
        need = kv.blocks_for(num_tokens) - hit + evictable
        if not kv.can_allocate(need, use_watermark=bool(self.running)):
            return None
        kv.acquire(req, hit, num_tokens)
        self.incoming[req.id] = req
        return cached

    def drop_incoming(self, req: Request, cached: int) -> None:
        """Free the blocks reserved for ``req``'s KV, which will not arrive (its transfer
        failed), keeping the ``cached`` prefix tokens it matched in a prefix cache, and make it
        recompute what it had: its prompt and the tokens it generated, as a recompute
        preemption does (the dropped KV counts in ``num_recomputed_tokens``)."""
        self.drop_reservation(req, cached)
        recompute_from_start(req, req.num_generated, req.num_computed_tokens)

    def drop_reservation(self, req: Request, cached: int = 0) -> None:
        """Free the blocks reserved for ``req``'s KV, which will not arrive here (or has
        arrived and is lost), keeping the ``cached`` prefix tokens it matched in a prefix
        cache."""
        del self.incoming[req.id]
        self.kv.free(req.id, cached)

    def arrive(self, req: Request) -> None:
        """``req``'s KV has arrived: it joins the decoders at the next iteration."""
        self.ready.append(req)

    def _insert_ready(self) -> None:
        ready, running = self.ready, self.running
        while ready and len(running) < self.cfg.max_num_seqs:
            req = ready.pop(0)
            del self.incoming[req.id]
            req.admitted_seq = self.num_admitted
            self.num_admitted += 1
            running[req.id] = req
            self.running_version += 1
            self._start_run(req)
