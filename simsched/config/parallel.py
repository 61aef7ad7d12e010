"""Pipeline, data-parallel-attention and expert parallelism of one replica (``hardware.parallel``).

One replica (one engine, one scheduler) runs on ``tensor_parallel_size x
pipeline_parallel_size x data_parallel_size`` GPUs:

* ``pipeline_parallel_size`` (pp): the layers split into pp stages; up to ``num_micro_batches``
  (default pp, vLLM's one batch per virtual engine) micro-batches in flight;
* ``data_parallel_size`` (dp): attention data-parallel ranks (vLLM's ``--data-parallel-size``
  for MoE models, as DeepSeek is deployed): each rank runs attention for its own share of the
  sequences, the MoE layers run over all tp x dp ranks; an MoE model only (a dense model scales
  out with cluster replicas);
* ``enable_expert_parallel``: the routed experts are spread over the tp x dp ranks (whole
  experts per rank, all-to-all dispatch and combine) instead of each rank holding a slice of
  every expert; an MoE model only, and ``num_experts`` must divide over the ranks;
* ``expert_routing_skew``: Zipf exponent of the experts' popularity (0: uniform routing);
* ``gpus_per_node`` and ``inter_node_bandwidth`` (bytes/s per GPU): an all-to-all over more
  ranks than a node holds runs over the network instead of NVLink.

``num_gpus``, if given, must equal tp x pp x dp: a layout that does not add up is refused with
one message naming every degree. How each is modelled: :mod:`simsched.cost.parallel`.
"""

from __future__ import annotations

from dataclasses import dataclass

from simsched.config.checks import as_part, check_bool, check_float, check_int, plain


@dataclass(frozen=True)
class ParallelConfig:
    """Parallel layout of one replica beyond tensor parallelism (see the module docstring)."""

    pipeline_parallel_size: int = 1
    num_micro_batches: int | None = None
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    expert_routing_skew: float = 0.0
    num_gpus: int | None = None
    gpus_per_node: int = 8
    inter_node_bandwidth: float = 50e9

    def __post_init__(self) -> None:
        plain(self)
        o = "hardware.parallel"
        check_int(o, "pipeline_parallel_size", self.pipeline_parallel_size, 1, 64)
        if self.num_micro_batches is None:
            object.__setattr__(self, "num_micro_batches", self.pipeline_parallel_size)
        check_int(o, "num_micro_batches", self.num_micro_batches, 1,
                  self.pipeline_parallel_size)
        check_int(o, "data_parallel_size", self.data_parallel_size, 1, 1024)
        check_bool(o, "enable_expert_parallel", self.enable_expert_parallel)
        check_float(o, "expert_routing_skew", self.expert_routing_skew, 0.0, 4.0)
        if self.num_gpus is not None:
            check_int(o, "num_gpus", self.num_gpus, 1)
        check_int(o, "gpus_per_node", self.gpus_per_node, 1, 1024)
        check_float(o, "inter_node_bandwidth", self.inter_node_bandwidth, 0.0, low_open=True)


def as_parallel(value) -> ParallelConfig | None:
    """``hardware.parallel`` as given: None, a :class:`ParallelConfig` or a mapping of its
    fields (as a config file holds it)."""
    return as_part(value, ParallelConfig, "hardware.parallel")


def check_layout(par: ParallelConfig, spec, tp: int, model: str) -> None:
    """Refuse a layout the model or the GPU count cannot take, with one message naming it."""
    o = "hardware.parallel"
    pp, dp = par.pipeline_parallel_size, par.data_parallel_size
    total = tp * pp * dp
    if par.num_gpus is not None and par.num_gpus != total:
        raise ValueError(f"{o}: tensor_parallel_size {tp} x pipeline_parallel_size {pp} x "
                         f"data_parallel_size {dp} = {total} GPUs, but num_gpus is "
                         f"{par.num_gpus}")
    if pp > spec.num_layers:
        raise ValueError(f"{o}.pipeline_parallel_size ({pp}) exceeds {model}'s "
                         f"{spec.num_layers} layers")
    if tp > par.gpus_per_node:
        raise ValueError(f"{o}: tensor_parallel_size {tp} spans more than one node "
                         f"(gpus_per_node {par.gpus_per_node}); use pipeline parallelism "
                         f"across nodes")
    if not spec.num_experts and (dp > 1 or par.enable_expert_parallel):
        raise ValueError(f"{o}: data_parallel_size > 1 and enable_expert_parallel need a "
                         f"mixture-of-experts model; {model} is dense (use cluster replicas "
                         f"for data parallelism)")
    if par.enable_expert_parallel and spec.num_experts % (tp * dp):
        raise ValueError(f"{o}: enable_expert_parallel spreads {model}'s {spec.num_experts} "
                         f"experts over tensor_parallel_size {tp} x data_parallel_size {dp} = "
                         f"{tp * dp} ranks, which must divide them")
