"""Binding a queue policy to a scheduler: its hooks, and the fast paths its type allows.

The scheduler asks its waiting queue through :class:`~simsched.policies.base.QueuePolicy`. Most
policies leave most hooks at their defaults, and the plain :class:`~simsched.policies.queues.
HeapQueue` keeps its order between pushes and pops; :func:`bind_queue` notes once which hooks a
policy really has and which shortcuts its type permits, so the scheduler's hot path tests a flag
instead of calling a hook that does nothing. The scheduler calls it whenever its queue is set and
assigns the fields it returns.
"""

from __future__ import annotations

from simsched.policies.base import QueuePolicy, check_queue
from simsched.policies.queues import HeapQueue


def bind_queue(sched, queue: QueuePolicy) -> tuple:
    """Bind ``queue`` to ``sched`` (checked first) and return the scheduler's fields that follow
    from it, in this order: the queue itself (``_queue``); the time and refresh hooks to call
    (``_note_time``, ``_queue_update``, ``_queue_refresh``, ``_queue_hooks``); preemption by rank
    (``preemptive``, ``_may_preempt``, ``_static_ranks``, ``_memo_failed``); the policy's
    ``meter``; and the shortcuts of a plain ``HeapQueue`` (``_fixed_order``, ``_waiting``,
    ``_forget``). The scheduler assigns them itself: it stays the one owner of its fields."""
    check_queue(queue)
    queue_type = type(queue)
    queue.bind(sched)
    # The policy's hooks (see QueuePolicy): those left at their defaults are never called.
    # HeapQueue.update only notes the time, which only max_wait promotion reads: set it (no
    # call) when there is a max_wait, else skip it.
    heap_update = queue_type.update is HeapQueue.update
    note_time = heap_update and queue.max_wait is not None
    update = None if heap_update or queue_type.update is QueuePolicy.update else queue.update
    refresh = None if queue_type.refresh is QueuePolicy.refresh else queue.refresh
    hooks = bool(note_time or update is not None or refresh is not None)
    # A policy may refuse an admission preemption its ranks would allow (storm guards); without
    # its own rule the scan asks ranks_below directly.
    may_preempt = None if queue_type.may_preempt is QueuePolicy.may_preempt \
        else queue.may_preempt
    # With fixed ranks a failed admission preemption fails again until the running set changes
    # (free + freeable blocks can only shrink meanwhile): remember it, skip the scan (and
    # compare the keys inline: only a policy without its own preemption rule).
    static_ranks = refresh is None and not queue.dynamic_ranks and may_preempt is None
    # Running requests whose ranks can only improve (SJF: remaining work shrinks) keep a failed
    # admission scan failed until the running set changes, as fixed ranks do.
    memo_failed = static_ranks or bool(queue.ranks_only_improve)
    # A plain HeapQueue without max_wait keeps its order between pushes and pops.
    fixed_order = queue_type is HeapQueue and queue.max_wait is None
    # A HeapQueue is as long as its live dict: len() of that is a C call on the hot path.
    waiting = queue._live if queue_type.__len__ is HeapQueue.__len__ else queue
    # HeapQueue.pop() is peek() then forgetting the entry: having peeked, forget it only.
    forget = queue._live if queue_type.pop is HeapQueue.pop \
        and queue_type.peek is HeapQueue.peek else None
    return (queue, note_time, update, refresh, hooks, bool(queue.preemptive), may_preempt,
            static_ranks, memo_failed, queue.meter, fixed_order, waiting, forget)
