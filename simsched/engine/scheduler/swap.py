"""Swap preemption's CPU swap space: where a victim's KV blocks go instead of being dropped.

vLLM V0's ``preemption_mode="swap"``: the victim's blocks are copied to a CPU swap space of
``cache.swap_space_gib`` (if they fit; otherwise the scheduler falls back to recomputation), the
request becomes ``SWAPPED`` and keeps all its progress, and swapped requests are swapped back in,
oldest swap first, before any new request is admitted (under a preemptive policy, MLFQ, only
while they rank at least as high as the best waiting request). Transfers are charged to the
iteration that makes them: the scheduler reports the bytes on the batch (``swap_out_bytes``,
``swap_in_bytes``) and the engine adds ``bytes / (swap_bandwidth_gbps * 1e9)`` seconds.

:class:`SwapSpace` keeps the bytes and the swapped-out requests; the scheduler decides who goes
and who comes back (``PreemptionMixin._swap_out``, ``AdmissionMixin._swap_in``) and moves the
request between its own states.
"""

from __future__ import annotations

from simsched.request import Request


class SwapSpace:
    """CPU swap space: capacity, bytes in use and the swapped-out requests, oldest swap first.

    A request swapped out in an iteration (:meth:`swap_out`) may be swapped back in from the
    next one on, once the scheduler has filed the iteration's victims (:meth:`settle`).
    """

    __slots__ = ("capacity_bytes", "bytes_per_block", "used_bytes", "swapped", "_new")

    def __init__(self, capacity_bytes: float, bytes_per_block: float) -> None:
        if capacity_bytes < 0 or bytes_per_block < 0:
            raise ValueError(f"swap space {capacity_bytes} bytes and {bytes_per_block} bytes per "
                             "block must be >= 0")
        self.capacity_bytes = float(capacity_bytes)
        self.bytes_per_block = float(bytes_per_block)
        self.used_bytes = 0.0
        self.swapped: dict[int, Request] = {}     # swapped out, oldest swap first
        self._new: list[Request] = []             # swapped out in this iteration

    def fits(self, num_blocks: int) -> bool:
        """Whether ``num_blocks`` more KV blocks fit."""
        return self.used_bytes + num_blocks * self.bytes_per_block <= self.capacity_bytes

    def swap_out(self, req: Request, num_blocks: int) -> float:
        """Take ``req``'s ``num_blocks`` KV blocks (they fit); return the bytes moved."""
        num_bytes = num_blocks * self.bytes_per_block
        req.num_swaps += 1
        req.swapped_bytes += num_bytes
        self.used_bytes += num_bytes
        self._new.append(req)
        return num_bytes

    def settle(self) -> None:
        """File this iteration's swapped-out requests: they may come back from now on."""
        swapped = self.swapped
        for req in self._new:
            swapped[req.id] = req
        self._new.clear()

    def swap_in(self, req: Request, num_blocks: int) -> float:
        """Give back swapped-out ``req``'s ``num_blocks`` blocks; the bytes moved."""
        del self.swapped[req.id]
        num_bytes = num_blocks * self.bytes_per_block
        self.used_bytes -= num_bytes
        req.swapped_bytes += num_bytes
        return num_bytes
