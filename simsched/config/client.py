"""The benchmark client: who sends the requests, and when (``SimConfig.client``).

``client_type='open'`` (the default) is no client: requests arrive at the workload's own times,
whatever the server does. The two others are the load generators published results come from,
run as SimPy processes (:mod:`simsched.cluster.clients`) that react to the server:

* ``'concurrency'``: ``vllm bench serve`` (also InferenceX's copy of it). At most
  ``max_concurrency`` requests in flight; a request is sent once its scheduled time has come
  (``request_rate``, ``burstiness``: vLLM's gamma gaps; infinite rate: all at once) *and* a slot
  is free, in dataset order, so the next one leaves the moment the client receives a finish.
  ``ready_check`` (vLLM's default; None: on for this client) first sends the first prompt
  alone, then ``num_warmups`` copies of it (limited to ``max_concurrency``); both are waited
  for and left out of the results.
* ``'staged'``: inference-perf's load stages ``stages = ((rate, seconds), ...)``: each stage
  sends ``int(rate * seconds)`` requests (``stage_load`` ``constant``: exponential gaps scaled
  to the stage's length; ``poisson``: a Poisson count per second), starting
  ``stage_lead_time`` after the stage starts; the stage ends when the client, polling every
  ``stage_poll_time``, sees all its requests finished, and the next starts
  ``stage_interval_time`` later.

The prompts come from ``dataset``: ``'workload'`` takes the workload's request table in order
(its lengths, labels and prefix identity; its arrival times are not used), ``'random'`` is
vLLM's random dataset and ``'inferencex-random'`` InferenceX's variant
(:mod:`simsched.workloads.benchmark_clients` has both tools' exact bounds). ``num_prompts``
counts the measured requests (None: 1,000 for a random dataset, vLLM's default, or every row
of the workload); ``num_unique_prompts`` limits the prompts to the first K, reused in
``prompt_order``: ``'sequential'`` (the default) cycles them (inference-perf's prompt pool:
prompt ``n % K`` for the ``n``-th request of each stage), ``'shuffle'`` walks a fresh random
permutation of the K each pass and ``'random'`` draws each request's prompt with replacement
(aiperf's dataset sampling strategies; ``shuffle`` is its default, over 100 prompts). A prompt
sent again is the same tokens, so a server with prefix caching serves it from its cache while
its blocks last. ``warmup_prompts``: ``'first'`` (the default) sends copies of the first prompt
as warm-ups, as ``vllm bench serve`` does; ``'dataset'`` takes them from the prompt order
ahead of the measured requests, as aiperf's warm-up phase does. TTFT and E2E latency count
from the client's send (``arrival_at``), as the benchmarks count them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

from simsched.config.checks import check_bool, check_choice, check_float, check_int, plain
from simsched.workloads.benchmark_clients import (PROMPT_ORDERS, inferencex_random_bounds,
                                                  vllm_random_bounds)

__all__ = ["CLIENT_TYPES", "DATASETS", "PROMPT_ORDERS", "REQUEST_TIMINGS", "STAGE_LOADS",
           "WARMUP_PROMPTS", "ClientConfig"]

CLIENT_TYPES = ("open", "concurrency", "staged")
DATASETS = ("workload", "random", "inferencex-random")
REQUEST_TIMINGS = ("vllm", "inferencex")
STAGE_LOADS = ("constant", "poisson")
WARMUP_PROMPTS = ("first", "dataset")
DEFAULT_NUM_PROMPTS = 1000      # vllm bench serve --num-prompts
# aiperf profile's prompts without --num-dataset-entries: its 100 synthetic entries, drawn in
# its default shuffle order, warm-ups included (read-only; ClientConfig.preset('aiperf')).
AIPERF_PROMPTS = MappingProxyType({"num_unique_prompts": 100, "prompt_order": "shuffle",
                                   "warmup_prompts": "dataset"})
# Fields that only one client type reads (the others must leave them at their defaults).
_CONCURRENCY_ONLY = ("request_rate", "burstiness", "request_timing", "num_prompts")
_STAGED_ONLY = ("stages", "stage_load", "stage_lead_time", "stage_poll_time",
                "stage_interval_time")
_OWNER = "client"


def _number(value: Any) -> Any:
    """A float field as JSON data writes it back (``"inf"``)."""
    return math.inf if value == "inf" else value


@dataclass(frozen=True)
class ClientConfig:
    """The benchmark client of a run (see the module docstring); validated on construction."""

    client_type: str = "open"
    max_concurrency: int | None = None
    # vllm bench serve
    request_rate: float = math.inf
    burstiness: float = 1.0
    request_timing: str = "vllm"
    num_prompts: int | None = None
    num_warmups: int = 0
    ready_check: bool | None = None
    # the prompts
    dataset: str = "workload"
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    random_prefix_len: int = 0
    num_special_tokens: int = 0
    ignore_eos: bool = True
    num_unique_prompts: int | None = None
    prompt_order: str = "sequential"
    warmup_prompts: str = "first"
    # inference-perf
    stages: tuple = ()
    stage_load: str = "constant"
    stage_lead_time: float = 1.0
    stage_poll_time: float = 1.0
    stage_interval_time: float = 1.0

    def __post_init__(self) -> None:
        plain(self)
        for name in ("request_rate", "burstiness"):
            object.__setattr__(self, name, _number(getattr(self, name)))
        check_choice(_OWNER, "client_type", self.client_type, CLIENT_TYPES)
        if self.max_concurrency is not None:
            check_int(_OWNER, "max_concurrency", self.max_concurrency, 1)
        check_float(_OWNER, "request_rate", self.request_rate, 0.0, low_open=True)
        check_float(_OWNER, "burstiness", self.burstiness, 0.0, low_open=True)
        check_choice(_OWNER, "request_timing", self.request_timing, REQUEST_TIMINGS)
        if self.num_prompts is not None:
            check_int(_OWNER, "num_prompts", self.num_prompts, 1)
        check_int(_OWNER, "num_warmups", self.num_warmups, 0)
        if self.ready_check is not None:
            check_bool(_OWNER, "ready_check", self.ready_check)
        check_choice(_OWNER, "dataset", self.dataset, DATASETS)
        check_int(_OWNER, "random_input_len", self.random_input_len, 1)
        check_int(_OWNER, "random_output_len", self.random_output_len, 1)
        check_int(_OWNER, "random_prefix_len", self.random_prefix_len, 0)
        check_int(_OWNER, "num_special_tokens", self.num_special_tokens, 0)
        check_bool(_OWNER, "ignore_eos", self.ignore_eos)
        if not self.ignore_eos:
            raise ValueError("client.ignore_eos=False: simsched has no end-of-sequence model; "
                             "every request generates exactly its drawn output length, as "
                             "--ignore-eos asks")
        if self.num_unique_prompts is not None:
            check_int(_OWNER, "num_unique_prompts", self.num_unique_prompts, 1)
        check_choice(_OWNER, "prompt_order", self.prompt_order, PROMPT_ORDERS)
        check_choice(_OWNER, "warmup_prompts", self.warmup_prompts, WARMUP_PROMPTS)
        self._check_range_ratio()
        self._check_stages()
        check_choice(_OWNER, "stage_load", self.stage_load, STAGE_LOADS)
        for name in ("stage_lead_time", "stage_poll_time", "stage_interval_time"):
            check_float(_OWNER, name, getattr(self, name), 0.0, finite=True)
        self._check_type()

    def _check_range_ratio(self) -> None:
        ratio = self.random_range_ratio
        if self.dataset == "inferencex-random":
            check_float(_OWNER, "random_range_ratio", ratio, 0.0, 1.0)
        else:
            # vLLM refuses a ratio of 1 or more (its low bound would reach 0).
            check_float(_OWNER, "random_range_ratio", ratio, 0.0, 1.0)
            if ratio >= 1.0:
                raise ValueError(f"client.random_range_ratio must be in [0, 1) (vLLM's random "
                                 f"dataset), got {ratio!r}")
        if self.dataset == "workload":
            return
        if self.dataset == "random":
            in_lo, _, out_lo, _ = vllm_random_bounds(self.random_input_len,
                                                     self.random_output_len, ratio,
                                                     self.num_special_tokens)
        else:
            in_lo, _, out_lo, _ = inferencex_random_bounds(self.random_input_len,
                                                           self.random_output_len, ratio)
        if in_lo + self.random_prefix_len + self.num_special_tokens < 1:
            raise ValueError(f"client.random_input_len={self.random_input_len} is too small: "
                             f"with random_range_ratio={ratio} and num_special_tokens="
                             f"{self.num_special_tokens} a prompt could have 0 tokens")
        if out_lo < 1:
            raise ValueError(f"client.random_range_ratio={ratio}: InferenceX's low bound "
                             f"int({self.random_output_len} * {ratio}) = {out_lo} would allow "
                             "0-token outputs, which no server runs")

    def _check_stages(self) -> None:
        stages = self.stages
        if isinstance(stages, list):
            stages = tuple(stages)
        usage = ("client.stages must be a tuple of (rate, seconds) pairs with rate > 0 and "
                 f"seconds > 0 (finite), got {self.stages!r}")
        if not isinstance(stages, tuple):
            raise ValueError(usage)
        out = []
        for i, stage in enumerate(stages):
            if not isinstance(stage, (tuple, list)) or len(stage) != 2:
                raise ValueError(usage)
            for name, value in zip(("rate", "seconds"), stage):
                check_float(_OWNER, f"stages[{i}].{name}", value, 0.0, low_open=True,
                            finite=True)
            out.append((float(stage[0]), float(stage[1])))
        object.__setattr__(self, "stages", tuple(out))
        if out and sum(int(r * d) for r, d in out) < 1:
            raise ValueError(f"client.stages {self.stages!r} send no request (each stage sends "
                             "int(rate * seconds))")

    def _check_type(self) -> None:
        kind = self.client_type
        defaults = ClientConfig.__dataclass_fields__
        changed = [f for f in defaults if f != "client_type"
                   and getattr(self, f) != defaults[f].default]
        if kind == "open":
            if changed:
                raise ValueError(f"client.{changed[0]} applies to a benchmark client: set "
                                 "client.client_type to 'concurrency' or 'staged' (it is "
                                 "'open': the workload's own arrival times)")
            return
        if self.dataset == "workload":
            own = [f for f in changed if f.startswith("random_") or f == "num_special_tokens"]
            if own:
                raise ValueError(f"client.{own[0]} applies to dataset 'random' or "
                                 "'inferencex-random', not 'workload'")
        other = _STAGED_ONLY if kind == "concurrency" else _CONCURRENCY_ONLY
        wrong = [f for f in changed if f in other]
        if wrong:
            owner = "staged" if kind == "concurrency" else "concurrency"
            raise ValueError(f"client.{wrong[0]} applies to client_type={owner!r}, not "
                             f"{kind!r}")
        if kind == "staged" and not self.stages:
            raise ValueError("client.stages: client_type='staged' needs at least one "
                             "(rate, seconds) stage")

    @property
    def is_open(self) -> bool:
        """True without a benchmark client (requests arrive at the workload's times)."""
        return self.client_type == "open"

    @property
    def resolved_ready_check(self) -> bool:
        """Whether the first prompt is sent alone first (None: vLLM's default for the
        concurrency client, off for inference-perf's stages)."""
        if self.ready_check is not None:
            return self.ready_check
        return self.client_type == "concurrency"

    @property
    def num_warmup_requests(self) -> int:
        """Requests sent before the measured ones (the ready check and the warm-ups)."""
        return int(self.resolved_ready_check) + self.num_warmups

    def stage_counts(self) -> list[int]:
        """Requests each stage sends: ``int(rate * seconds)``, as inference-perf counts them."""
        return [int(rate * seconds) for rate, seconds in self.stages]

    def resolved_num_prompts(self, num_rows: int | None = None) -> int:
        """Measured requests: the stages' total, ``num_prompts``, or (None) 1,000 for a random
        dataset and ``num_rows`` (the workload table's rows) for ``dataset='workload'``."""
        if self.client_type == "staged":
            return sum(self.stage_counts())
        if self.num_prompts is not None:
            return self.num_prompts
        if self.dataset != "workload" or num_rows is None:
            return DEFAULT_NUM_PROMPTS
        return num_rows

    @classmethod
    def preset(cls, name: str, **changes: Any) -> "ClientConfig":
        """A named client, with ``changes``: ``'vllm-bench'`` (``vllm bench serve``'s defaults:
        random dataset, 1,000 prompts, infinite rate, ready check) or ``'inferencex'`` (what
        InferenceX's ``benchmark_lib.sh`` runs: its random variant at range ratio 0.8, infinite
        rate, ``10 * C`` prompts, ``2 * C`` warm-ups, no ready check; give
        ``max_concurrency``) or ``'aiperf'`` (``aiperf profile`` with synthetic prompts of
        fixed lengths, ``--isl-stddev 0``: its 100 dataset entries reused in its default
        ``shuffle`` order, warm-ups drawn from them, no ready check)."""
        if name == "vllm-bench":
            base: dict[str, Any] = {"client_type": "concurrency", "dataset": "random"}
        elif name == "inferencex":
            conc = changes.get("max_concurrency")
            if conc is None:
                raise ValueError("ClientConfig.preset('inferencex') needs max_concurrency")
            base = {"client_type": "concurrency", "dataset": "inferencex-random",
                    "random_range_ratio": 0.8, "request_timing": "inferencex",
                    "ready_check": False, "num_prompts": 10 * conc, "num_warmups": 2 * conc}
        elif name == "aiperf":
            base = {"client_type": "concurrency", "dataset": "random",
                    "random_range_ratio": 0.0, "ready_check": False, **AIPERF_PROMPTS}
        else:
            raise ValueError(f"unknown client preset {name!r}; known: 'aiperf', 'inferencex', "
                             "'vllm-bench'")
        base.update(changes)
        return cls(**base)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ClientConfig":
        """The config of :func:`dataclasses.asdict`-like JSON data (``"inf"`` for infinity,
        lists for the stages); an unknown key is a ValueError naming it."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"client: unknown field(s) {unknown}; known: {sorted(known)}")
        return cls(**dict(data))
