"""The ``llm-d`` router: llm-d's endpoint picker (EPP) scheduling cycle over simsched's replicas.

Per request, as the EPP's director and scheduler do: the producers prepare per-endpoint data
(the approximate prefix match), the primary profile runs its filters, its scorers (each score
clamped to [0, 1], times its weight, summed per endpoint) and its picker; then, at dispatch, the
producers record the choice (prefix index, in-flight counters). Cost: O(replicas) per request
for the scorers and pickers, plus O(prompt blocks x endpoints matching them) for the prefix
match.

What the plugins see (:class:`~simsched.cluster.epp.plugins.Metrics`): ``waiting``
(``replica.num_waiting``), ``running`` (its scheduler's running requests) and ``kv_use`` are the
gauges vLLM exports, read live with ``cluster.refresh_interval = 0`` and copied at every
scrape otherwise (llm-d scrapes every 50 ms); the in-flight requests and tokens are counted at
dispatch and at the request's end, never stale, as llm-d's inflight-load-producer does.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Mapping

from simsched.cluster.epp.config import load_yaml, parse
from simsched.cluster.epp.fast import FastCycle
from simsched.cluster.epp.gauges import QueueGauges
from simsched.cluster.epp.labels import check_labels
from simsched.cluster.epp.latency import PredictedLatencyProducer
from simsched.cluster.epp.latency_model import model_options
from simsched.cluster.epp.plugins import (InFlightLoadProducer, KVCacheUtilizationScorer,
                                          Metrics, QueueScorer)
from simsched.cluster.epp.prefix import ApproxPrefixCacheProducer
from simsched.cluster.load_routers import Router, _Uniforms, register

TIE_BREAKS = ("random", "index")


@register("llm-d")
class LlmD(Router):
    """llm-d's EPP pipeline, configured by an ``EndpointPickerConfig``.

    ``config``: a path to the YAML file, or the config as a mapping (None: llm-d's default
    profile, queue 2 + KV utilisation 2 + prefix 3, max-score picker). ``tie_break``:
    ``random`` (llm-d's max-score picker: uniformly among equal best scores, from the run's
    rng) or ``index`` (the lowest replica index, as simsched's ``weighted`` router breaks ties).
    ``model``: the model name that seeds the prefix hashes. ``labels``: the replicas' pod
    labels, one mapping of strings per replica (in the first view's order; None: none), read by
    the label filters and context-length-aware. ``slo_ttft_ms`` / ``slo_tpot_ms``: every
    request's TTFT / TPOT SLO in ms (llm-d's ``x-slo-ttft-ms`` / ``x-slo-tpot-ms`` headers; None:
    no header), read by the SLO-deadline ordering and the predicted-latency plugins.
    ``latency_model``: the predicted-latency producer's model options
    (:mod:`simsched.cluster.epp.latency_model`).
    """

    def __init__(self, num_replicas, rng, config: str | Mapping | None = None,
                 tie_break: str = "random", model: str = "", labels=None,
                 slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None,
                 latency_model: Mapping | None = None) -> None:
        super().__init__(num_replicas, rng)
        self.labels = check_labels(labels)
        for name, slo in (("slo_ttft_ms", slo_ttft_ms), ("slo_tpot_ms", slo_tpot_ms)):
            if slo is not None and (isinstance(slo, bool) or not isinstance(slo, (int, float))
                                    or not 0 <= slo < float("inf")):
                raise ValueError(f"{name} must be a number of ms >= 0 or None, got {slo!r}")
        self.slo_ttft_ms, self.slo_tpot_ms = slo_ttft_ms, slo_tpot_ms
        model_settings = model_options(latency_model)
        if tie_break not in TIE_BREAKS:
            raise ValueError(f"tie_break must be one of {list(TIE_BREAKS)}, got {tie_break!r}")
        if not isinstance(model, str):
            raise ValueError(f"model must be a string, got {model!r}")
        if isinstance(config, str):
            self.pipeline = parse(load_yaml(config), where=config, model=model)
        elif config is None or isinstance(config, Mapping):
            self.pipeline = parse(config, model=model)
        else:
            raise ValueError(f"config must be a path to an EndpointPickerConfig YAML file, a "
                             f"mapping or None, got {config!r}")
        draws = _Uniforms(rng)
        self.draw = lambda: draws.index(1 << 53) / float(1 << 53)
        self.tie_break = tie_break
        # A P/D handler runs in a disaggregated cluster only (simsched.cluster.disagg), which
        # gives the decode profile to this router and the prefill one to a sibling.
        self.handler = self.pipeline.handler
        # Flow control queues requests before routing (simsched.cluster.flow runs its clock,
        # and sets ``clock``: requests are then dispatched after their arrival).
        self.flow_control = self.pipeline.flow_control
        self.clock = None
        for p in self.pipeline.producers(PredictedLatencyProducer.TYPE):
            p.configure(model_settings)
        self._use_profile(self.pipeline.profiles[0])

    def sibling(self, profile: str, num_replicas: int) -> "LlmD":
        """A router running this config's profile ``profile`` over ``num_replicas`` replicas,
        sharing the plugins (the prefix index, the in-flight counters) and the random draws."""
        twin = object.__new__(type(self))
        Router.__init__(twin, num_replicas, self.rng)
        twin.labels, twin.pipeline, twin.draw = self.labels, self.pipeline, self.draw
        twin.tie_break, twin.handler = self.tie_break, self.handler
        twin.flow_control, twin.clock = self.flow_control, self.clock
        twin.slo_ttft_ms, twin.slo_tpot_ms = self.slo_ttft_ms, self.slo_tpot_ms
        twin._use_profile(self.pipeline.profile(profile))
        twin.tokens_of = self.tokens_of
        return twin

    def _use_profile(self, profile) -> None:
        """Set up the run of ``profile``: what its plugins consume, its producers' hooks."""
        self.profile = profile
        tie_break = self.tie_break
        picker = self.profile.picker
        picker.draw = self.draw
        for f in self.profile.filters:
            if hasattr(f, "draw"):
                f.draw = self.draw
        if hasattr(picker, "random_ties"):
            picker.random_ties = tie_break == "random"
        plugins = self.profile.filters + [s for s, _ in self.profile.scorers]
        consumed = {c for p in plugins for c in p.CONSUMES}
        decider = getattr(self.handler, "decider", None)
        if decider is not None:
            consumed.update(decider.CONSUMES)
        # Admission reads its own figures, and only for sheddable requests; the snapshot
        # scrapes them too.
        detector = self.pipeline.detector
        self.admission_consumes = set(detector.CONSUMES).union(
            *(a.CONSUMES for a in self.pipeline.admitters))
        for admitter in self.pipeline.admitters:
            admitter.draw = self.draw
        # Predicted latency: the producer reads the gauges and the prefix match; its SLOs are
        # the requests' headers (router options).
        latency = self.pipeline.producers(PredictedLatencyProducer.TYPE)
        self.latency = latency[0] if latency else None
        slo = (float(self.slo_ttft_ms or 0.0), float(self.slo_tpot_ms or 0.0))
        for p in [self.latency] + self.pipeline.admitters:
            if hasattr(p, "slo"):
                p.slo = slo
        self.admit_latency = self.latency is not None and any(
            "latency" in a.CONSUMES for a in self.pipeline.admitters)
        if self.latency is not None:
            consumed.update(self.latency.CONSUMES)
            if self.admit_latency:
                self.admission_consumes |= set(self.latency.CONSUMES)
        self.consumed = consumed
        everything = consumed | self.admission_consumes
        self.reads_kv = "kv_use" in everything
        # The cluster reports queue changes to a router that reads the waiting gauges.
        self.watches_queues = "waiting" in everything
        self.verify_queues = False      # the cluster sets it with check_invariants
        prefix = self.pipeline.producers(ApproxPrefixCacheProducer.TYPE)
        self.prefix = prefix[0] if prefix and "prefix" in consumed else None
        # In-flight tokens and the prefix index are kept per replica object (llm-d keys them by
        # pod name), so they survive an autoscaled fleet renumbering its routable replicas.
        self.track_tokens = "inflight_tokens" in everything
        self.post = [p for p in plugins if hasattr(p, "pre_request")]
        kinds = [type(s) for s, _ in self.profile.scorers[:2]]
        self.fuses_queue_kv = kinds == [QueueScorer, KVCacheUtilizationScorer]
        self.precise = "precise" in consumed
        self._fast = None       # set at attach (simsched.cluster.epp.fast)
        self.uses_prefix_index = self.precise
        self.tokens_of: dict[int, int] = {}
        self.cycle: dict = {}
        self._attached = self._live = self._replicas = self._gauges = None
        self._labels_of = None

    # ------------------------------------------------------------------ metrics
    def _queues(self, consumed=None) -> dict:
        """The waiting and running gauges of every replica (those ``consumed``, default: all
        the router reads), read now."""
        if consumed is None:
            consumed = self.consumed | self.admission_consumes
        out = {}
        if "waiting" in consumed:
            out["waiting"] = self._gauges.waiting()
        if "running" in consumed:
            out["running"] = self._gauges.running()
        return out

    def _attach(self, view) -> None:
        """Hook into a (new) view: scrape the queue gauges with a snapshot's refresh, and
        release in-flight tokens when a request ends. O(replicas), when the view changes."""
        self._attached = view
        self._replicas = view.replicas
        self._live = getattr(view, "live", view)
        self._gauges = QueueGauges(view.replicas, getattr(view, "queue_changed", None),
                                   self.verify_queues)
        self._fast = FastCycle.of(self, self._gauges) if self._gauges.changed is not None \
            and self._live is view else None
        self._keys = [id(r) for r in view.replicas]
        self._local = {k: i for i, k in enumerate(self._keys)}
        self.candidates = list(range(len(view.replicas)))
        if self.labels is not None and len(self.labels) > len(view.replicas) \
                and self._labels_of is None:
            raise ValueError(f"router option labels lists {len(self.labels)} replicas, the "
                             f"cluster routes to {len(view.replicas)}")
        if self._labels_of is None:         # labels belong to the replicas first seen
            given = self.labels or []
            self._labels_of = {k: dict(given[i]) if i < len(given) else {}
                               for i, k in enumerate(self._keys)}
        self._labels = [self._labels_of.get(k, {}) for k in self._keys]
        self._snapshot = hasattr(view, "scrape")
        if self._snapshot and {"waiting", "running"} & (self.consumed | self.admission_consumes):
            view.scrape = self._queues
            view.scraped = self._queues()
        if self.track_tokens or self.latency is not None:
            if not hasattr(self._live, "on_finished"):
                raise ValueError("token-load-scorer and predicted-latency-producer need an "
                                 "end-of-request hook (ReplicaLoad.on_finished) on the "
                                 "router's view")
            tokens, estimate, live = self.tokens_of, InFlightLoadProducer.estimate, self._live
            latency, track = self.latency, self.track_tokens

            def release(i, req):
                if track:
                    key = id(live.replicas[i])
                    tokens[key] = tokens.get(key, 0) - estimate(req)
                if latency is not None:
                    latency.finished(req)
            self._live.on_finished = release
        if self.latency is not None and self.latency.streaming:
            if not hasattr(self._live, "on_first_token"):
                raise ValueError("predicted-latency-producer's streamingMode needs a first-token "
                                 "hook (ReplicaLoad.on_first_token) on the router's view")
            first = self.latency.first_token
            self._live.on_first_token = lambda i, req: first(req)

    # ------------------------------------------------------------------ admission
    admits_below_priority = 0       # admit() returns None for every other request

    def admit(self, view, req) -> str | None:
        """None to admit ``req``, else why it is shed (llm-d's legacy admission control, then
        the admitter plugins, :mod:`simsched.cluster.epp.admission`, in the director's order).
        Only sheddable requests (priority < 0) are looked at, so others cost one comparison."""
        if req.priority >= 0:
            return None
        m = self.metrics(view, req, self.admission_consumes)
        cands = self.candidates
        # With flow control on, it admitted the request already (it replaces legacy shedding).
        if self.flow_control is None:
            sat = self.pipeline.detector.saturation(m, cands)
            if sat >= 1.0:
                return (f"shed: llm-d system saturated, sheddable request dropped "
                        f"({self.pipeline.detector.TYPE} saturation {sat:.3f})")
        if self.admit_latency:      # (Go's admitters run after the data producers)
            self.produce(view, req, m)
        for admitter in self.pipeline.admitters:
            why = admitter.admit(m, req, cands)
            if why is not None:
                return f"shed: llm-d {why}"
        return None

    def pool_saturation(self, view, now: float) -> float:
        """The saturation detector's reading of the pool at ``now`` (flow control's input)."""
        m = self.metrics(view, SimpleNamespace(arrival_at=now), self.admission_consumes)
        return self.pipeline.detector.saturation(m, self.candidates)

    def metrics(self, view, req, consumed=None) -> Metrics:
        """The figures the profile's plugins (or ``consumed``) read, as the router sees them
        at ``req``'s arrival."""
        if view is not self._attached or view.replicas is not self._replicas \
                or getattr(view, "live", view) is not self._live:
            self._attach(view)
        if consumed is None:
            consumed = self.consumed
        if {"waiting", "running"} & consumed:
            queues = view.scraped if self._snapshot else self._queues(consumed)
        else:
            queues = {}
        lora = None
        if "lora" in consumed:
            lora = [(r.lora.cache.gpu, (), r.lora.cache.max_loras)
                    if getattr(r, "lora", None) is not None else ((), (), 0)
                    for r in self._replicas]
        tokens = None
        if self.track_tokens:
            held = self.tokens_of
            tokens = [held.get(k, 0) for k in self._keys]
        age = None
        if "age" in consumed:
            # A snapshot's metrics are as old as its last scrape (exact state: never stale).
            old = max(0.0, req.arrival_at - view.taken_at) if self._snapshot else 0.0
            age = [old] * len(self._keys)
        return Metrics(waiting=queues.get("waiting"), running=queues.get("running"), age=age,
                       labels=self._labels,
                       kv_use=view.kv_use if "kv_use" in consumed else None,
                       inflight_requests=self._live.outstanding, inflight_tokens=tokens,
                       lora=lora)

    # ------------------------------------------------------------------ the cycle
    def produce(self, view, req, m) -> dict:
        """The cycle state the producers prepare for ``req``: the prefix match (and the
        precise scorer's holders), the latency predictions (into ``m``)."""
        cycle: dict[str, Any] = {"keys": self._keys, "replicas": view.replicas}
        if self.precise:
            index = getattr(view, "prefix_holders", None)
            cycle["holders"] = None if index is None else set(index.candidates(req))
        if self.prefix is not None and getattr(req, "content", None) is None:
            # No content identity: no blocks, nothing matched (what produce gives, cheaper).
            cycle["prefix"], cycle["hashes"], cycle["block_size"] = ({}, 0), [], 0
        elif self.prefix is not None:
            hashes, match, size = self.prefix.produce(req, view.replicas)
            local = self._local
            cycle["prefix"] = ({local[k]: c for k, c in match.items() if k in local},
                               len(hashes))
            cycle["hashes"] = hashes
            cycle["block_size"] = size
        if self.latency is not None:
            preds = self.latency.produce(m, req, cycle, self._keys)
            m.latency = preds
            m.ttft = None if preds is None else [p.ttft for p in preds]
            cycle["metrics"] = m
        return cycle

    def scores(self, view, req) -> tuple[list[int], list[float], dict]:
        """``(candidates, weighted scores, cycle state)`` of ``req`` (filters and scorers)."""
        m = self.metrics(view, req)
        cycle = self.produce(view, req, m)
        cands = self.candidates
        for f in self.profile.filters:
            kept = f.filter(m, req, cycle, cands)
            # (Go fails the request when a filter leaves no endpoint; simsched's role filters
            # never do, and a router must name a replica: fail open.)
            cands = kept if kept else cands
        # Each score clamped to [0, 1] times its weight, summed in the profile's order (Go adds
        # to 0; 0 + x is x, so starting from the first scorer's terms gives the same floats).
        # Scorers whose scores are within [0, 1] by construction (BOUNDED) skip the clamp, and
        # one that scores every endpoint 0 this time (zero) adds nothing: t + 0.0 is t, so
        # both give the same floats as the plain sum.
        totals, scorers = None, self.profile.scorers
        if self.fuses_queue_kv and len(cands) == len(self.candidates):
            # llm-d's default profile starts with queue-scorer and kv-cache-utilization-scorer:
            # their weighted terms in one pass over every endpoint (the same float operations,
            # in the same order, as the two passes below).
            (_, wq), (_, wk) = scorers[:2]
            scorers = scorers[2:]
            totals = self._gauges.fused_terms(m.waiting, m.kv_use, wq, wk)
        for scorer, w in scorers:
            if scorer.zero(cycle):
                continue
            if totals is not None and len(cands) == len(self.candidates) \
                    and hasattr(scorer, "sparse"):
                # Only the few endpoints scoring above 0 change the sums (t + 0 * w is t).
                for i, v in scorer.sparse(cycle).items():
                    totals[i] = totals[i] + v * w
                continue
            scores = scorer.score(m, req, cycle, cands)
            if scorer.BOUNDED:
                if totals is None:
                    totals = [s * w for s in scores]
                else:
                    totals = [t + s * w for t, s in zip(totals, scores)]
            elif totals is None:
                totals = [(0.0 if s < 0.0 else 1.0 if s > 1.0 else s) * w for s in scores]
            else:
                totals = [t + (0.0 if s < 0.0 else 1.0 if s > 1.0 else s) * w
                          for t, s in zip(totals, scores)]
        return cands, totals if totals is not None else [0.0] * len(cands), cycle

    def choose(self, view, req) -> int:
        if self._fast is not None and view is self._attached \
                and view.replicas is self._replicas:
            return self._fast.choose(view, req)
        cands, totals, cycle = self.scores(view, req)
        self.cycle = cycle
        i = self.profile.picker.pick(cands, totals)[0]
        if self.prefix is not None:
            self.prefix.dispatched(cycle["hashes"], view.replicas[i])
        for plugin in self.post:
            plugin.pre_request(self._keys[i], cycle, req)
        if self.latency is not None:
            self.latency.dispatched(cycle["metrics"], req, cycle, i, self._keys[i],
                                    req.arrival_at if self.clock is None else self.clock())
        if self.track_tokens:
            key = self._keys[i]
            self.tokens_of[key] = self.tokens_of.get(key, 0) + InFlightLoadProducer.estimate(req)
        return i


    def matched_blocks(self, i: int):
        """The prefix blocks the last request matched on local replica ``i``, and the block
        size (the P/D decider's input); ``(None, 0)`` without a prefix producer."""
        if "prefix" not in self.cycle:
            return None, 0
        return self.cycle["prefix"][0].get(i, 0), self.cycle["block_size"]
