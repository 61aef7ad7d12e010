"""Swap preemption: a victim's KV blocks move to CPU memory over PCIe instead of being dropped.

vLLM V0's ``preemption_mode="swap"``: the victim's blocks are copied to a CPU swap space of
``cache.swap_space_gib`` (if they fit; otherwise the scheduler falls back to recomputation), the
request becomes ``SWAPPED`` and keeps all its progress, and swapped requests are swapped back in,
oldest swap first, before any new request is admitted (under a preemptive policy, MLFQ, only
while they rank at least as high as the best waiting request). Transfers are charged to the iteration
that makes them: the scheduler reports the bytes on the batch (``swap_out_bytes``,
``swap_in_bytes``) and the engine adds ``bytes / (swap_bandwidth_gbps * 1e9)`` seconds.
"""

from __future__ import annotations

from simsched.request import PreemptionCause, Request, Status


class SwapSpace:
    """CPU swap space: capacity and bytes in use."""

    def __init__(self, capacity_bytes: float, bytes_per_block: float) -> None:
        if capacity_bytes < 0 or bytes_per_block < 0:
            raise ValueError(f"swap space {capacity_bytes} bytes and {bytes_per_block} bytes per "
                             "block must be >= 0")
        self.capacity_bytes = float(capacity_bytes)
        self.bytes_per_block = float(bytes_per_block)
        self.used_bytes = 0.0

    def fits(self, num_bytes: float) -> bool:
        """Whether ``num_bytes`` more bytes fit."""
        return self.used_bytes + num_bytes <= self.capacity_bytes


def swap_out(sched, victim: Request, reason: str, by: int | None) -> bool:
    """Swap ``victim`` out to CPU memory; False (nothing done) if it has no KV or space is full."""
    cached = sched.num_cached(victim)
    num_bytes = sched.kv.blocks_for(cached) * sched.swap.bytes_per_block
    if cached == 0 or not sched.swap.fits(num_bytes):
        return False
    sched._stop(victim, cached)
    victim.num_computed = cached
    victim.status = Status.SWAPPED
    victim.queued_at = sched.now
    victim.num_preemptions += 1
    victim.num_swaps += 1
    victim.swapped_bytes += num_bytes
    sched.swap.used_bytes += num_bytes
    sched.swap_out_bytes += num_bytes
    sched._swapped_new.append(victim)
    sched.preempted.append((victim, PreemptionCause(victim.id, reason, by, sched.now, 0,
                                                    mode="swap")))
    return True


def swap_in(sched) -> None:
    """Swap requests back in, oldest swap first, while sequence slots, KV blocks and budget last.

    A decoder resumes its decode run in this iteration's decode step; a request swapped out in the
    middle of its prefill continues it. If nothing else runs, the watermark is waived so a swapped
    request can always come back.
    """
    kv, cfg, swapped = sched.kv, sched.cfg, sched.swapped
    while swapped:
        req = next(iter(swapped.values()))
        if len(sched.running) >= cfg.max_num_seqs:
            return
        if sched.preemptive and sched.queue and sched.queue.ranks_below(req, sched.queue.peek()):
            return  # a preemptive policy (MLFQ) runs a better waiting request first
        decoding = req.num_computed >= req.prefill_target
        if sched.budget_left() < 1:
            return
        # A decoder's first step may start a new block: take it now (growth may have run).
        need = kv.blocks_for(req.num_computed + (1 if decoding else 0))
        if not kv.can_allocate(need, use_watermark=bool(sched.running)):
            return
        del swapped[req.id]
        num_bytes = kv.blocks_for(req.num_computed) * sched.swap.bytes_per_block
        sched.swap.used_bytes -= num_bytes
        sched.swap_in_bytes += num_bytes
        req.swapped_bytes += num_bytes
        kv.acquire(req, 0, req.num_computed)   # a prefix cache registers them again
        req.status = Status.RUNNING
        req.admitted_seq = sched.num_admitted
        sched.num_admitted += 1
        sched.running[req.id] = req
        sched.running_version += 1
        if decoding:
            sched._start_run(req, resumed=True)
        else:
            sched.prefilling[req.id] = req
            sched._continue_prefill(req)
