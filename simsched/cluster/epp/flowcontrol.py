"""llm-d's flow control: priority bands, fairness between flows, ordering within a flow, capacity.

As ``pkg/epp/flowcontrol`` and ``pkg/epp/framework/plugins/flowcontrol`` of
llm-d/llm-d-inference-scheduler (commit 520af47896e5f06e43d09aca281a1149187b0ffd) do, with the
``flowControl`` feature gate on. Every request is an item of a *flow*: its fairness ID (simsched's
``tenant``; none: ``default-flow``) at its priority. An arriving item is rejected if its band or
the whole controller would go over a capacity limit (requests or bytes), else queued; a *dispatch
cycle* (one at each arrival, one every millisecond) walks the bands from the highest priority
down: if the pool's saturation reaches the band's usage limit (the static usage-limit policy: 1)
nothing is dispatched (head-of-line blocking); else the band's fairness policy picks a flow and the
flow's head (by the band's ordering policy) is dispatched; an empty band passes to the next. At
most one item per cycle, as Go's shard processor. An item still queued ``defaultRequestTTL`` after
it arrived is evicted (0: never). This module is pure bookkeeping; the clock is
:mod:`simsched.cluster.flow`'s.
"""

from __future__ import annotations

import heapq
import re
from typing import Mapping

from simsched.cluster.epp.plugins import Plugin, _float_param
from simsched.cluster.epp.saturation import go_duration

DEFAULT_FLOW = "default-flow"           # Go's metadata.DefaultFairnessID
DEFAULT_BAND_MAX_BYTES = 1_000_000_000  # Go's defaultPriorityBandMaxBytes
BYTES_PER_TOKEN = 4                     # a request's body size, as llm-d estimates tokens from it
FAR = float("inf")                      # Go's maxDeadlineTime


def _ns(seconds: float) -> int:
    """Integer nanoseconds, as Go's times add (so equal deadlines compare equal)."""
    return round(seconds * 1e9)


class _Policy(Plugin):
    KIND = "flow"


class GlobalStrictFairness(_Policy):
    """``global-strict-fairness-policy``: the flow whose head comes first by the band's ordering
    policy (one queue across the band's flows)."""

    TYPE = "global-strict-fairness-policy"

    def new_state(self):
        return None

    def pick(self, band, state):
        best = None
        for flow in band.flows.values():
            if flow.items and (best is None or flow.items[0][0] < best.items[0][0]):
                best = flow
        return best


class RoundRobinFairness(_Policy):
    """``round-robin-fairness-policy``: the band's flows sorted by key (priority, then ID), the next
    non-empty one after the last picked (from the first if that one is gone)."""

    TYPE = "round-robin-fairness-policy"

    def new_state(self):
        return {"last": None}

    def pick(self, band, state):
        keys = sorted(band.flows)
        if not keys:
            state["last"] = None
            return None
        start = (keys.index(state["last"]) + 1) % len(keys) if state["last"] in keys else 0
        for k in range(len(keys)):
            flow = band.flows[keys[(start + k) % len(keys)]]
            if flow.items:
                state["last"] = flow.key
                return flow
        state["last"] = None
        return None


class FCFSOrdering(_Policy):
    """``fcfs-ordering-policy``: earliest enqueued first."""

    TYPE = "fcfs-ordering-policy"

    def key(self, item) -> tuple:
        return (item.enqueue_at, item.seq)


class EDFOrdering(_Policy):
    """``edf-ordering-policy``: earliest deadline (enqueue + TTL, in ns; no TTL: never) first, then
    FCFS."""

    TYPE = "edf-ordering-policy"

    def key(self, item) -> tuple:
        deadline = _ns(item.enqueue_at) + _ns(item.ttl) if item.ttl > 0 else FAR
        return (deadline, item.enqueue_at, item.seq)


class SLODeadlineOrdering(_Policy):
    """``slo-deadline-ordering-policy``: earliest arrival + TTFT SLO (the ``x-slo-ttft-ms``
    header, simsched's ``slo_ttft_ms`` router option; none: never) first, then earliest
    arrival."""

    TYPE = "slo-deadline-ordering-policy"

    def key(self, item) -> tuple:
        slo = item.slo_ttft_ms
        deadline = _ns(item.received_at) + round(slo * 1e6) if slo is not None and slo >= 0 \
            else FAR
        return (deadline, item.received_at, item.seq)


class StaticUsageLimit(_Policy):
    """``static-usage-limit-policy`` (``threshold`` 1.0): every band's usage limit."""

    TYPE = "static-usage-limit-policy"
    PARAMETERS = {"threshold": 1.0}

    def __init__(self, name: str = "", **params) -> None:
        super().__init__(name, **params)
        self.threshold = _float_param(self.TYPE, "threshold", self.params["threshold"])

    def limits(self, saturation: float, priorities: list[int]) -> list[float]:
        return [self.threshold] * len(priorities)


