"""Queue orders, preemption victims and the queue structures behind them (plain objects)."""

from simsched.policies.base import QueuePolicy
from simsched.policies.orders import QUEUE_POLICIES, make_queue
from simsched.policies.victims import VICTIM_POLICIES

__all__ = ["QUEUE_POLICIES", "QueuePolicy", "VICTIM_POLICIES", "make_queue"]