class SheddableEvictionFilter(_Policy):
    """``sheddable-eviction-filter``: in-flight requests of negative priority may be evicted.
    Accepted: at this commit nothing in llm-d calls the request evictor's ``EvictN``."""

    TYPE = "sheddable-eviction-filter"

    def accept(self, priority: int) -> bool:
        return priority < 0


class PriorityThenTimeEvictionOrder(_Policy):
    """``priority-then-time-eviction-order-policy``: lowest priority, then latest dispatched,
    evicted first. Accepted, as the filter (no caller of ``EvictN`` in llm-d at this commit)."""

    TYPE = "priority-then-time-eviction-order-policy"

    def less(self, a: tuple, b: tuple) -> bool:
        """``a`` and ``b`` are (priority, dispatch time)."""
        if a[0] != b[0]:
            return a[0] < b[0]
        return a[1] > b[1]


FLOW_POLICIES = (GlobalStrictFairness, RoundRobinFairness, FCFSOrdering, EDFOrdering,
                 SLODeadlineOrdering, StaticUsageLimit, SheddableEvictionFilter,
                 PriorityThenTimeEvictionOrder)
_TYPES = {cls.TYPE: cls for cls in FLOW_POLICIES}


class Item:
    """A queued request: when it was enqueued and received, its TTL and size, its event."""

    __slots__ = ("req", "enqueue_at", "received_at", "ttl", "size", "seq", "key", "flow",
                 "slo_ttft_ms", "event", "outcome")

    def __init__(self, req, now: float, ttl: float, size: int, seq: int, slo_ttft_ms) -> None:
        self.req, self.enqueue_at, self.received_at = req, now, req.arrival_at
        self.ttl, self.size, self.seq, self.slo_ttft_ms = ttl, size, seq, slo_ttft_ms
        self.key = self.flow = self.event = self.outcome = None


class Flow:
    """One flow's queue, a heap on the band's ordering key (its head first)."""

    def __init__(self, key: tuple) -> None:
        self.key = key                  # (-priority, fairness ID): Go's FlowKey order
        self.items: list = []


class Band:
    """A priority band: its limits, policies and flows."""

    def __init__(self, priority: int, max_bytes: int, max_requests: int, fairness, ordering):
        self.priority, self.max_bytes, self.max_requests = priority, max_bytes, max_requests
        self.fairness, self.ordering = fairness, ordering
        self.state = fairness.new_state()
        self.flows: dict = {}
        self.len = self.bytes = 0


class FlowController:
    """The flow controller of an ``EndpointPickerConfig``'s ``flowControl`` section."""

    def __init__(self, spec, plugins: dict, where: str) -> None:
        spec = {} if spec is None else spec
        if not isinstance(spec, Mapping):
            raise ValueError(f"{where}: flowControl must be a mapping, got {spec!r}")
        known = ("maxBytes", "maxRequests", "defaultRequestTTL", "defaultPriorityBand",
                 "priorityBands", "usageLimitPolicyPluginRef")
        for k in spec:
            if k not in known:
                raise ValueError(f"{where}: flowControl: unknown field {k!r}; known: {list(known)}")
        at = f"{where}: flowControl"
        self.plugins = plugins
        self.max_bytes = quantity(spec.get("maxBytes"), f"{at}.maxBytes")
        self.max_requests = quantity(spec.get("maxRequests"), f"{at}.maxRequests")
        ttl = spec.get("defaultRequestTTL")
        self.ttl = 0.0 if ttl is None else go_duration(at, "defaultRequestTTL", ttl)
        ref = spec.get("usageLimitPolicyPluginRef") or StaticUsageLimit.TYPE
        self.usage = self._policy(ref, "limits", f"{at}.usageLimitPolicyPluginRef")
        self.template = self._band_spec(spec.get("defaultPriorityBand") or {}, f"{at}."
                                        "defaultPriorityBand", template=True)
        self.bands: dict[int, Band] = {}
        bands = spec.get("priorityBands") or []
        if not isinstance(bands, list):
            raise ValueError(f"{at}.priorityBands must be a list, got {bands!r}")
        for n, b in enumerate(bands):
            band = self._band(self._band_spec(b, f"{at}.priorityBands[{n}]"))
            if band.priority in self.bands:
                raise ValueError(f"{at}.priorityBands[{n}]: priority {band.priority} is defined "
                                 "twice")
            self.bands[band.priority] = band
        self.len = self.bytes = 0
        self.seq = 0
        self._order: list[int] = sorted(self.bands, reverse=True)

    # ------------------------------------------------------------------ configuration
    def _policy(self, ref, method: str, at: str):
        plugin = self.plugins.get(ref)
        if plugin is None and ref in _TYPES:    # Go's loader provides the default policies
            plugin = self.plugins[ref] = _TYPES[ref]()
        if plugin is None:
            raise ValueError(f"{at}: {ref!r} names no plugin; defined: {sorted(self.plugins)}")
        if not hasattr(plugin, method):
            role = {"pick": "fairness", "key": "ordering", "limits": "usage limit"}[method]
            raise ValueError(f"{at}: {ref!r} ({plugin.TYPE}) is not a {role} policy")
        return plugin

    def _band_spec(self, b, at: str, template: bool = False) -> dict:
        if not isinstance(b, Mapping):
            raise ValueError(f"{at} must be a mapping, got {b!r}")
        known = ("priority", "maxBytes", "maxRequests", "fairnessPolicyRef", "orderingPolicyRef")
        for k in b:
            if k not in known:
                raise ValueError(f"{at}: unknown field {k!r}; known: {list(known)}")
        priority = b.get("priority", 0)
        if not template and "priority" not in b:
            raise ValueError(f"{at}: priority is required")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ValueError(f"{at}.priority must be an integer, got {priority!r}")
        return {"priority": priority,
                "max_bytes": quantity(b.get("maxBytes"), f"{at}.maxBytes")
                or DEFAULT_BAND_MAX_BYTES,
                "max_requests": quantity(b.get("maxRequests"), f"{at}.maxRequests"),
                "fairness": self._policy(b.get("fairnessPolicyRef") or GlobalStrictFairness.TYPE,
                                         "pick", f"{at}.fairnessPolicyRef"),
                "ordering": self._policy(b.get("orderingPolicyRef") or FCFSOrdering.TYPE, "key",
                                         f"{at}.orderingPolicyRef")}

    @staticmethod
    def _band(s: dict) -> Band:
        return Band(s["priority"], s["max_bytes"], s["max_requests"], s["fairness"],
                    s["ordering"])

    def band(self, priority: int) -> Band:
        """The band of ``priority`` (a new one from the default template if not configured)."""
        band = self.bands.get(priority)
        if band is None:
            t = self.template
            # A dynamic band takes the template's values (its own fairness state).
            band = self.bands[priority] = Band(priority, t["max_bytes"], t["max_requests"],
                                               t["fairness"], t["ordering"])
            self._order = sorted(self.bands, reverse=True)
        return band

    # ------------------------------------------------------------------ the queue
    @property
    def num_queued(self) -> int:
        """Requests queued now."""
        return self.len

    def enqueue(self, req, now: float, slo_ttft_ms=None):
        """``req`` queued (its :class:`Item`), or why it is rejected (capacity)."""
        size = BYTES_PER_TOKEN * max(1, req.num_prompt_tokens)
        band = self.band(req.priority)
        if (self.max_bytes and self.bytes + size > self.max_bytes) \
                or (self.max_requests and self.len + 1 > self.max_requests) \
                or (band.max_bytes and band.bytes + size > band.max_bytes) \
                or (band.max_requests and band.len + 1 > band.max_requests):
            return "queue at capacity"
        self.seq += 1
        item = Item(req, now, self.ttl, size, self.seq, slo_ttft_ms)
        fid = req.tenant if req.tenant is not None else DEFAULT_FLOW
        flow = band.flows.get((-band.priority, fid))
        if flow is None:
            flow = band.flows[(-band.priority, fid)] = Flow((-band.priority, fid))
        item.flow, item.key = flow, band.ordering.key(item)
        heapq.heappush(flow.items, (item.key, item))
        band.len += 1
        band.bytes += size
        self.len += 1
        self.bytes += size
        return item

    def _remove(self, item) -> None:
        band = self.bands[item.req.priority]
        band.len -= 1
        band.bytes -= item.size
        self.len -= 1
        self.bytes -= item.size

    def expire(self, item) -> None:
        """Take ``item`` out of its queue (its TTL ran out)."""
        items = item.flow.items
        items.remove((item.key, item))
        heapq.heapify(items)
        self._remove(item)

    def dispatch_cycle(self, saturation: float):
        """One dispatch cycle at pool ``saturation``: the dispatched :class:`Item`, or None."""
        order = self._order
        limits = self.usage.limits(saturation, order)
        for priority, limit in zip(order, limits):
            if saturation >= limit:
                return None             # head-of-line blocking: no lower band either
            band = self.bands[priority]
            flow = band.fairness.pick(band, band.state)
            if flow is None:
                continue
            _, item = heapq.heappop(flow.items)
            self._remove(item)
            return item
        return None


_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_SUFFIX = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def quantity(value, at: str) -> int:
    """A Kubernetes resource quantity (``100``, ``1k``, ``1Gi``) as an integer >= 0 (None: 0,
    no limit); anything else is refused naming ``at``."""
    if value is None:
        return 0
    if isinstance(value, bool):
        raise ValueError(f"{at} must be a quantity such as 100, '1k' or '1Gi', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{at} must not be negative, got {value!r}")
        return value
    m = _QUANTITY.match(str(value).strip()) if isinstance(value, (str, float)) else None
    if m is None:
        raise ValueError(f"{at} must be a quantity such as 100, '1k' or '1Gi', got {value!r}")
    n = float(m.group(1)) * _SUFFIX[m.group(2)]
    if n != int(n):
        raise ValueError(f"{at} must be a whole number, got {value!r}")
    return int(n)
